"""The verification rules a ranking scores, on the aligned support of a cached pair.

A ranking row is a pair, a temperature, a gamma and a **rule point**: one
:class:`mdboost.md.rules.Rule` with its operating point (``docs/ranking.md``, "Rules and
engines"). :func:`rule_points` crosses the configured rules with the divergences and budgets:

- `Mentored` stands for the MD clamp at every ``(f, D)`` (``Mentored(max_divergence=D, divergence=f)``);
- `Threshold` for SGLang's rule at the threshold each ``(f, D)`` maps to
  (``Threshold.for_budget(D, f)``: ``D_f(pi || q) <= D`` at every position, ``docs/theory.md``
  section 11);
- `Rejection`, `Block` (vLLM's block verification) and `Match` are lossless: one point each.

Budget 0 is one lossless point per rule, its divergence ``"none"``, as for plain SD.

The law of a point is read on the aligned support of :mod:`mdboost.ranking.support` (masses
``p * count``, ``q * count``) from the rule's closed form (:meth:`Rule.law`). A **greedy** draft
is the slot with the largest per-token drafter value among the slots holding one token
(:func:`greedy_slots`: the tail bucket merges many tokens, each far below its mass, so it is
never the argmax token; ties go to the smallest token id, as ``argmax`` over the vocabulary).
On the merged support every rule's law is exact for the approximated distributions: a greedy
proposal puts nothing on the bucket, and the clamp and ``1 - TV`` merge equal ratios exactly;
`Threshold`'s per-token test ``q_x >= single`` is not defined on a merged slot, so a sampled
`Threshold` (mdboost's engine only) is not ranked.

Along a text (the draft-start process, :mod:`mdboost.ranking.chains`) a greedy draft ``g`` is
accepted exactly when the emitted token is ``g``: every rule emits ``g`` only by accepting it
(its residual holds nothing at ``g``), so the conditional acceptance is ``c = 1[x = g]``
(:func:`text_acceptance`), and on text sampled from ``q`` the chain is tilted to the rule's mean
acceptance by ``delta = (P_acc - q_g) / (1 - q_g)`` (:func:`greedy_tilt`, the budget tilt of
:func:`~mdboost.ranking.chains.budget_tilt` with ``E_q[c] = q_g``).

`Block` on sampled drafts judges a step's drafts together: its accepted length is not a product
of per-draft acceptances, but ``P(accepted >= i + 1) = E[r_i]`` for the joint ratio ``r_i`` of the
drafts from the start on, whatever the number of drafts (``docs/theory.md`` section 5b). So a step
started at ``s`` has the expected chain ``c_{s,i} = E[r_{s,i}] / E[r_{s,i-1}]`` (:func:`block_chain`;
``c_{s,0} = 1 - TV``, token-wise rejection's), for which the draft-start process gives the block's
accepted lengths exactly. Along a text, the process keeps token-wise rejection's chain at the
text's tokens and tilts it to those values (:func:`~mdboost.ranking.chains.chain_tilt`), so a
block's first draft is SD's exactly and its gain is all in the later drafts. With greedy drafts
`Block`'s law is token-wise rejection's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from mdboost.md.block import block_acceptance_estimate
from mdboost.md.divergences import f_divergence, resolve
from mdboost.md.drafting import FLOOR_TOP_K
from mdboost.md.rules import Mentored, Rule, Threshold
from mdboost.ranking.chains import tilt_delta
from mdboost.ranking.layout import gather_rows, padded_index
from mdboost.ranking.options import RULE_NAMES
from mdboost.ranking.report import row_draft_p_min
from mdboost.ranking.support import Aligned

__all__ = ["PLAIN", "RULES", "PointLaw", "RulePoint", "block_chain", "floor_drafts", "greedy_slots", "greedy_tilt", "point_law", "row_rule",
           "rule_points", "text_acceptance", "threshold_tail_bounds", "true_token_prob"]


def _subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


# the rules scored, by name: the names are mdboost.ranking.options.RULE_NAMES (torch-free: a config checks
# them before torch loads), each the class of mdboost.md.rules bearing it
RULES = {name: next(c for c in _subclasses(Rule) if c.__module__ == Rule.__module__ and c.name == name)
         for name in RULE_NAMES}
PLAIN = "none"  # the divergence of a lossless budget-0 point (the same for every f)


@dataclass(frozen=True)
class RulePoint:
    """One rule at one operating point: the rule, and the ``(divergence, max_divergence)`` it was
    set for (``"none"``, 0 for a lossless point)."""

    rule: Rule
    divergence: str
    max_divergence: float

    @property
    def is_md(self) -> bool:
        """MD on sampled drafts: the points the ranking has always scored (its own path)."""
        return type(self.rule) is Mentored and self.rule.drafting == "sampled"

    @property
    def threshold(self) -> tuple[float, float]:
        """SGLang's ``(threshold_acc, threshold_single)`` (NaN for other rules, `Match` included)."""
        if type(self.rule) is Threshold:
            return float(self.rule.accept), float(self.rule.single)
        return math.nan, math.nan


def _family(rule: Rule) -> bool:
    if not isinstance(rule, Rule):
        raise TypeError(f"rules must hold mdboost.md.rules.Rule objects, got {type(rule).__name__} {rule!r}")
    if type(rule) not in RULES.values():
        raise ValueError(f"rules: the ranking scores {sorted(RULES)}, got {rule!r}")
    if isinstance(rule, Threshold) and rule.drafting != "greedy":
        raise ValueError(f"rules: the ranking scores {rule.name} on greedy drafts only (its test q_x >= single "
                         f"is not defined on the merged tail slot), got {rule!r}")
    budgeted = type(rule) in (Mentored, Threshold)
    if budgeted and rule != _plain(rule):
        raise ValueError(f"rules: a {rule.name} entry stands for its rule at every divergence and budget: give "
                         f"{type(rule).__name__}(drafting={rule.drafting!r}, draft_p_min={rule.draft_p_min!r}), "
                         f"got {rule!r}")
    return budgeted


def _plain(rule: Rule) -> Rule:
    """The rule's family at budget 0: its drafting and draft floor only."""
    return type(rule)(drafting=rule.drafting, draft_p_min=rule.draft_p_min)


def _at(rule: Rule, divergence: str, budget: float) -> Rule:
    if isinstance(rule, Threshold):
        return replace(Threshold.for_budget(budget, divergence, drafting=rule.drafting), draft_p_min=rule.draft_p_min)
    return Mentored(max_divergence=budget, divergence=divergence, drafting=rule.drafting, draft_p_min=rule.draft_p_min)


def row_rule(row: dict) -> Rule:
    """The rule of a ``ranking.csv`` row (columns ``rule``, ``drafting``, ``draft_p_min``,
    ``divergence``, ``max_divergence``), as :func:`rule_points` made it; a row without ``rule`` (a
    ranking from before rules were ranked) is MD on sampled drafts, one without ``draft_p_min``
    has no draft floor.

    Examples
    --------
    >>> row_rule({"rule": "threshold", "drafting": "greedy", "divergence": "tv", "max_divergence": "0.25"}).accept
    0.75
    >>> row_rule({"divergence": "kl", "max_divergence": 0.1})
    Mentored(drafting='sampled', max_divergence=0.1, divergence='kl', min_acceptance=None, solve='all')
    """
    name, drafting = str(row.get("rule") or Mentored.name), str(row.get("drafting") or "sampled")
    if name not in RULES:
        raise ValueError(f"row's rule must be one of {sorted(RULES)}, got {name!r}")
    cls, budget = RULES[name], float(row["max_divergence"])
    plain = cls(drafting=drafting, draft_p_min=row_draft_p_min(row))
    if cls in (Mentored, Threshold) and budget > 0:
        return _at(plain, str(row["divergence"]), budget)
    return plain


def rule_points(rules, divergences, budgets) -> tuple[RulePoint, ...]:
    """Every rule at its operating points, in the rules' order (each: divergences outer, budgets
    inner, budget 0 once, as plain SD is).

    Examples
    --------
    >>> from mdboost.md.rules import Match, Threshold
    >>> [(pt.rule.name, pt.divergence, pt.max_divergence) for pt in
    ...  rule_points([Threshold(), Match()], ["kl", "tv"], [0.0, 0.5])]
    [('threshold', 'none', 0.0), ('threshold', 'kl', 0.5), ('threshold', 'tv', 0.5), ('match', 'none', 0.0)]
    >>> round(rule_points([Threshold()], ["tv"], [0.25])[0].rule.accept, 12)
    0.75
    """
    points = []
    for rule in rules:
        if not _family(rule):
            points.append(RulePoint(rule, PLAIN, 0.0))
            continue
        plain = False
        for div in divergences:
            for budget in budgets:
                budget = float(budget)
                if budget == 0 and not plain:
                    points.append(RulePoint(_plain(rule), PLAIN, 0.0))
                    plain = True
                elif budget > 0:
                    points.append(RulePoint(_at(rule, div, budget), div, budget))
    return tuple(points)


def floor_drafts(rows, draft_p_min: float) -> torch.Tensor | None:  # -> bool [N] or None
    """Where a greedy drafter drafts under the floor ``draft_p_min``: its valid rows whose
    confidence (``rows.confidence``, :func:`mdboost.md.drafting.draft_confidence`) is at least the
    floor; None (no cut) without a floor or for a one-hot drafter (no confidence: its proposal
    is certain, and how far one lookup drafts is its own offer).

    Parameters
    ----------
    rows : MemberRows
        The drafter's rows (``confidence`` read from at least ``FLOOR_TOP_K`` cached logits).
    draft_p_min : float
        The floor (0: every valid row).
    """
    if draft_p_min == 0 or rows.confidence is None:
        return None
    if rows.k < FLOOR_TOP_K:
        raise ValueError(f"a draft floor reads the drafter's {FLOOR_TOP_K} largest logits, but the cache keeps "
                         f"k={rows.k} per position: build it with k >= {FLOOR_TOP_K} (cache.k)")
    return rows.valid & (rows.confidence >= draft_p_min)


def greedy_slots(aligned: Aligned) -> torch.Tensor:  # [N, S] -> LongTensor [N]
    """The slot of the greedy draft ``argmax p`` on the aligned support (module docstring).

    Among slots holding one token (``count == 1``), the largest per-token drafter value; ties
    to the smallest token id (on the full path the slot is the token id).
    """
    value = torch.where(aligned.count == 1, aligned.p, torch.full_like(aligned.p, -math.inf))  # [N, S]
    if aligned.ids is None:
        return value.argmax(-1)
    best = value.amax(-1, keepdim=True)
    ids = torch.where((value == best) & (aligned.ids >= 0), aligned.ids, torch.iinfo(torch.long).max)
    return ids.argmin(-1)


def slot_tokens(aligned: Aligned, slots: torch.Tensor) -> torch.Tensor:  # [N] -> [N]
    """The token id held by each row's slot (``-1``: the bucket or padding)."""
    if aligned.ids is None:
        return slots
    return aligned.ids.gather(-1, slots[:, None]).squeeze(-1)


class PointLaw(NamedTuple):
    """A rule point's law per position (0 acceptance and divergence where nothing is drafted)."""

    acceptance: torch.Tensor  # [N]
    divergence: torch.Tensor  # [N] achieved D_f(pi || q), in the point's f
    emitted: torch.Tensor  # [N, S] mass of pi on the support (q where nothing is drafted)
    slots: torch.Tensor | None  # [N] greedy draft slot (None: sampled drafts)


def point_law(point: RulePoint, aligned: Aligned, valid: torch.Tensor, plain_divergence: str = "kl",
              chunk: int = 4096) -> PointLaw:
    """The law of ``point`` at every row of ``aligned`` (float64).

    Parameters
    ----------
    point : RulePoint
    aligned : Aligned
        ``[N, S]`` support.
    valid : bool tensor [N]
        Rows where the drafter has a distribution.
    plain_divergence : str
        The ``f`` of a ``"none"`` point's achieved divergence (0 up to rounding: it is lossless).
    chunk : int
        Rows per call of the rule's law (bounds memory).
    """
    p_mass, q_mass = aligned.p_probs, aligned.q_probs
    slots = greedy_slots(aligned) if point.rule.drafting == "greedy" else None
    f = resolve(plain_divergence if point.divergence == PLAIN else point.divergence)
    n = valid.shape[0]
    acceptance, divergence = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    emitted = q_mass.clone()
    idx = valid.nonzero().squeeze(-1)
    for start in range(0, idx.numel(), chunk):
        rows = idx[start:start + chunk]
        law = point.rule.law(p_mass[rows], q_mass[rows], draft_token=None if slots is None else slots[rows])
        acceptance[rows] = law.acceptance.double()
        emitted[rows] = law.emitted
        divergence[rows] = f_divergence(law.emitted, q_mass[rows], f, validate=False).double()
    return PointLaw(acceptance.clamp(0.0, 1.0), divergence, emitted, slots)


def text_acceptance(law: PointLaw, aligned: Aligned, valid: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The greedy draft's conditional acceptance ``1[x = g]`` along the text ``tokens`` [N]
    (module docstring; 0 where nothing is drafted)."""
    hit = slot_tokens(aligned, law.slots) == torch.as_tensor(tokens, dtype=torch.long)
    return (hit & valid).double()


def greedy_tilt(law: PointLaw, aligned: Aligned) -> torch.Tensor:  # [N]
    """``delta = (P_acc - q_g) / (1 - q_g)`` in [0, 1] (module docstring; 0 for a lossless rule)."""
    q_mass = aligned.q_probs
    return tilt_delta(law.acceptance, q_mass.gather(-1, law.slots[:, None]).squeeze(-1))


def threshold_tail_bounds(point: RulePoint, law: PointLaw, aligned: Aligned, valid: torch.Tensor,
                          target) -> tuple[tuple, tuple] | None:
    """``((P_lo, q_lo), (P_hi, q_hi))`` [N] each: the bounds of a lossy `Threshold` point's
    acceptance where its greedy draft lies outside the target's kept ids, or None where nothing
    is unknown (another rule, ``accept = 1``, full logits, every draft kept).

    There the top-k cache knows only that ``q_x`` lies in ``(0, u]``, ``u`` the smaller of the
    target's smallest kept probability and its tail mass; the uniform-tail point spreads the tail
    evenly, but SGLang's test ``min(1, q_x / accept)`` divides by a threshold that can be as
    small as ``1e-9``, so its acceptance is anywhere in ``[0, min(1, u / accept)]`` there, not
    within ``tail_mass`` of the point (``docs/ranking.md``, "Common support"). Elsewhere both
    bounds are the law's acceptance and the slot's ``q``; ``q_lo``/``q_hi`` are the draft's
    ``q`` at each bound (the greedy chain's tilt, :func:`greedy_tilt`).

    Parameters
    ----------
    point : RulePoint
    law : PointLaw
        The point's law on ``aligned`` (its greedy slots).
    aligned : Aligned
    valid : bool tensor [N]
    target : MemberRows
        The target's rows of ``aligned`` (kept ids and log-probabilities, tail mass).
    """
    rule = point.rule
    if not isinstance(rule, Threshold) or rule.lossless or law.slots is None:  # Match is lossless
        return None
    if aligned.ids is None or target.full_logp is not None:
        return None
    token = slot_tokens(aligned, law.slots)  # [N]
    outside = valid & ~(target.ids == token[:, None]).any(-1)
    if not bool(outside.any()):
        return None
    q_mass = aligned.q_probs
    q_slot = q_mass.gather(-1, law.slots[:, None]).squeeze(-1)  # [N]
    upper = torch.minimum(target.logp.double().exp().min(-1).values, target.tail.double())  # [N]
    zeros = torch.zeros_like(q_slot)
    low = (torch.where(outside, zeros, law.acceptance), torch.where(outside, zeros, q_slot))
    high = (torch.where(outside, rule._accept_prob(upper), law.acceptance), torch.where(outside, upper, q_slot))
    return low, high


def true_token_prob(law: PointLaw, aligned: Aligned, valid: torch.Tensor, tokens: torch.Tensor,
                    target_true_logp: torch.Tensor) -> torch.Tensor:  # [N]
    """``pi_j`` of the true token ``j``: the target's exact ``q_j`` times the ratio ``pi / q`` of
    ``j``'s slot (the bucket's for a token outside the kept ids: the ratio is the same over it);
    ``q_j`` where nothing is drafted."""
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    if aligned.ids is None:
        slots = tokens
    else:
        match = aligned.ids == tokens[:, None]  # [N, S]
        bucket = torch.full_like(tokens, aligned.ids.shape[-1] - 1)
        slots = torch.where(match.any(-1), match.double().argmax(-1), bucket)
    q_mass = aligned.q_probs
    pi_s = law.emitted.gather(-1, slots[:, None]).squeeze(-1)
    q_s = q_mass.gather(-1, slots[:, None]).squeeze(-1)
    count = aligned.count.gather(-1, slots[:, None]).squeeze(-1)
    q_j = target_true_logp.double().exp()
    pi_j = torch.where(q_s > 0, q_j * pi_s / q_s.clamp_min(1e-300), pi_s / count.clamp_min(1.0))
    return torch.where(valid, pi_j, q_j)


def block_chain(aligned: Aligned, valid: torch.Tensor, sequence, width: int, *, num_samples: int = 1024,
                seed: int = 0, chunk: int = 256) -> torch.Tensor:  # -> [N, width]
    """Block verification's chain at every start (module docstring): ``c_{s,i} = E[r_{s,i}] /
    E[r_{s,i-1}]`` over sampled drafts at positions ``s .. s + i`` of the start's sequence.

    ``E[r]`` is :func:`mdboost.md.block.block_acceptance_estimate`'s seeded Monte-Carlo mean
    (``num_samples`` blocks per start; an exact enumeration grows as ``S ** i``), but the first
    draft's exact ``1 - TV``. Positions past a sequence's end, and rows where nothing is drafted,
    get 0 (the process never drafts there).

    Parameters
    ----------
    aligned : Aligned
        ``[N, S]`` support; valid : bool [N]; sequence : [N] the rows' sequence ids (contiguous).
    width : int
        Drafts per step at most (the largest gamma).
    """
    index, lengths = padded_index(sequence)  # [B, L]
    pos = torch.arange(index.shape[1])
    ahead = pos[:, None] + torch.arange(width)  # [L, W]
    windows = torch.where(ahead < index.shape[1], index[:, ahead.clamp(max=index.shape[1] - 1)],
                          torch.full((), -1, dtype=torch.long))  # [B, L, W] row of draft i of a start
    rows = gather_rows(torch.arange(valid.shape[0]), index, -1).reshape(-1)  # [B * L] the start's row
    windows = windows.reshape(-1, width)[rows >= 0]  # [N', W], in the order of the rows
    starts = rows[rows >= 0]
    drafted = valid[windows.clamp(min=0)] & (windows >= 0)  # [N', W]
    alive = drafted.long().cumprod(-1).bool()  # a step stops at the first undrafted position
    generator = torch.Generator().manual_seed(seed)
    chain = torch.zeros(valid.shape[0], width, dtype=torch.float64)
    for lo in range(0, starts.numel(), chunk):
        w, keep = windows[lo:lo + chunk].clamp(min=0), alive[lo:lo + chunk]
        p, q, c = (x[w] for x in (aligned.p, aligned.q, aligned.count))  # [n, W, S]
        one = torch.zeros_like(p).index_fill_(-1, torch.tensor([0]), 1.0)  # an undrafted slot: ratio 1
        p, q = torch.where(keep[..., None], p, one), torch.where(keep[..., None], q, one)
        c = torch.where(keep[..., None], c, torch.ones_like(c))
        er, _ = block_acceptance_estimate(p, q, c, num_samples=num_samples, generator=generator, validate=False)
        prev = torch.cat([torch.ones_like(er[:, :1]), er[:, :-1]], dim=-1)
        ratio = torch.where(prev > 0, er / prev.clamp_min(1e-300), torch.zeros_like(er)).clamp(0.0, 1.0)
        chain[starts[lo:lo + chunk]] = torch.where(keep, ratio, torch.zeros_like(ratio))
    first = torch.minimum(aligned.p_mass, aligned.q_mass).sum(-1).clamp(0.0, 1.0)  # E[r_0] exactly
    chain[:, 0] = torch.where(valid, first, torch.zeros_like(first))
    return chain
