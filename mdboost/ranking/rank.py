"""Score one drafter/target pair from cached rows, and the ranking rule over all pairs.

One row per (pair, divergence, budget) operating point, with the columns of ``ranking.csv``
(definitions: ``docs/ranking.md``). The **ranking rule**:

1. an operating point is *eligible* when its mentored NLL stays within ``nll_tolerance``
   nats per token of the target's NLL (``quality_ok``); budget 0 (plain SD) always is;
2. eligible points come first, ordered by predicted walltime speedup (descending);
3. ties (equal speedup to 1e-9) are broken by complementarity, the boosting advantage
   ``A = mu_target^2 + mu_drafter^2`` (descending), then by MD acceptance;
4. ineligible points follow in the same order. ``rank`` is 1-based, within each batch size
   (``batch_size`` column: the sequences per engine batch the speed columns are for).

Acceptance-side columns (``sd_*``, ``md_acceptance*``, ``acceptance_gain``, ``best_gamma``,
``predicted_speedup``, ``achieved_divergence``, ``k_*``, ``eps_pq_*``, ``rho_pq_*``,
``proposal_rate``, ``acceptance_positions``) can come from other rows than the quality and
boosting columns: ``score_pair(pair, ..., acceptance=PairRows(...))`` scores them on, e.g.,
continuations sampled from the target, the text MD decodes; the ``acceptance_source`` column
says which.

Predicted speedups and best draft lengths come from :mod:`mdboost.ranking.speed`, fed the
target's measured verification cost table and MD solve overhead
(``score_pair(..., speed_profile=...)``; budget-0 points get no MD overhead; ``docs/theory.md``,
"Speed model for ranking"). When the acceptance rows come with their
:class:`~mdboost.ranking.layout.SequenceLayout` (``PairRows.layout``, the target-sampled
cache), the draft-start process of :mod:`mdboost.ranking.process` replaces the i.i.d. block:
``best_gamma``, ``predicted_speedup`` (and ``sd_best_gamma``, ``sd_speedup``) come from it, with
``engine_acceptance`` (expected acceptance at draft position 0 where the engine drafts),
``engine_mean_accepted_length`` and friends; the i.i.d. values stay as ``*_iid`` columns.

Inputs and outputs are named types: a pair's rows are a :class:`~mdboost.ranking.pair.PairRows`
of two :class:`~mdboost.ranking.pair.PairSide` (one pool member as this pair sees it: cached
rows, boosting hypothesis and cost ratio relative to the pair's target); the settings a
:class:`ScoreSettings`; the result a
:class:`~mdboost.ranking.scores.PairScore` whose ``rows`` are the CSV rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from mdboost.engine.settings import DEFAULT_MD_SOLVE
from mdboost.md.divergences import GENERATORS
from mdboost.md.rules import Block, Mentored, Rule, Threshold
from mdboost.md.verify import SOLVE
from mdboost.ranking import quality
from mdboost.ranking.acceptance import drafter_shares, md_operating_points, sd_acceptance
from mdboost.ranking.boosting import boost_greedy, boost_target_first
from mdboost.ranking.diagnostics import boost_coefficient, pair_diagnostics
from mdboost.ranking.layout import SequenceLayout
from mdboost.ranking.mentored import mentored_outcomes, threshold_outcomes
from mdboost.ranking.options import BOOSTING_ORDERS, MD_MODES, TV_MENTORS  # torch-free (a config checks them first)
from mdboost.ranking.pair import PairRows, PairSide  # noqa: F401 -- PairSide: re-exported, the rows' public type
from mdboost.ranking.report import row_batch_size
from mdboost.ranking.chains import budget_tilt, tilt_delta
from mdboost.ranking.process import (AloneScore, PointInputs, ProcessOutcomes, ProcessScore, ProcessSettings,
                                     price_alone, price_process, process_outcomes)
from mdboost.ranking.rule_points import (PLAIN, RulePoint, block_chain, floor_drafts, greedy_tilt, point_law, rule_points,
                                         text_acceptance, threshold_tail_bounds, true_token_prob)
from mdboost.ranking.scores import PairScore, PairStats, PointScore, Quantiles, SpeedChoice
from mdboost.ranking.speed import SpeedProfile, alone_speedup, check_verify_costs, gamma_speedups
from mdboost.ranking.uncertainty import BootstrapSettings
from mdboost.ranking.support import Aligned, align


@dataclass(frozen=True)
class ScoreSettings:
    """Operating points, speed search and boosting of :func:`score_pair`.

    Parameters
    ----------
    divergences : names of :data:`mdboost.md.divergences.GENERATORS`
    budgets : budgets ``max_divergence >= 0``; each divergence is crossed with each budget.
    mode : {"exact", "bound"}
        :func:`~mdboost.ranking.acceptance.md_operating_points`'s solve.
    temperature : float, >= 0
        Sampling temperature the predictions are for. ``0`` is greedy decoding: the acceptance
        side is the argmax match (one-hot rows, :func:`mdboost.ranking.rows.member_rows`), MD
        equals SD there, so ``budgets`` must be ``(0,)``; the quality and boosting columns
        then use the distributions at temperature 1 (:attr:`quality_temperature`).
    gamma_min, gamma_max : the draft lengths searched for the best gamma.
    md_solve : one of :data:`mdboost.md.verify.SOLVE`, default: the engine's default
        Where the engine solves MD (the speed model's solved-position count):
        :data:`mdboost.engine.settings.DEFAULT_MD_SOLVE` unless the user runs the engine otherwise.
    n_estimators : int, >= 2
        Boosting rounds.
    orders : subset of ("target_first", "greedy")
        ``"greedy"`` adds the greedy boosting run's columns.
    thetas : margin thresholds in [-1, 1] of the reported margin bound and risk.
    bootstrap : BootstrapSettings
        The intervals of the predictions (a bootstrap over prompts; ``num_resamples=0``: none).
    tv_mentor : {"clamp", "boosted"}, default="clamp"
        The distribution emitted at TV points (both have the optimal acceptance): the clamp, or
        the boosted ensemble projected onto the TV optimal set (``docs/theory.md`` section 10);
        ``nll_mentored`` (hence ``quality_ok`` and ``beats_target``) follows it. Both NLLs are
        reported at every TV point either way.
    rules : tuple of mdboost.md.rules.Rule, default=(Mentored(),)
        The verification rules scored, each at its operating points
        (:func:`~mdboost.ranking.rule_points.rule_points`: `Mentored` and `Threshold` at every
        divergence and budget, `Rejection` and `Match` once); ``Mentored()`` (sampled drafts)
        gives the MD rows.
    batch_size : int, default=1
        Sequences the engine runs as one batch: the speed columns predict a batch's throughput
        over plain decoding's at the same batch size (:mod:`mdboost.ranking.batch`), with the
        costs measured at that batch size (the pair's sides and ``speed_profile``).
    """

    divergences: tuple[str, ...] = ("kl", "tv", "hellinger")
    budgets: tuple[float, ...] = (0.0, 0.05, 0.2, 1.0)
    mode: str = "exact"
    temperature: float = 1.0
    gamma_min: int = 1
    gamma_max: int = 8
    md_solve: str = DEFAULT_MD_SOLVE
    n_estimators: int = 2
    orders: tuple[str, ...] = BOOSTING_ORDERS
    thetas: tuple[float, ...] = (0.0, 0.1)
    bootstrap: BootstrapSettings = BootstrapSettings()
    tv_mentor: str = "clamp"
    rules: tuple[Rule, ...] = (Mentored(),)
    batch_size: int = 1

    def __post_init__(self):
        checks = [
            (bool(self.divergences) and all(d in GENERATORS for d in self.divergences), "divergences",
             f"names of {list(GENERATORS)}"),
            (bool(self.budgets) and all(b >= 0 for b in self.budgets), "budgets", ">= 0"),
            (self.mode in MD_MODES, "mode", f"one of {MD_MODES}"),
            (self.temperature >= 0, "temperature", ">= 0"),
            (self.temperature > 0 or set(self.budgets) == {0.0}, "budgets",
             "(0,) at temperature 0 (greedy decoding is deterministic: only lossless SD is ranked)"),
            (1 <= self.gamma_min <= self.gamma_max, "gamma_min/gamma_max", "1 <= gamma_min <= gamma_max"),
            (self.md_solve in SOLVE, "md_solve", f"one of {SOLVE}"),
            (self.n_estimators >= 2, "n_estimators", ">= 2"),
            (all(o in BOOSTING_ORDERS for o in self.orders), "orders", f"a subset of {BOOSTING_ORDERS}"),
            (all(-1 <= t <= 1 for t in self.thetas), "thetas", "in [-1, 1]"),
            (self.tv_mentor in TV_MENTORS, "tv_mentor", f"one of {TV_MENTORS}"),
            (not isinstance(self.batch_size, bool) and isinstance(self.batch_size, int) and self.batch_size >= 1,
             "batch_size", "a positive integer"),
        ]
        for ok, name, what in checks:
            if not ok:
                value = (self.gamma_min, self.gamma_max) if name == "gamma_min/gamma_max" else getattr(self, name)
                raise ValueError(f"{name} must be {what}, got {value!r}")
        for name in ("divergences", "orders", "rules"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.rules:
            raise ValueError(f"rules must hold at least one rule, got {self.rules!r}")
        rule_points(self.rules, self.divergences, self.budgets)  # a rule the ranking cannot score: ValueError
        for name in ("budgets", "thetas"):
            object.__setattr__(self, name, tuple(float(x) for x in getattr(self, name)))
        object.__setattr__(self, "temperature", float(self.temperature))

    @property
    def gammas(self) -> range:
        return range(self.gamma_min, self.gamma_max + 1)

    @property
    def points(self) -> tuple[RulePoint, ...]:
        """Every rule at its operating points (:func:`~mdboost.ranking.rule_points.rule_points`)."""
        return rule_points(self.rules, self.divergences, self.budgets)

    @property
    def process(self) -> ProcessSettings:
        """The draft-start process's settings (:func:`~mdboost.ranking.process.score_process`)."""
        return ProcessSettings(tuple(self.gammas), self.md_solve, self.bootstrap, self.batch_size)

    @property
    def quality_temperature(self) -> float:
        """The temperature of the quality and boosting side: ``temperature``, or 1 for greedy."""
        return self.temperature if self.temperature > 0 else 1.0


def _mean(x: torch.Tensor) -> float:
    return float(x.double().mean())


def _pair_stats(pair: PairRows, aligned: Aligned, acc: PairRows, acc_aligned: Aligned, sd: torch.Tensor,
                settings: ScoreSettings) -> PairStats:
    draft, target = pair.draft, pair.target
    acc_valid = acc.draft.rows.valid
    eps, rho = pair_diagnostics(acc_aligned.p, acc_aligned.q, mask=acc_aligned.kept)
    boost = boost_target_first(target.hypothesis, draft.hypothesis, pair.positions, pair.labels,
                               n_rounds=settings.n_estimators, thetas=settings.thetas)
    t = settings.quality_temperature
    nll_b = quality.nll_boosted(aligned, draft.rows, target.rows, boost.c_target, boost.c_drafter, t)
    scale, nll_scaled = quality.best_boosted_scale(aligned, draft.rows, target.rows, boost.c_target,
                                                   boost.c_drafter, t)
    greedy = None
    if "greedy" in settings.orders:
        greedy = boost_greedy(target.hypothesis, draft.hypothesis, pair.positions, pair.labels, settings.n_estimators)
    return PairStats(
        n_positions=int(draft.rows.valid.numel()), acceptance_positions=int(acc_valid.numel()),
        proposal_rate=_mean(acc_valid.double()), tail_mass=_mean(draft.rows.tail + target.rows.tail),
        sd_acceptance=_mean(sd), cost_ratio=float(draft.cost_ratio), boost=boost, greedy=greedy,
        eps_pq=Quantiles.of(eps[acc_valid].numpy()), rho_pq=Quantiles.of(rho[acc_valid].numpy()),
        nll_target=_mean(quality.nll(target.rows)), nll_drafter=_mean(quality.nll(draft.rows)),
        nll_boosted=_mean(nll_b), boosted_scale=scale, nll_boosted_rescaled=nll_scaled)


def _md_process(acc: PairRows, aligned: Aligned, ops, sd, settings: ScoreSettings, on_reference: bool,
                step_law: bool) -> ProcessOutcomes:
    """The MD points' process outcomes (:mod:`mdboost.ranking.process`): SD first, then one per
    operating point (``on_reference``: ``acc`` holds the reference text, see
    :func:`~mdboost.ranking.process.score_process`)."""
    zeros = torch.zeros_like(sd, dtype=torch.float64)
    p_mass, q_mass = aligned.p_mass, aligned.q_mass
    points = [PointInputs(zeros, zeros, sd.double(), 0.0)]
    points += [PointInputs(op.a, op.b, op.acceptance, 0.0, budget_tilt(p_mass, q_mass, op.a, op.b, op.acceptance))
               for op in ops]
    return process_outcomes(acc, points, settings.process, sd_acceptance=sd, on_reference=on_reference,
                            step_law=step_law)


@dataclass(frozen=True)
class PairCosts:
    """A pair's costs at one batch size: the target's :class:`~mdboost.ranking.speed.SpeedProfile`
    and the drafter's cost ratio, its repeat samples and its prefill cost per prompt token (as
    :class:`~mdboost.ranking.pair.PairSide` holds them; ``cost_ratio`` None: the sides' own)."""

    profile: SpeedProfile = SpeedProfile()
    cost_ratio: float | None = None
    cost_samples: tuple | None = None
    prefill_per_token: float = 0.0


def score_pair(pair: PairRows, vocab_size: int, *, settings: ScoreSettings | None = None,
               acceptance: PairRows | None = None, acceptance_source: str | None = None,
               speed_profile: SpeedProfile | None = None, mentored=None, on_reference: bool | None = None) -> PairScore:
    """All metrics of one ordered pair, one :class:`~mdboost.ranking.scores.PointScore` per
    (divergence, budget).

    Parameters
    ----------
    pair : PairRows
        Draft and target rows over the same ``N`` positions, with their true next tokens: the
        quality and boosting side (and the acceptance side unless ``acceptance`` is given).
    vocab_size : int
    settings : ScoreSettings, optional
        Operating points, gamma range, boosting rounds (default: ``ScoreSettings()``).
    acceptance : PairRows, optional
        Other rows (e.g. target-sampled continuations) to take the acceptance-side columns
        from; its draft's cost ratio is used for the speed model. With a ``layout``, the speed
        columns come from the draft-start process and the ``engine_*`` columns are added.
    acceptance_source : str, optional
        The ``acceptance_source`` column: default ``"reference"`` without ``acceptance``,
        ``"sampled"`` with it.
    speed_profile : SpeedProfile, optional
        The target's verification cost table and the MD overhead for this pair's drafts
        (:mod:`mdboost.ranking.speed`); default: ``v = 1``, ``s = 0`` (Leviathan et al.). The
        overhead applies to budgets > 0 only.
    mentored : mapping, optional
        ``(rule, divergence, max_divergence) -> PairRows`` on text sampled by a lossy rule itself
        at that point (``rule``: ``"mentored"`` for the MD points, ``"threshold"`` for SGLang's;
        :func:`~mdboost.ranking.mentored.mentored_pair_rows`, prompt-lookup drafters): that
        point's process columns come from there (:func:`~mdboost.ranking.mentored.mentored_outcomes`,
        :func:`~mdboost.ranking.mentored.threshold_outcomes`), its ``process_text`` column says
        ``"own"`` (else ``"target"``).
    on_reference : bool, optional
        Whether the acceptance rows' text is one this pair's target does not sample (a reference
        text, or continuations sampled from another target): the draft-start process then takes
        expected acceptances (:func:`~mdboost.ranking.chains.expected_chain`). Default: True
        without ``acceptance`` (the reference rows), False with it.
    """
    s = settings or ScoreSettings()
    costs = {s.batch_size: PairCosts(speed_profile or SpeedProfile())}
    return score_pair_batches(pair, vocab_size, costs, settings=s, acceptance=acceptance,
                              acceptance_source=acceptance_source, mentored=mentored,
                              on_reference=on_reference)[s.batch_size]


def score_pair_batches(pair: PairRows, vocab_size: int, costs: dict, *, settings: ScoreSettings | None = None,
                       acceptance: PairRows | None = None, acceptance_source: str | None = None, mentored=None,
                       on_reference: bool | None = None) -> dict:
    """:func:`score_pair` at several batch sizes: ``costs`` maps each batch size to its
    :class:`PairCosts`; returns ``{batch_size: PairScore}`` (``settings.batch_size`` is replaced
    by each). What does not depend on the costs or the batch size (the operating points, the
    rules' laws, quality, boosting, the draft-start processes) is computed once
    (:func:`pair_work`), then priced at each batch size (:func:`price_pair`)."""
    _check_costs(costs)
    acc = pair if acceptance is None else acceptance
    own = (float(acc.draft.cost_ratio), acc.draft.cost_samples, float(acc.draft.prefill_per_token))
    costs = {b: c if c.cost_ratio is not None else replace(c, cost_ratio=own[0], cost_samples=own[1],
                                                           prefill_per_token=own[2]) for b, c in costs.items()}
    work = pair_work(pair, vocab_size, settings=settings, acceptance=acceptance, acceptance_source=acceptance_source,
                     mentored=mentored, on_reference=on_reference, step_law=max(costs) > 1)
    return price_pair(work, costs)


def _check_costs(costs) -> None:
    if not isinstance(costs, dict) or not costs or not all(isinstance(c, PairCosts) for c in costs.values()):
        raise ValueError(f"costs must map batch sizes to PairCosts, got {costs!r}")
    for batch_size in costs:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"costs must be keyed by batch sizes (positive integers), got key {batch_size!r}")


@dataclass
class PairWork:
    """A pair's score before costs (:func:`pair_work`): what :func:`price_pair` prices at each
    batch size. It holds no rows, only per-position results (``[M]`` tensors), so it can be
    kept (:mod:`mdboost.cache.scores`)."""

    drafter: str
    target: str
    acceptance_source: str
    settings: ScoreSettings
    stats: PairStats
    sd: torch.Tensor  # [M]: SD's P_acc per acceptance row
    acc_valid: torch.Tensor  # bool [M]
    rule_pts: list  # RulePoint, in the rows' order
    acc_ops: list  # MD operating points (budget 0 once)
    md_static: list  # per MD point: (nll_clamp, tv columns, drafter share)
    others: list  # per other rule's point: (point, acceptance [M], divergence [M], nll, bounded: its tail ends follow in rule_process)
    md_process: ProcessOutcomes | None  # SD, then each MD point
    rule_process: ProcessOutcomes | None
    mentored: dict  # ("mentored", f, D) -> ProcessOutcomes on MD's own text; ("threshold", f, D) -> (outcomes, bounded)
    bootstrap: dict
    step_law: bool  # the outcomes can be priced above batch size 1
    alone_tv: tuple | None = None  # (mean, max) TV(p, q) over the acceptance rows; None: no drafter alone (prompt lookup)


def pair_work(pair: PairRows, vocab_size: int, *, settings: ScoreSettings | None = None,
              acceptance: PairRows | None = None, acceptance_source: str | None = None, mentored=None,
              on_reference: bool | None = None, step_law: bool = False) -> PairWork:
    """Everything of :func:`score_pair_batches` that does not depend on costs or batch size (same
    arguments; ``step_law``: keep the step-count laws that batch sizes above 1 need)."""
    s = settings or ScoreSettings()
    aligned = align(pair.draft.rows, pair.target.rows, vocab_size, torch.as_tensor(pair.labels))
    acc = pair if acceptance is None else acceptance
    acc_aligned = aligned if acceptance is None else align(acc.draft.rows, acc.target.rows, vocab_size,
                                                           torch.as_tensor(acc.labels))
    acc_valid = acc.draft.rows.valid
    sd = sd_acceptance(acc_aligned, acc_valid)
    stats = _pair_stats(pair, aligned, acc, acc_aligned, sd, s)
    # a draft floor tests the drafter's confidence: a one-hot drafter (prompt lookup) has none, so
    # its floored points would repeat the unfloored ones
    rule_pts = [pt for pt in s.points if not (pt.rule.draft_p_min and acc.draft.rows.confidence is None)]
    md_wanted = any(pt.is_md for pt in rule_pts)
    acc_ops = _one_plain_point(md_operating_points(acc_aligned, acc_valid, s.divergences, s.budgets, s.mode)) \
        if md_wanted else []
    ref_ops = acc_ops if acceptance is None or not md_wanted else _one_plain_point(
        md_operating_points(aligned, pair.draft.rows.valid, s.divergences, s.budgets, s.mode))
    # without target-sampled rows the process runs on the reference text (expected chains, no c at its tokens)
    on_reference = acceptance is None if on_reference is None else on_reference
    md_static = _md_static(pair, aligned, stats, acc_ops, ref_ops, s) if md_wanted else []
    md_static = [(*st, share) for st, share in zip(md_static, drafter_shares(acc_valid, acc_ops))]
    others_static = _rule_static([pt for pt in rule_pts if not pt.is_md], pair, aligned, acc, acc_aligned, stats, s)
    md_process = rule_process = None
    on_text = {}
    if acc.layout is not None:
        md_process = _md_process(acc, acc_aligned, acc_ops, sd, s, on_reference, step_law)
        if others_static:
            ends = [end for *_, two in others_static if two is not None for end in two]  # after the points
            rule_process = process_outcomes(acc, [inp for _, _, inp, _, _ in others_static] + ends, s.process,
                                            sd_acceptance=sd, on_reference=on_reference, step_law=step_law)
        for op in acc_ops:
            rows = (mentored or {}).get(("mentored", op.divergence, float(op.max_divergence))) \
                if op.max_divergence > 0 else None
            if rows is not None:
                on_text["mentored", op.divergence, float(op.max_divergence)] = mentored_outcomes(
                    rows, op.divergence, op.max_divergence, vocab_size, s, step_law)
        for pt, *_ in others_static:
            key = _own_text_key(pt)
            if key is not None and key in (mentored or {}):
                on_text[key] = threshold_outcomes(mentored[key], pt, vocab_size, s, step_law)
    return PairWork(pair.draft.name, pair.target.name,
                    acceptance_source or ("reference" if acceptance is None else "sampled"), s, stats, sd, acc_valid,
                    rule_pts, acc_ops, md_static,
                    [(pt, law.acceptance.clone(), law.divergence.clone(), nll, two is not None)
                     for pt, law, _, nll, two in others_static],
                    md_process, rule_process, on_text,
                    _bootstrap_info(s.bootstrap, acc.layout), step_law,
                    None if acc.draft.rows.one_hot else _alone_tv(acc_aligned, acc_valid))


def price_pair(work: PairWork, costs: dict) -> dict:
    """``{batch_size: PairScore}``: ``work`` priced with each batch size's :class:`PairCosts`
    (every one with its drafter costs: ``cost_ratio`` not None)."""
    _check_costs(costs)
    if any(c.cost_ratio is None for c in costs.values()):
        raise ValueError("price_pair needs each batch size's drafter costs (PairCosts.cost_ratio), got None")
    if max(costs) > 1 and not work.step_law:
        raise ValueError(f"this PairWork was made without step laws; it cannot be priced at batch sizes {sorted(costs)}")
    s, stats = work.settings, work.stats
    out = {}
    for batch_size, cost in costs.items():
        sb = replace(s, batch_size=batch_size)
        profile = cost.profile
        verify = _verify_table(profile, sb)
        sd_iid = _iid_choice(stats.sd_acceptance, cost.cost_ratio, sb, profile, 0.0, stats.sd_acceptance)
        process = None
        if work.md_process is not None:
            overheads = [0.0] + [profile.md_overhead if op.max_divergence > 0 else 0.0 for op in work.acc_ops]
            process = price_process(work.md_process, sb.process, profile, cost, overheads)
        alone = _alone(work, sb, profile, cost)
        md_points = iter(_md_points(work, process, sb, profile, verify, cost))
        others = iter(_rule_scores(work, sb, profile, verify, cost))
        points = [next(md_points) if pt.is_md else next(others) for pt in work.rule_pts]
        out[batch_size] = PairScore(
            work.drafter, work.target, work.acceptance_source, replace(stats, cost_ratio=float(cost.cost_ratio)),
            work.sd.numpy(), sd_iid, None if process is None else process[0], tuple(points), sb.temperature,
            tuple(sb.gammas), sb.md_solve, work.bootstrap, (profile.prefill_per_token, cost.prefill_per_token),
            batch_size, alone, work.alone_tv)
    return out


def _alone(work: PairWork, s: ScoreSettings, profile: SpeedProfile, cost: PairCosts) -> AloneScore | None:
    """The drafter decoding alone (a model drafter only), priced on the process's generations;
    without a process (no sequence layout), the steady state ``1 / c`` without an interval."""
    if work.alone_tv is None:
        return None
    outcomes = work.md_process or work.rule_process
    if outcomes is None:
        steady = float(alone_speedup(1.0, cost.cost_ratio))
        return AloneScore(steady, math.nan, math.nan, math.nan, math.nan)
    return price_alone(outcomes, s.process, profile, cost)


PLAIN_SD = PLAIN  # the divergence column of budget-0 points: plain SD, the same for every f


def _alone_tv(aligned: Aligned, valid: torch.Tensor) -> tuple[float, float]:
    """Mean and largest ``TV(p, q)`` over the valid rows: how far the drafter alone is from the target."""
    tv = (0.5 * (aligned.p_probs - aligned.q_probs).abs().sum(-1))[valid].clamp(0.0, 1.0)
    return (float(tv.mean()), float(tv.max())) if tv.numel() else (math.nan, math.nan)


def _md_static(pair, aligned, stats, acc_ops, ref_ops, s) -> list[tuple]:
    """Per MD operating point what does not depend on costs: the clamp's NLL and the TV columns."""
    out = []
    for op, ref_op in zip(acc_ops, ref_ops, strict=True):
        nll_clamp = _mean(quality.nll_mentored(pair.draft.rows, pair.target.rows, ref_op.a, ref_op.b))
        out.append((nll_clamp, _tv_boosted(pair, aligned, stats, ref_op, s, nll_clamp)))
    return out


def _md_points(work: PairWork, process, s: ScoreSettings, profile: SpeedProfile, verify, cost: PairCosts) -> list[PointScore]:
    """The MD points (`Mentored` on sampled drafts) from the clamp's operating points, priced."""
    acc_valid, stats = work.acc_valid, work.stats
    any_valid = bool(acc_valid.any())
    points = []
    for i, (op, (nll_clamp, tv, share)) in enumerate(zip(work.acc_ops, work.md_static, strict=True)):
        overhead = profile.md_overhead if op.max_divergence > 0 else 0.0
        on_text = work.mentored.get(("mentored", op.divergence, float(op.max_divergence))) \
            if op.max_divergence > 0 else None
        if on_text is not None:
            process[i + 1] = price_process(on_text, s.process, profile, cost, [overhead])[0]
        rule = Mentored(max_divergence=op.max_divergence, divergence=op.divergence)
        points.append(PointScore(
            divergence=op.divergence if op.max_divergence > 0 else PLAIN_SD, max_divergence=op.max_divergence,
            acceptance=op.acceptance.numpy(), k=boost_coefficient(op.a, op.b)[acc_valid].numpy(),
            achieved_divergence=_mean(op.achieved_divergence[acc_valid]) if any_valid else 0.0,
            nll_mentored=nll_clamp if tv is None or s.tv_mentor == "clamp" else tv["nll_tv_boosted"],
            iid=_iid_choice(_mean(op.acceptance), cost.cost_ratio, s, profile, overhead, stats.sd_acceptance),
            process=None if process is None else process[i + 1], verify_costs=tuple(verify.tolist()),
            md_overhead=float(overhead), tv=tv, text="target" if on_text is None else "own",
            rule=RulePoint(rule, op.divergence if op.max_divergence > 0 else PLAIN_SD, op.max_divergence),
            achieved_divergence_max=float(op.achieved_divergence[acc_valid].max()) if any_valid else 0.0,
            drafter_share=share))
    return points


def _rule_static(rule_pts: list[RulePoint], pair: PairRows, aligned: Aligned, acc: PairRows, acc_aligned: Aligned,
                 stats: PairStats, s: ScoreSettings) -> list[tuple]:
    """Per point of every other rule what does not depend on costs: the rule's law per position,
    its process inputs on the same text (greedy drafts: ``c = 1[x = g]``, tilted to ``P_acc``;
    their MD overhead set when priced) and the NLL of its emitted ``pi`` at the true tokens of the
    quality rows."""
    acc_valid, valid = acc.draft.rows.valid, pair.draft.rows.valid
    zeros = torch.zeros(acc_valid.numel(), dtype=torch.float64)
    out = []
    for pt in rule_pts:
        law = point_law(pt, acc_aligned, acc_valid, s.divergences[0])
        greedy = law.slots is not None
        block = isinstance(pt.rule, Block) and not greedy and acc.layout is not None and not acc.draft.rows.one_hot
        inputs = PointInputs(zeros, zeros, law.acceptance, 0.0,
                             greedy_tilt(law, acc_aligned) if greedy else None,
                             text_acceptance(law, acc_aligned, acc_valid, acc.labels) if greedy else None,
                             block_chain(acc_aligned, acc_valid, acc.layout.sequence, s.gamma_max,
                                         seed=s.bootstrap.seed) if block else None,
                             floor_drafts(acc.draft.rows, pt.rule.draft_p_min))
        if pt.rule.lossless:
            nll = stats.nll_target
        else:
            ref = law if acc is pair else point_law(pt, aligned, valid, s.divergences[0])
            nll = _mean(-true_token_prob(ref, aligned, valid, pair.labels, pair.target.rows.true_logp).log())
        bounds = threshold_tail_bounds(pt, law, acc_aligned, acc_valid, acc.target.rows)
        # the same process at each end of what the top-k cache leaves unknown (rule_points.threshold_tail_bounds)
        ends = None if bounds is None else tuple(replace(inputs, acceptance=p_acc, tilt=tilt_delta(p_acc, q_g))
                                                 for p_acc, q_g in bounds)
        out.append((pt, law, inputs, nll, ends))
    return out


def _rule_scores(work: PairWork, s: ScoreSettings, profile: SpeedProfile, verify: torch.Tensor,
                 cost: PairCosts) -> list[PointScore]:
    """The points of every other rule (:mod:`mdboost.ranking.rule_points`), priced: their process
    and i.i.d. speed with ``profile`` and the drafter costs ``cost``."""
    acc_valid, static = work.acc_valid, work.others
    overheads = [profile.md_overhead if isinstance(pt.rule, Mentored) and not pt.rule.lossless else 0.0
                 for pt, *_ in static]
    process = None
    if work.rule_process is not None:
        ends = [overhead for (*_, bounded), overhead in zip(static, overheads) if bounded for _ in range(2)]
        process = price_process(work.rule_process, s.process, profile, cost, overheads + ends)
        process = _widened(process, [bounded for *_, bounded in static])
    points = []
    for i, ((pt, acceptance, divergence, nll, _), overhead) in enumerate(zip(static, overheads)):
        own = work.mentored.get(_own_text_key(pt))
        if own is not None and process is not None:  # the process on the point's own text instead
            outcomes, bounded = own
            priced = price_process(outcomes, s.process, profile, cost, [overhead] * (3 if bounded else 1))
            process[i] = _widened(priced, [bounded])[0]
        achieved = divergence[acc_valid]
        points.append(PointScore(
            divergence=pt.divergence, max_divergence=pt.max_divergence, acceptance=acceptance.numpy(),
            k=torch.full((int(acc_valid.sum()),), float("nan"), dtype=torch.float64).numpy(),
            achieved_divergence=_mean(achieved) if achieved.numel() else 0.0, nll_mentored=nll,
            iid=_iid_choice(_mean(acceptance), cost.cost_ratio, s, profile, overhead, work.stats.sd_acceptance),
            process=None if process is None else process[i], verify_costs=tuple(verify.tolist()),
            md_overhead=float(overhead), rule=pt, text="target" if own is None else "own",
            achieved_divergence_max=float(achieved.max()) if achieved.numel() else 0.0))
    return points


def _own_text_key(pt: RulePoint) -> tuple | None:
    """The ``mentored`` key of a point whose process runs on its own text when that text was
    sampled (a lossy `Threshold`; the MD points have theirs in :func:`pair_work`), else None."""
    if type(pt.rule) is Threshold and not pt.rule.lossless:
        return "threshold", pt.divergence, float(pt.max_divergence)
    return None


def _widened(process: list[ProcessScore], bounded: list[bool]) -> list[ProcessScore]:
    """The points' scores (the first ``len(bounded)`` of ``process``), each bounded point's intervals
    widened to hold its two ends' (the scores after the points, two per bounded point, in order):
    the bootstrap's spread and what the cache leaves unknown together."""
    points, ends = process[:len(bounded)], iter(process[len(bounded):])
    out = []
    for score, has in zip(points, bounded):
        if has:
            low, high = next(ends), next(ends)
            score = replace(score, lo={f: torch.minimum(torch.minimum(score.lo[f], low.lo[f]), high.lo[f]) for f in score.lo},
                            hi={f: torch.maximum(torch.maximum(score.hi[f], low.hi[f]), high.hi[f]) for f in score.hi})
        out.append(score)
    return out


def _tv_boosted(pair: PairRows, aligned: Aligned, stats: PairStats, ref_op, s: ScoreSettings,
                nll_clamp: float) -> dict | None:
    """The TV point's quality columns (``docs/ranking.md``): the clamp and the boosted projection
    at the same (optimal) acceptance, and the boosted ensemble ``softmax(s* H_T)`` itself; None
    for other points."""
    if ref_op.divergence != "tv" or ref_op.max_divergence <= 0:
        return None
    boost = stats.boost
    nll = _mean(quality.nll_tv_boosted(aligned, pair.draft.rows, pair.target.rows, ref_op.max_divergence,
                                       boost.c_target, boost.c_drafter, s.quality_temperature, stats.boosted_scale))
    return {"mentor": s.tv_mentor, "nll_tv_clamp": nll_clamp, "nll_tv_boosted": nll,
            "nll_tv_boosted_reference": stats.nll_boosted_rescaled, "beats_target_boosted": nll < stats.nll_target}


def _one_plain_point(ops: list) -> list:
    """The operating points with budget 0 kept once (it is plain SD whatever the divergence)."""
    out, plain = [], False
    for op in ops:
        if op.max_divergence == 0:
            if plain:
                continue
            plain = True
        out.append(op)
    return out


def _verify_table(profile: SpeedProfile, s: ScoreSettings) -> torch.Tensor:  # [G]: v(gamma) per searched gamma
    if profile.verify_cost is None:
        return torch.ones(len(s.gammas), dtype=torch.float64)
    return check_verify_costs(profile.verify_cost, s.gamma_max)[s.gamma_min:s.gamma_max + 1]


def _iid_choice(alpha: float, cost: float, s: ScoreSettings, profile: SpeedProfile, overhead: float,
                sd_alpha: float) -> SpeedChoice:
    """The i.i.d. speed model at every searched gamma, and its best (the smallest on ties)."""
    speed = gamma_speedups(alpha, cost, s.gamma_min, s.gamma_max, verify_costs=profile.verify_cost,
                           md_overhead=overhead, md_solve=s.md_solve, sd_acceptance=sd_alpha)  # [G]
    best = int(speed.argmax())
    return SpeedChoice(s.gamma_min + best, float(speed[best]), tuple(speed.tolist()))


def _bootstrap_info(boot: BootstrapSettings, layout: SequenceLayout | None) -> dict:
    prompts = 0 if layout is None else int(torch.as_tensor(layout.sequence).unique().numel())
    resamples = boot.num_resamples if layout is not None else 0
    return {"prompts": prompts, "resamples": resamples, "level": boot.level, "seed": boot.seed}


def rank_rows(rows: list[dict], nll_tolerance: float = 0.05) -> list[dict]:
    """Apply the ranking rule of the module docstring within each batch size; returns new dicts
    sorted by batch size, then ``rank`` (1-based within the batch size)."""
    if nll_tolerance < 0:
        raise ValueError(f"nll_tolerance must be >= 0, got {nll_tolerance!r}")
    out = [dict(r, quality_ok=bool(r["nll_mentored"] <= r["nll_target"] + nll_tolerance)) for r in rows]
    out.sort(key=lambda r: (row_batch_size(r), not r["quality_ok"], -round(r["predicted_speedup"], 9),
                            -r["boosting_advantage"], -r["md_acceptance"]))
    first = 0
    for i, r in enumerate(out):
        if i and row_batch_size(r) != row_batch_size(out[i - 1]):
            first = i
        r["rank"] = i - first + 1
    return out
