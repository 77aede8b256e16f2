"""Where the speculative decoding loop drafts on a given text: the draft-start process.

The engine (:mod:`mdboost.engine.generate`) does not draft at every position: a step starts
right after the previous step's emitted tokens. From a start ``s`` with ``K`` drafts, ``n``
accepted drafts (``n < K``: the ``n + 1``-th is rejected and replaced; ``n = K``: the bonus
token follows) emit ``n + 1`` tokens and the next step starts at ``s + n + 1``. Acceptance is
autocorrelated along a text, so draft starts are not uniform over positions: they follow
rejections, i.e. hard regions, more often than the i.i.d. speed model (``docs/ranking.md``, "Speed model") assumes.

Given the text ``x`` (the token emitted at every position), the ``i``-th draft of a step started
at ``s`` is accepted with the conditional acceptance ``c_{s,i}`` of :mod:`mdboost.ranking.chains`
(``c_t = min(p(x_t), pi(x_t)) / pi(x_t)`` at the MD clamp of the position, ``docs/theory.md``
section 2). Given the text these events are independent across positions (each draft is a fresh
draw from ``p`` given the prefix), so the loop is a Markov chain over start positions and its
expectations are an exact dynamic program over one sequence of ``L`` positions (:func:`run_process`):

    ``P(start 0) = 1``,  ``P(start s + n + 1) += P(start s) O_s(n)``,
    ``O_s(n) = prod_{i<n} c_{s,i} (1 - c_{s,n})`` for ``n < K_s``, ``O_s(K_s) = prod_{i<K_s} c_{s,i}``,

with ``K_s = min(gamma, d_s, L - s - 1)`` (the engine's ``min(gamma, remaining - 1)``; ``d_s`` the
drafts the drafter offers at ``s``: ``gamma`` for a model, the prompt-lookup length for ``ngram``,
0 where it proposes nothing: that step emits one token undrafted). ``O(L gamma)`` per sequence,
batched over sequences (and over operating points and gammas stacked in the batch).
:func:`score_process` turns it into a pair's predictions with their bootstrap intervals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from mdboost.md.verify import SOLVE
from mdboost.ranking.batch import check_batch_size, batch_totals, expected_max_of
from mdboost.ranking.chains import chain_from_positions, text_chains
from mdboost.ranking.layout import gather_rows
from mdboost.ranking.speed import SpeedProfile, alone_speedup, process_speedup
from mdboost.ranking.uncertainty import (BootstrapSettings, percentile_interval, prompt_weights, resample_sums,
                                         resample_tables, resample_values)


@dataclass
class ProcessResult:
    """Expectations of the draft-start process, per batch row (see :func:`run_process`).

    Attributes
    ----------
    start_prob : [B, L]
        ``P(a step starts at s)`` (0 at and past the row's length).
    visit_prob : [B, L]
        Expected times position ``t`` is verified as a draft (``P(t is a reached draft position)``).
    draft_len : LongTensor [B, L]
        ``K_s``, drafts of a step started at ``s`` (0: undrafted step).
    accepted : [B]
        Expected accepted draft tokens.
    steps_by_draft_len : [B, G + 1]
        Expected steps with ``K`` drafts, ``K = 0..G``.
    lengths : LongTensor [B]
        Tokens emitted (the row's length).
    floor_stops : [B]
        Expected steps whose drafting a draft floor ended (``floor_len``): the drafter ran one
        forward more than it drafted, the one whose confidence was below the floor.
    steps_by_forwards : [B, G + 2]
        Expected steps whose drafter ran ``F = 0..G + 1`` forwards (``K``, plus one where a floor
        ended the drafting).
    """

    start_prob: torch.Tensor
    visit_prob: torch.Tensor
    draft_len: torch.Tensor
    accepted: torch.Tensor
    steps_by_draft_len: torch.Tensor
    lengths: torch.Tensor
    floor_stops: torch.Tensor
    steps_by_forwards: torch.Tensor

    @property
    def steps(self) -> torch.Tensor:  # [B]
        """Expected steps (= target calls)."""
        return self.start_prob.sum(-1)

    @property
    def drafted_steps(self) -> torch.Tensor:  # [B]
        """Expected steps with at least one draft (the engine's ``num_drafts``)."""
        return (self.start_prob * (self.draft_len > 0)).sum(-1)

    @property
    def draft_tokens(self) -> torch.Tensor:  # [B]
        """Expected drafted tokens (``num_draft_tokens``)."""
        return (self.start_prob * self.draft_len).sum(-1)

    @property
    def drafter_forwards(self) -> torch.Tensor:  # [B]
        """Expected drafter forwards: one per drafted token, one more per step a floor ended."""
        return self.draft_tokens + self.floor_stops

    def position0(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sum_s P(start s) values[s], sum_s P(start s))`` over drafted starts, each [B].

        Their ratio is the expected acceptance at draft position 0 (``values`` = the conditional
        acceptance ``c_s``, or the unconditional ``P_acc`` at ``s``: the same expectation, see
        ``docs/ranking.md``). Pool rows by summing numerators and denominators.
        """
        weight = self.start_prob * (self.draft_len > 0)
        return (weight * torch.as_tensor(values, dtype=weight.dtype)).sum(-1), weight.sum(-1)


def _draft_lengths(gamma, offered, lengths, n: int, length: int) -> torch.Tensor:  # [B, L]
    gamma = torch.as_tensor(gamma, dtype=torch.long)
    if (gamma < 0).any():
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    gamma = gamma.expand(n) if gamma.ndim == 0 else gamma
    if gamma.shape != (n,):
        raise ValueError(f"gamma must be an int or a LongTensor [{n}], got shape {tuple(gamma.shape)}")
    pos = torch.arange(length)
    remaining = (lengths[:, None] - pos[None, :] - 1).clamp_min(0)  # the engine's remaining - 1
    k = torch.minimum(gamma[:, None].expand(n, length), remaining)
    return k if offered is None else torch.minimum(k, torch.as_tensor(offered, dtype=torch.long).clamp_min(0))


class _Outcomes(NamedTuple):
    """Each start's step outcome, the shared first half of :func:`run_process` and :func:`step_count_law`."""

    k: torch.Tensor  # LongTensor [B, L]: drafts of a step started at s (the floor applied)
    stopped: torch.Tensor  # bool [B, L]: a draft floor ended that step's drafting
    surv: torch.Tensor  # [B, L, G + 1]: P(the first n drafts accepted)
    outcome: torch.Tensor  # [B, L, G + 1]: P(exactly n accepted), 0 outside the row
    inside: torch.Tensor  # bool [B, L]
    lengths: torch.Tensor  # LongTensor [B]


def _outcomes(chain, gamma, draft_len, lengths, floor_len) -> _Outcomes:
    chain = torch.as_tensor(chain, dtype=torch.float64)
    if chain.ndim != 3:
        raise ValueError(f"chain must be [B, L, W], got shape {tuple(chain.shape)}")
    if torch.isnan(chain).any() or (chain < 0).any() or (chain > 1).any():
        raise ValueError("chain must hold probabilities in [0, 1]")
    n, length, width = chain.shape
    lengths = torch.full((n,), length, dtype=torch.long) if lengths is None else torch.as_tensor(lengths, dtype=torch.long)
    if lengths.shape != (n,) or (lengths < 0).any() or (lengths > length).any():
        raise ValueError(f"lengths must be a LongTensor [{n}] in [0, {length}], got {lengths}")
    if int(torch.as_tensor(gamma).max()) > width:
        raise ValueError(f"chain width {width} is below the largest gamma {int(torch.as_tensor(gamma).max())}")
    k = _draft_lengths(gamma, draft_len, lengths, n, length)  # [B, L] without the floor
    stopped = torch.zeros_like(k, dtype=torch.bool)
    if floor_len is not None:
        floor_len = torch.as_tensor(floor_len, dtype=torch.long)
        stopped = floor_len < k  # the floor binds: drafting ends at a position it tested
        k = torch.minimum(k, floor_len)
    g = max(width, 1)
    idx = torch.arange(g + 1)
    padded = torch.cat([chain, chain.new_zeros(n, length, g + 1 - width)], dim=-1)  # [B, L, G + 1]
    live = torch.where(idx < k[..., None], padded, torch.zeros(()))  # acceptance of the draft, 0 at n = K
    surv = torch.cat([torch.ones_like(live[..., :1]), live.cumprod(-1)[..., :-1]], dim=-1)  # P(first n accepted)
    inside = torch.arange(length)[None, :] < lengths[:, None]  # [B, L]
    outcome = surv * (1 - live) * inside[..., None]  # [B, L, G + 1]: P(exactly n accepted)
    return _Outcomes(k, stopped, surv, outcome, inside, lengths)


def run_process(chain: torch.Tensor, gamma, *, draft_len=None, lengths=None, floor_len=None) -> ProcessResult:
    """Exact expectations of the engine's draft/verify loop on fixed texts (module docstring).

    Parameters
    ----------
    chain : tensor [B, L, W]
        ``chain[b, s, i]`` in [0, 1]: acceptance of the ``i``-th draft of a step started at ``s``
        (:func:`chain_from_positions`, :func:`chain_from_proposals`); ``W >= max(gamma)``.
    gamma : int or LongTensor [B]
        Draft length (per row: stack operating points and gammas in the batch).
    draft_len : LongTensor [B, L], optional
        Drafts the drafter offers at each start (default: unlimited, i.e. ``gamma``).
    floor_len : LongTensor [B, L], optional
        Drafts a draft floor lets a step started at ``s`` make (:func:`floor_runs`); where it is
        below the other limits the step drafts that many and its drafter runs one forward more
        (``ProcessResult.floor_stops``). Default: no floor.
    lengths : LongTensor [B], optional
        Positions per row (default ``L``); positions past it are padding.

    Returns
    -------
    ProcessResult
    """
    o = _outcomes(chain, gamma, draft_len, lengths, floor_len)
    n, length, g1 = o.outcome.shape
    g = g1 - 1
    idx = torch.arange(g + 1)
    start = torch.zeros(n, length + g + 2, dtype=torch.float64)
    start[:, 0] = (o.lengths > 0).double()
    for s in range(length):  # next start s + n + 1
        start[:, s + 1:s + g + 2] += start[:, s:s + 1] * o.outcome[:, s]
    start_prob = start[:, :length] * o.inside
    reach = o.surv[..., :g] * (idx[:g] < o.k[..., None])  # [B, L, G]: draft i of a step at s is verified
    visit = torch.zeros(n, length + g, dtype=torch.float64)
    for i in range(g):
        visit[:, i:i + length] += start_prob * reach[..., i]
    accepted = (start_prob * o.surv[..., 1:].mul(idx[1:] <= o.k[..., None]).sum(-1)).sum(-1)
    hist = torch.zeros(n, g + 1, dtype=torch.float64).scatter_add_(1, o.k, start_prob)
    forwards = torch.zeros(n, g + 2, dtype=torch.float64).scatter_add_(1, o.k + o.stopped.long(), start_prob)
    return ProcessResult(start_prob, visit[:, :length], o.k * o.inside, accepted, hist, o.lengths,
                         (start_prob * (o.stopped & o.inside)).sum(-1), forwards)


def step_count_law(chain: torch.Tensor, gamma, *, draft_len=None, lengths=None, floor_len=None) -> torch.Tensor:
    """The law of each row's number of steps (target calls): ``P(N = j)``, ``[B, L + 1]``.

    The same Markov chain over start positions as :func:`run_process` (same arguments), carried
    with the count of steps made: ``P(start s' after j + 1 steps) += P(start s after j steps)
    O_s(n)`` for ``s' = s + n + 1``; a row of length ``L_b`` ends at start ``L_b``. Its mean is
    ``ProcessResult.steps``. ``O(L^2 gamma)`` per row, keeping ``gamma + 2`` starts at a time.
    """
    o = _outcomes(chain, gamma, draft_len, lengths, floor_len)
    n, length, g1 = o.outcome.shape
    ring = g1 + 1  # starts s .. s + G + 1 are live while s is processed
    buf = torch.zeros(n, ring, length + 1, dtype=torch.float64)  # [B, ring, steps]
    buf[:, 0, 0] = 1.0
    law = torch.zeros(n, length + 1, dtype=torch.float64)
    targets = torch.arange(1, g1 + 1)
    for s in range(length + 1):
        cur = buf[:, s % ring].clone()  # [B, J]: P(start s after j steps)
        buf[:, s % ring] = 0.0
        ends = o.lengths == s
        law[ends] += cur[ends]
        if s == length:
            break
        spread = o.outcome[:, s, :, None] * cur[:, None, :-1]  # [B, G + 1, J - 1]: one more step, n accepted
        buf.index_add_(1, (s + targets) % ring, torch.nn.functional.pad(spread, (1, 0)))
    return law


# ---- one pair: every operating point and gamma in one batch ----------------------------------------
FIGURES = ("speedup", "speedup_prompts", "acceptance", "acceptance_conditional", "mean_accepted_length", "tokens_per_call")


@dataclass
class ProcessScore:
    """The process's predictions for one operating point at every candidate gamma.

    Figures (each a float64 tensor ``[G]`` over ``gammas``, in ``values``; their bootstrap
    interval over prompts in ``lo`` / ``hi``, :mod:`mdboost.ranking.uncertainty`):
    ``speedup``; ``acceptance``: expected position-0 acceptance with ``P_acc`` as the value at
    each start (what the engine's ``expected_acceptance`` averages); ``acceptance_conditional``:
    the same with ``c_s``; ``mean_accepted_length``: ``1 + accepted / drafted steps``;
    ``tokens_per_call``: tokens / steps (undrafted steps included); ``speedup_prompts``: the
    speedup again, its interval over the prompts alone with the costs at their medians (the
    ``speedup`` interval also draws one measured cost repeat per resample). ``best``: index of the gamma
    with the largest predicted speedup (the smallest such gamma on ties). ``free_speedup`` [G]:
    the speedup with the drafter's costs (``c`` and its prefill) set to 0, the rest as priced
    (point estimate): the inverse speedup is linear in a factor on the drafter's costs, so the
    two speedups give the speedup at any drafter cost (:func:`mdboost.ranking.recommend.break_even_cost`).
    """

    gammas: list
    values: dict
    lo: dict
    hi: dict
    best: int
    free_speedup: torch.Tensor | None = None

    @property
    def gamma(self) -> int:
        return self.gammas[self.best]

    def at_best(self, figure: str) -> float:
        """One of :data:`FIGURES` at the best gamma."""
        return float(self.values[figure][self.best])



@dataclass
class PointInputs:
    """Per-row inputs of one operating point: clamp ``(a, b)`` [M], ``P_acc`` [M], overhead ``s``;
    ``conditional`` [M]: the conditional acceptance at the text's token when the rule is not the
    clamp (greedy drafts, :mod:`mdboost.ranking.rule_points`), instead of the clamp's at ``(a, b)``;
    ``chain`` [M, W]: every start's chain itself (block verification,
    :func:`~mdboost.ranking.rule_points.block_chain`), used as given; ``drafts`` [M] bool: where
    the drafter drafts under a draft probability floor
    (:func:`~mdboost.ranking.rule_points.floor_drafts`): a step started at ``s`` offers the run
    of such positions from ``s`` on (:func:`floor_runs`)."""

    a: torch.Tensor
    b: torch.Tensor
    acceptance: torch.Tensor
    md_overhead: float = 0.0
    tilt: torch.Tensor | None = None  # [M] budget_tilt; None: 0
    conditional: torch.Tensor | None = None  # [M] c at the text's token; None: the clamp's at (a, b)
    chain: torch.Tensor | None = None  # [M, W] each start's whole chain (block verification); None: from c
    drafts: torch.Tensor | None = None  # [M] bool: positions drafted under a draft floor; None: every valid one


@dataclass(frozen=True)
class ProcessSettings:
    """What a pair's process is scored over (:func:`score_process`).

    Attributes
    ----------
    gammas : tuple of int, each >= 1
        Candidate draft lengths.
    md_solve : {"reached", "needed", "all"}, default="reached"
        Which draft positions pay the MD overhead (the engine's argument of the same name).
    bootstrap : BootstrapSettings or None
        Intervals over prompts (:mod:`mdboost.ranking.uncertainty`); None: none (NaN bounds).
    batch_size : int, default=1
        Sequences the engine runs as one batch: the speedup is a batch's throughput over plain
        decoding's at the same batch size (:mod:`mdboost.ranking.batch`), its costs the
        profile's and the drafter's at that batch size.
    """

    gammas: tuple
    md_solve: str = "reached"
    bootstrap: BootstrapSettings | None = None
    batch_size: int = 1

    def __post_init__(self):
        object.__setattr__(self, "batch_size", check_batch_size(self.batch_size))
        if self.md_solve not in SOLVE:
            raise ValueError(f"md_solve must be one of {SOLVE}, got {self.md_solve!r}")
        gammas = [int(g) for g in self.gammas]
        if not gammas or min(gammas) < 1:
            raise ValueError(f"gammas must be a non-empty list of ints >= 1, got {self.gammas!r}")
        object.__setattr__(self, "gammas", tuple(gammas))


class _Batch(NamedTuple):
    """The draft-start process of every point and gamma of a pair, stacked as ``[P * G * B]`` rows,
    with its inputs (for :func:`step_count_law`)."""

    res: ProcessResult
    chain: torch.Tensor  # [P * G * B, L, W]
    gamma: torch.Tensor  # LongTensor [P * G * B]
    offered: torch.Tensor | None  # [P * G * B, L]
    floor_len: torch.Tensor | None  # [P * G * B, L]
    row_lengths: torch.Tensor  # LongTensor [P * G * B]
    raw: torch.Tensor  # [B, L, W]: conditional acceptance of each draft (position-0 figures)
    index: torch.Tensor  # [B, L]: each position's cache row
    lengths: torch.Tensor  # LongTensor [B]
    shape: tuple  # (P, G, B, L)


def _run_points(rows, points: list[PointInputs], gammas: tuple, on_reference: bool) -> _Batch:
    """:func:`run_process` on the chains of every point, once per gamma (one batch)."""
    chains, raw, offered, index, lengths = text_chains(rows.layout, rows.draft.rows, rows.target.rows,
                                                       torch.as_tensor(rows.labels), points, max(gammas), on_reference)
    n_p, n_g = len(points), len(gammas)
    n_b, length, width = chains.shape[1:]
    batch = chains[:, None].expand(n_p, n_g, n_b, length, width).reshape(-1, length, width)
    gamma = torch.tensor(gammas)[None, :, None].expand(n_p, n_g, n_b).reshape(-1)
    floors = floor_runs(points, index, width)  # [P, B, L] or None
    floor_len = None if floors is None else floors[:, None].expand(n_p, n_g, n_b, length).reshape(-1, length)
    offered = None if offered is None else offered.repeat(n_p * n_g, 1)
    row_lengths = lengths.repeat(n_p * n_g)
    res = run_process(batch, gamma, draft_len=offered, lengths=row_lengths, floor_len=floor_len)
    return _Batch(res, batch, gamma, offered, floor_len, row_lengths, raw, index, lengths, (n_p, n_g, n_b, length))


def floor_runs(points: list[PointInputs], index: torch.Tensor, width: int) -> torch.Tensor | None:
    """Drafts each point's draft floor lets a step started at each start make, ``[P, B, L]``
    (``width`` for a point without a floor; None when no point has one).

    A point with ``drafts`` (a draft floor) drafts from the start up to, not including, the first
    position where the drafter does not draft. Along the text this is exact for every draft that
    can be accepted (accepted drafts are the text, so the drafter's context is the text's prefix,
    ``mdboost.ranking.chains``); drafts after a rejection are priced at the text's confidences too.
    """
    if all(pt.drafts is None for pt in points):
        return None
    runs = []
    for pt in points:
        if pt.drafts is None:
            runs.append(torch.full(index.shape, width, dtype=torch.long))
            continue
        here = gather_rows(pt.drafts.double(), index)  # [B, L]: 1 where the drafter drafts
        runs.append(chain_from_positions(here, width).cumprod(-1).sum(-1).long())  # [B, L]: drafts from each start on
    return torch.stack(runs)


def _resample_weights(num_prompts: int, boot: BootstrapSettings) -> torch.Tensor:  # -> [R, B]
    """Resample 0 is the full sample (every prompt once), then the bootstrap resamples of the prompts."""
    weights = torch.ones(1, num_prompts, dtype=torch.float64)
    return torch.cat([weights, prompt_weights(num_prompts, boot)]) if boot.num_resamples else weights


def _cost_draws(drafter, profile: SpeedProfile, width: int, boot: BootstrapSettings):
    """The drafter's cost ratio [R, 1, 1] and the verification table (None, the ``v`` table, or
    [R, 1, 1, width] with one measured repeat per resample; resample 0 the medians)."""
    cost = torch.full((1 + boot.num_resamples, 1, 1), float(drafter.cost_ratio), dtype=torch.float64)
    if drafter.cost_samples is not None and boot.num_resamples:
        cost[1:, 0, 0] = resample_values(drafter.cost_samples, boot.num_resamples, boot.seed)
    verify = profile.verify_cost
    if verify is not None and profile.verify_samples is not None and boot.num_resamples:
        medians = torch.as_tensor(verify, dtype=torch.float64)[:width]
        tables = resample_tables(list(profile.verify_samples)[:width], boot.num_resamples, boot.seed)  # [R-1, K+1]
        verify = torch.cat([medians[None], tables])[:, None, None, :]  # [R, 1, 1, K+1]
    return cost, verify


@dataclass
class ProcessOutcomes:
    """What :func:`score_process` computes before any cost: every point's and gamma's expected
    totals per sequence, and the figures that do not depend on costs (:func:`process_outcomes`).

    Each per-sequence tensor is stacked ``[P * G * n]`` (points, gammas, sequences: the batch
    order of :func:`run_process`). :func:`price_process` turns it into :class:`ProcessScore` objects with
    a profile's costs at any batch size (``step_law`` is needed for ``batch_size > 1``).
    """

    gammas: tuple
    shape: tuple  # (P, G, n, L)
    steps: torch.Tensor  # [P * G * n]: expected steps per sequence
    steps_by_draft_len: torch.Tensor  # [P * G * n, G + 1]
    steps_by_forwards: torch.Tensor  # [P * G * n, G + 2]
    solved: torch.Tensor  # [P * G * n]: positions that pay the MD overhead
    step_law: torch.Tensor | None  # [P * G * n, L + 1]: P(N = j); None: priced at batch size 1 only
    lengths: torch.Tensor  # LongTensor [n]: new tokens per sequence
    fed: torch.Tensor  # [n]: prompt tokens beyond one per sequence
    figures: dict  # name -> (values [P, G], lo [P, G], hi [P, G]): every figure but the speedup


def process_outcomes(rows, points: list[PointInputs], settings: ProcessSettings, *, sd_acceptance=None,
                     on_reference: bool = False, step_law: bool | None = None) -> ProcessOutcomes:
    """The cost-free half of :func:`score_process` (same arguments; ``step_law``: whether to keep
    each sequence's step-count law for batch sizes above 1, default: ``settings.batch_size > 1``).
    The points' ``md_overhead`` is not used here: :func:`price_process` takes the overheads."""
    gammas, md_solve = settings.gammas, settings.md_solve
    boot = settings.bootstrap or BootstrapSettings(num_resamples=0)
    batch = _run_points(rows, points, gammas, on_reference)
    res, index, lengths = batch.res, batch.index, batch.lengths
    n_p, n_g, n_b, length = batch.shape
    weights = _resample_weights(n_b, boot)  # [R, n]

    def pooled(x):  # [P * G * n, ...] -> [R, P, G, ...]: weighted sums over the sequences
        return resample_sums(x.reshape(n_p, n_g, n_b, *x.shape[1:]).movedim(2, -1), weights)

    if md_solve == "all":
        solved = res.draft_tokens
    else:
        weight = torch.ones(()) if md_solve == "reached" else 1 - gather_rows(torch.as_tensor(sd_acceptance).double(), index)
        solved = (res.visit_prob.reshape(n_p * n_g, n_b, length) * weight).sum(-1).reshape(-1)
    law = None
    if settings.batch_size > 1 if step_law is None else step_law:
        law = step_count_law(batch.chain, batch.gamma, draft_len=batch.offered, lengths=batch.row_lengths,
                             floor_len=batch.floor_len)
    prompt = rows.layout.prompt_lengths
    fed = (torch.zeros_like(lengths, dtype=torch.float64) if prompt is None
           else (torch.as_tensor(prompt, dtype=torch.float64) - 1).clamp_min(0))  # [n]: prompt tokens beyond one
    tokens = resample_sums(lengths, weights)[:, None, None]  # [R, 1, 1]

    def per_row(x):  # [P, n, L] -> [P * G * n, L], the batch order of run_process
        return x[:, None].expand(n_p, n_g, n_b, length).reshape(-1, length)

    values = torch.stack([gather_rows(pt.acceptance.double(), index) for pt in points])  # [P, n, L]
    num_v, den = (pooled(x) for x in res.position0(per_row(values)))
    num_c = pooled(res.position0(per_row(batch.raw[..., 0]))[0])
    drafted = torch.where(den > 0, den, torch.full_like(den, float("nan")))
    figures = {"acceptance": num_v / drafted, "acceptance_conditional": num_c / drafted,
               "mean_accepted_length": 1 + pooled(res.accepted) / drafted,
               "tokens_per_call": tokens / pooled(res.steps)}  # each [R, P, G]
    return ProcessOutcomes(tuple(gammas), batch.shape, res.steps, res.steps_by_draft_len, res.steps_by_forwards,
                           solved, law, lengths, fed,
                           {name: (x[0].clone(), *_bounds(x, boot, n_b)) for name, x in figures.items()})


def _bounds(x: torch.Tensor, boot: BootstrapSettings, num_prompts: int) -> tuple:  # [R, P, G] -> ([P, G], [P, G])
    return percentile_interval(x[1:], boot.level, num_prompts=num_prompts)


def price_process(outcomes: ProcessOutcomes, settings: ProcessSettings, profile: SpeedProfile | None, drafter,
                  md_overheads) -> list[ProcessScore]:
    """:class:`ProcessScore` objects of :func:`process_outcomes` with costs, at ``settings.batch_size``.

    Parameters
    ----------
    outcomes : ProcessOutcomes
    settings : ProcessSettings
        The settings ``outcomes`` were computed with, at the batch size to price (:mod:`mdboost.ranking.batch`).
    profile : SpeedProfile or None
        The target's ``v`` table and prefill cost (:func:`score_process`).
    drafter : object
        The drafter's ``cost_ratio``, ``cost_samples`` and ``prefill_per_token`` (a
        :class:`~mdboost.ranking.pair.PairSide`, or the ranking's ``PairCosts``).
    md_overheads : sequence of float
        Each point's MD overhead ``s``.
    """
    profile = SpeedProfile() if profile is None else profile
    gammas = outcomes.gammas
    if tuple(settings.gammas) != gammas:
        raise ValueError(f"settings.gammas {settings.gammas!r} differ from the outcomes' {gammas!r}")
    boot = settings.bootstrap or BootstrapSettings(num_resamples=0)
    n_p, n_g, n_b, _ = outcomes.shape
    if len(md_overheads) != n_p:
        raise ValueError(f"md_overheads must hold one overhead per point ({n_p}), got {len(md_overheads)}")
    if settings.batch_size > 1 and outcomes.step_law is None:
        raise ValueError(f"outcomes without a step law cannot be priced at batch_size={settings.batch_size}")
    weights = _resample_weights(n_b, boot)  # [R, n]
    total = weights.sum(-1)  # [R]

    def mixed(x):  # [P * G * n, ...] -> [R, P, G, ...]: weighted means over the sequences
        out = resample_sums(x.reshape(n_p, n_g, n_b, *x.shape[1:]).movedim(2, -1), weights)
        return out / total.reshape(-1, *[1] * (out.ndim - 1))

    per_batch = batch_totals(mixed, outcomes.steps, outcomes.steps_by_draft_len, outcomes.steps_by_forwards,
                             outcomes.solved, settings.batch_size, outcomes.step_law)
    overhead = torch.tensor([float(x) for x in md_overheads], dtype=torch.float64)[:, None]
    cost, verify = _cost_draws(drafter, profile, max(gammas) + 1, boot)
    beta_t, beta_d = float(profile.prefill_per_token), float(drafter.prefill_per_token)
    fed = expected_max_of(outcomes.fed, weights, settings.batch_size)[:, None, None]  # [R, 1, 1]: the longest prompt
    tokens_max = expected_max_of(outcomes.lengths.double(), weights, settings.batch_size)[:, None, None]  # [R, 1, 1]
    speed = process_speedup(tokens_max, per_batch.drafter_forwards, per_batch.steps_by_draft_len, cost,
                            verify_costs=verify, md_overhead=overhead, solved=per_batch.solved,
                            prefill=beta_t * fed, drafter_prefill=beta_d * fed)  # [R, P, G]
    # [P, G]: the drafter's costs at 0, on resample 0 only (the point estimate)
    free = process_speedup(tokens_max[:1], per_batch.drafter_forwards[:1], per_batch.steps_by_draft_len[:1], 0.0,
                           verify_costs=verify[:1] if torch.is_tensor(verify) else verify, md_overhead=overhead,
                           solved=per_batch.solved[:1], prefill=beta_t * fed[:1])[0]
    # [R, P, G]: the same resamples of the prompts, every one at the median costs: the interval's
    # prompt part alone (the part that grows on new prompts, mdboost.validation.report)
    fixed_verify = verify[:1].expand_as(verify) if torch.is_tensor(verify) else verify
    over_prompts = process_speedup(tokens_max, per_batch.drafter_forwards, per_batch.steps_by_draft_len,
                                   cost[:1].expand_as(cost), verify_costs=fixed_verify, md_overhead=overhead,
                                   solved=per_batch.solved, prefill=beta_t * fed, drafter_prefill=beta_d * fed)
    figures = {"speedup": (speed[0], *_bounds(speed, boot, n_b)),
               "speedup_prompts": (over_prompts[0], *_bounds(over_prompts, boot, n_b)), **outcomes.figures}
    best = speed[0].argmax(-1)  # first maximum: the smallest gamma on ties
    return [ProcessScore(list(gammas), {f: v[i] for f, (v, _, _) in figures.items()},
                         {f: lo[i] for f, (_, lo, _) in figures.items()},
                         {f: hi[i] for f, (_, _, hi) in figures.items()}, int(best[i]), free[i]) for i in range(n_p)]


class AloneScore(NamedTuple):
    """The drafter decoding alone: its speedup over plain decoding with the target, and the interval."""

    speedup: float
    lo: float
    hi: float
    prompts_lo: float  # the interval over the prompts alone, at the median cost (ProcessScore's "speedup_prompts")
    prompts_hi: float


def price_alone(outcomes: ProcessOutcomes, settings: ProcessSettings, profile: SpeedProfile | None,
                drafter) -> AloneScore:
    """Plain decoding with the drafter alone, priced on the generations of ``outcomes`` as
    :func:`price_process` prices the speculative points (same arguments): the batch's longest
    generation and prompt (:func:`~mdboost.ranking.batch.expected_max_of`), one drafter step of
    cost ``c`` per token (:func:`~mdboost.ranking.speed.alone_speedup`), each bootstrap resample
    with its prompts and one measured cost repeat."""
    profile = SpeedProfile() if profile is None else profile
    boot = settings.bootstrap or BootstrapSettings(num_resamples=0)
    weights = _resample_weights(outcomes.shape[2], boot)  # [R, n]
    cost, _ = _cost_draws(drafter, profile, max(outcomes.gammas) + 1, boot)  # [R, 1, 1]
    fed = expected_max_of(outcomes.fed, weights, settings.batch_size)  # [R]
    tokens = expected_max_of(outcomes.lengths.double(), weights, settings.batch_size)  # [R]
    speed = alone_speedup(tokens, cost[:, 0, 0], prefill=float(profile.prefill_per_token) * fed,
                          drafter_prefill=float(drafter.prefill_per_token) * fed)  # [R]
    over_prompts = alone_speedup(tokens, cost[:1, 0, 0].expand(len(tokens)), prefill=float(profile.prefill_per_token) * fed,
                                 drafter_prefill=float(drafter.prefill_per_token) * fed)  # [R]: at the median cost
    (lo, hi), (prompts_lo, prompts_hi) = (percentile_interval(x[1:, None], boot.level, num_prompts=outcomes.shape[2])
                                          for x in (speed, over_prompts))
    return AloneScore(float(speed[0]), float(lo[0]), float(hi[0]), float(prompts_lo[0]), float(prompts_hi[0]))


def score_process(rows, points: list[PointInputs], settings: ProcessSettings, profile: SpeedProfile | None = None, *,
                  sd_acceptance=None, on_reference: bool = False) -> list[ProcessScore]:
    """Best gamma, speedup and engine-side acceptance of every operating point of a pair.

    It composes the draft-start process of every point and gamma, the bootstrap over prompts and
    the cost draws into :func:`~mdboost.ranking.speed.process_speedup`: :func:`process_outcomes`
    (what does not depend on costs), then :func:`price_process`.

    Parameters
    ----------
    rows : PairRows
        The pair's acceptance rows (:class:`mdboost.ranking.rank.PairRows`) with their ``layout``
        (sequence of each of the ``M`` rows); ``rows.labels`` [M] is the text (for prompt-lookup
        chains); the draft side's ``cost_ratio``, ``cost_samples`` (each resample also draws one of
        them) and ``prefill_per_token`` are the drafter's costs.
    points : list of PointInputs
    settings : ProcessSettings
        Candidate gammas, ``md_solve`` and the bootstrap.
    profile : SpeedProfile, optional
        The target's ``v`` table (covering ``max(gammas)``; its ``verify_samples``: each resample
        also draws one repeat's table, :func:`~mdboost.ranking.uncertainty.resample_tables`) and
        prefill cost, applied to ``layout.prompt_lengths`` (ignored where the layout has none);
        default: none measured (``v = 1``, no prefill). Each point carries its own MD overhead.
    sd_acceptance : tensor [M], optional
        SD's ``P_acc`` per row (``needed``: a reached position is solved when SD would reject).
    on_reference : bool, default=False
        The rows' text is a reference (teacher-forced), not text sampled from the target: the
        chains are the expected acceptances (:func:`~mdboost.ranking.chains.expected_chain`) instead of the conditional
        acceptance at the text's token, and ``acceptance_conditional`` equals ``acceptance``.

    Returns
    -------
    list of ProcessScore
        One per point, every figure at every gamma with its interval.
    """
    outcomes = process_outcomes(rows, points, settings, sd_acceptance=sd_acceptance, on_reference=on_reference)
    return price_process(outcomes, settings, profile, rows.draft, [pt.md_overhead for pt in points])
