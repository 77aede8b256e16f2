"""One frontier: acceptance against achieved divergence for every rule, MD's optimal curve on top.

Given per-position drafter and target distributions ``p``, ``q`` (``[N, V]``) and a divergence
``f``, :func:`frontier` sweeps each heuristic of :mod:`mdboost.md.heuristics` and SGLang's
threshold (:class:`mdboost.md.rules.Threshold`) over a grid of its parameter and reads off each
point, from the rule's law in closed form: the mean acceptance over positions and the achieved
``D_f(pi || q)`` (mean and max over positions). MD's curve is :class:`mdboost.md.rules.Mentored`
at a grid of budgets, for the same drafting.

**The optimality gap** of a heuristic point (``docs/theory.md``, section 11, "The field's
heuristics") is MD's acceptance minus the heuristic's, with MD solved at **the heuristic's own
per-position achieved divergence** as the budget of each position (:attr:`FrontierPoint.gap`).
The heuristic's ``pi`` is feasible for that budget at every position, so MD accepts at least as
much at every position: the gap is ``>= 0``, a theorem and not an empirical finding, and it
compares the two at equal divergence position by position, not only on average. MD as mdboost
runs it (one budget for every position) is also reported at the heuristic's mean divergence
(:attr:`FrontierPoint.gap_at_mean`); its mean divergence is at most that budget, but a uniform
budget is not the best allocation of a mean, so that gap carries no sign guarantee. At the
heuristic's max divergence (:attr:`FrontierPoint.gap_at_max`, the guarantee SGLang's mapped
threshold gives) MD's uniform budget covers every position's divergence: ``gap_at_max >= gap``.

FLy's points use the law of the first position of a block (:class:`mdboost.md.heuristics.Fly`)
with ``kappa = alpha^W``, ``alpha`` the mean native acceptance over the positions (positions
taken as independent): its window positions' own distortion is not in the point.

Rows are full distributions, one token a column: Typical's, SGLang's and FLy's tests read a
token's own probability (and FLy a top-k entropy), so a column that merges many tokens (the
ranking's aligned tail bucket, :mod:`mdboost.ranking.support`) would be read as one token. The
cache's ``pair_probs(..., tail="drop")`` rows (each member's top-k renormalised, distinct tokens)
qualify.

Speedups, when ``gamma`` and ``cost_ratio`` are given, are :func:`mdboost.ranking.speed.walltime_speedup`
at the mean acceptance (the i.i.d. chain of Leviathan et al.; no MD solve overhead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from mdboost.md.divergences import f_divergence, resolve
from mdboost.md.heuristics import Fly, Fuzzy, Lenient, Typical
from mdboost.md.rules import DRAFTING, Mentored, Threshold
from mdboost.md.solve import solve
from mdboost.ranking.speed import walltime_speedup
from mdboost.ranking.support import align_topk

__all__ = ["DEFAULT_BUDGETS", "DEFAULT_GRIDS", "Frontier", "FrontierPoint", "cached_positions", "frontier",
           "heuristic_rules", "md_curve", "priced"]

DEFAULT_BUDGETS = (0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
DEFAULT_GRIDS = {
    "lenient": (0.9, 0.7, 0.5, 0.3, 0.1),  # l
    "typical": (0.01, 0.03, 0.09, 0.2, 0.4),  # epsilon, with Medusa's delta = sqrt(epsilon)
    "fuzzy": (0.01, 0.03, 0.1, 0.3, 1.0),  # T, on the frontier's divergence
    "threshold": (0.9, 0.7, 0.5, 0.3, 0.1),  # SGLang's threshold_acc c (threshold_single 1)
    "fly": (0.0, 0.3, 0.6, 1.0),  # fly_entropy_threshold
}
PARAMETERS = {"lenient": "lenience", "typical": "epsilon", "fuzzy": "threshold", "threshold": "accept",
              "fly": "entropy_threshold", "mentored": "max_divergence"}


@dataclass(frozen=True)
class FrontierPoint:
    """One rule at one parameter value, averaged over the positions.

    Attributes
    ----------
    rule : str
        The rule's ``name`` (``"lenient"``, ``"typical"``, ``"fuzzy"``, ``"threshold"``, ``"fly"``,
        ``"mentored"``).
    drafting : {"sampled", "greedy"}
    parameter : str
        The swept parameter (:data:`PARAMETERS`).
    value : float
    acceptance : float
        Mean over positions of the probability that the draft is accepted.
    divergence_mean, divergence_max : float
        Achieved ``D_f(pi || q)``, mean and max over positions (may be ``inf``).
    md_acceptance : float
        MD's mean acceptance with each position's budget set to the divergence this rule achieves
        there (NaN on MD's own points).
    md_acceptance_at_mean : float
        MD's mean acceptance at the uniform budget ``divergence_mean`` (NaN on MD's own points).
    md_acceptance_at_max : float
        MD's mean acceptance at the uniform budget ``divergence_max``: the same worst-case
        divergence as this point (NaN on MD's own points).
    speedup, md_speedup : float
        Predicted speedups at ``acceptance`` and ``md_acceptance`` (NaN without a speed model).
    """

    rule: str
    drafting: str
    parameter: str
    value: float
    acceptance: float
    divergence_mean: float
    divergence_max: float
    md_acceptance: float = math.nan
    md_acceptance_at_mean: float = math.nan
    md_acceptance_at_max: float = math.nan
    speedup: float = math.nan
    md_speedup: float = math.nan

    @property
    def gap(self) -> float:
        """MD's acceptance at this point's per-position divergences minus this point's (``>= 0``)."""
        return self.md_acceptance - self.acceptance

    @property
    def gap_at_mean(self) -> float:
        """MD's acceptance at the uniform budget ``divergence_mean`` minus this point's."""
        return self.md_acceptance_at_mean - self.acceptance

    @property
    def gap_at_max(self) -> float:
        """MD's acceptance at the uniform budget ``divergence_max`` minus this point's (``>= gap >= 0``)."""
        return self.md_acceptance_at_max - self.acceptance

    @property
    def speedup_gap(self) -> float:
        """The speedup MD adds at this point's per-position divergences."""
        return self.md_speedup - self.speedup

    def as_row(self) -> dict:
        """A flat dict (for a CSV or MLflow), with the gaps."""
        row = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return row | {"gap": self.gap, "gap_at_mean": self.gap_at_mean, "gap_at_max": self.gap_at_max,
                      "speedup_gap": self.speedup_gap}


@dataclass(frozen=True)
class Frontier:
    """The heuristics' points and MD's curves of one (pair, temperature, divergence).

    Attributes
    ----------
    divergence : str
    points : list of FrontierPoint
        Every heuristic point, with its optimality gap.
    curves : dict
        ``drafting -> list of FrontierPoint``: MD's curve along the budgets, for each drafting.
    """

    divergence: str
    points: list = field(default_factory=list)
    curves: dict = field(default_factory=dict)

    def rows(self) -> list[dict]:
        """Every point, MD's curves included, as flat dicts."""
        return [pt.as_row() for pt in self.points] + [pt.as_row() for c in self.curves.values() for pt in c]


def heuristic_rules(divergence="kl", *, drafting: str = "sampled", grids: dict | None = None, fly_window: int = 3,
                    window_acceptance: float = 0.0) -> list:
    """The heuristic rules of the frontier, one per grid value (``grids`` overrides :data:`DEFAULT_GRIDS`).

    ``window_acceptance`` is FLy's ``kappa`` (:func:`frontier` sets it to ``alpha^W``).
    """
    grids = DEFAULT_GRIDS | dict(grids or {})
    unknown = set(grids) - set(DEFAULT_GRIDS)
    if unknown:
        raise ValueError(f"grids has unknown rules {sorted(unknown)}; known: {sorted(DEFAULT_GRIDS)}")
    name = resolve(divergence).name
    rules = [Lenient(lenience=v, drafting=drafting) for v in grids["lenient"]]
    rules += [Typical(epsilon=v, delta=math.sqrt(v), drafting=drafting) for v in grids["typical"]]
    rules += [Fuzzy(threshold=v, divergence=name, drafting=drafting) for v in grids["fuzzy"]]
    rules += [Threshold(accept=v, drafting=drafting) for v in grids["threshold"]]
    rules += [Fly(entropy_threshold=v, window=fly_window, window_acceptance=window_acceptance, drafting=drafting)
              for v in grids["fly"]]
    return rules


def _point(rule, p, q, divergence, draft_token) -> tuple[FrontierPoint, torch.Tensor]:
    law = rule.law(p, q, draft_token=draft_token)
    achieved = f_divergence(law.emitted, q, divergence, validate=False)  # [N]
    name = PARAMETERS[rule.name]
    point = FrontierPoint(rule.name, rule.drafting, name, float(getattr(rule, name)), float(law.acceptance.mean()),
                          float(achieved.mean()), float(achieved.max()))
    return point, achieved


def md_curve(draft_probs: torch.Tensor, target_probs: torch.Tensor, divergence="kl", *, drafting: str = "sampled",
             budgets=DEFAULT_BUDGETS, draft_token: torch.Tensor | None = None) -> list[FrontierPoint]:
    """MD's curve: :class:`~mdboost.md.rules.Mentored` at each budget, as frontier points."""
    if not len(budgets):
        raise ValueError(f"budgets must hold at least one budget, got {budgets!r}")
    name = resolve(divergence).name
    p, q = _checked(draft_probs, target_probs)
    return [_point(Mentored(max_divergence=float(b), divergence=name, drafting=drafting), p, q, divergence,
                   draft_token)[0] for b in budgets]


def _md_acceptances(proposal, q, budgets, divergence) -> list[float]:  # [N, V] x2, budgets [M, N] -> M means
    """MD's mean acceptance over the positions at each row of per-position ``budgets``, in one solve."""
    m = budgets.shape[0]
    sol = solve(proposal.expand(m, *proposal.shape), q.expand(m, *q.shape), max_divergence=budgets,
                divergence=divergence, support="any", validate=False)
    return sol.acceptance.double().mean(-1).tolist()


def _checked(draft_probs, target_probs):
    for name, x in (("draft_probs", draft_probs), ("target_probs", target_probs)):
        if not torch.is_tensor(x) or x.ndim != 2:
            raise ValueError(f"{name} must be a [N, V] tensor, got "
                             f"{tuple(x.shape) if torch.is_tensor(x) else type(x).__name__}")
    if draft_probs.shape != target_probs.shape:
        raise ValueError(f"draft_probs and target_probs must have the same shape, got {tuple(draft_probs.shape)} "
                         f"and {tuple(target_probs.shape)}")
    return draft_probs.double(), target_probs.double()


def frontier(draft_probs: torch.Tensor, target_probs: torch.Tensor, divergence="kl", *,
             drafting=DRAFTING, grids: dict | None = None, budgets=DEFAULT_BUDGETS, fly_window: int = 3,
             gamma: int | None = None, cost_ratio: float | None = None,
             draft_token: torch.Tensor | None = None) -> Frontier:
    """Every heuristic point with its optimality gap, and MD's curve, for each drafting.

    Parameters
    ----------
    draft_probs, target_probs : torch.Tensor of shape (N, V)
        ``p`` and ``q`` at each position (full-vocabulary rows).
    divergence : str, default="kl"
        The ``f`` of the achieved divergence (and of Fuzzy's test).
    drafting : tuple of {"sampled", "greedy"}, default=both
    grids : dict, optional
        Parameter grids per rule, overriding :data:`DEFAULT_GRIDS`.
    budgets : sequence of float, default=DEFAULT_BUDGETS
        MD's curve.
    fly_window : int, default=3
        FLy's ``W`` (vLLM's default ``min(6, K - 1)`` at ``K = 4``).
    gamma, cost_ratio : optional
        Draft length and drafter cost ratio of the speed model (both or neither).
    draft_token : torch.LongTensor of shape (N,), optional
        The greedy draft per row (default ``argmax p``).

    Examples
    --------
    >>> p = torch.tensor([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3]], dtype=torch.float64)
    >>> q = torch.tensor([[0.5, 0.3, 0.2], [0.3, 0.3, 0.4]], dtype=torch.float64)
    >>> fr = frontier(p, q, "kl", drafting=("sampled",))
    >>> min(pt.gap for pt in fr.points) >= -1e-9
    True
    """
    if isinstance(drafting, str):
        drafting = (drafting,)
    bad = [d for d in drafting if d not in DRAFTING]
    if bad or not drafting:
        raise ValueError(f"drafting must be a non-empty tuple of {DRAFTING}, got {drafting!r}")
    if (gamma is None) != (cost_ratio is None):
        raise ValueError(f"give gamma and cost_ratio together, got gamma={gamma!r}, cost_ratio={cost_ratio!r}")
    p, q = _checked(draft_probs, target_probs)
    name = resolve(divergence).name
    out = Frontier(divergence=name)
    for mode in drafting:
        proposal = Mentored(drafting=mode).proposal(p, draft_token)  # [N, V] what the verifier sees
        alpha = float(torch.minimum(proposal, q).sum(-1).mean())  # native (SD) acceptance
        points, md_budgets = [], []  # MD at each point's three budgets, solved in one batched call
        for rule in heuristic_rules(name, drafting=mode, grids=grids, fly_window=fly_window,
                                    window_acceptance=alpha ** fly_window):
            point, achieved = _point(rule, p, q, name, draft_token)
            points.append(point)
            md_budgets += [achieved, torch.full_like(achieved, point.divergence_mean),
                           torch.full_like(achieved, point.divergence_max)]
        md = _md_acceptances(proposal, q, torch.stack(md_budgets), name) if points else []
        out.points.extend(replace(point, md_acceptance=md[3 * i], md_acceptance_at_mean=md[3 * i + 1],
                                  md_acceptance_at_max=md[3 * i + 2]) for i, point in enumerate(points))
        out.curves[mode] = md_curve(p, q, name, drafting=mode, budgets=budgets, draft_token=draft_token)
    return out if gamma is None else priced(out, gamma, cost_ratio)


def priced(front: Frontier, gamma: int, cost_ratio: float) -> Frontier:
    """``front`` with every point's ``speedup`` and ``md_speedup`` at draft length ``gamma`` and
    drafter cost ratio ``cost_ratio`` (the module's speed model; the rest of a frontier does not
    depend on costs, so one computed without them can be priced for any)."""
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an int >= 1, got {gamma!r}")
    return Frontier(front.divergence, [_with_speed(pt, gamma, cost_ratio) for pt in front.points],
                    {mode: [_with_speed(pt, gamma, cost_ratio) for pt in curve] for mode, curve in front.curves.items()})


def _with_speed(point: FrontierPoint, gamma, cost_ratio) -> FrontierPoint:
    def speed(alpha):
        return math.nan if math.isnan(alpha) else float(walltime_speedup(alpha, gamma, cost_ratio))

    return replace(point, speedup=speed(point.acceptance), md_speedup=speed(point.md_acceptance))


def cached_positions(pc, drafter: str, target: str, temperature: float, rows: int):
    """``p``, ``q`` ``[N, S]`` (float64) of a pool pair's first ``rows`` cached positions, one token
    a column, and their sequences ``[N]``: each member's kept top-k renormalised
    (:meth:`~mdboost.cache.reader.LogitCache.sparse` with ``tail="drop"``) on the union of the two
    (:func:`mdboost.ranking.support.align_topk`), from the acceptance cache when the pool has one
    (the text the ranking reads acceptance on). Positions where the drafter drafts nothing are dropped.
    """
    caches = pc.acceptance.caches if pc.acceptance is not None else pc.caches
    index = torch.arange(min(int(rows), caches[target].num_rows))
    d_ids, d_logp, d_tail, d_valid = caches[drafter].sparse(drafter, index, temperature, "drop")
    t_ids, t_logp, t_tail, t_valid = caches[target].sparse(target, index, temperature, "drop")
    aligned = align_topk(d_ids, d_logp, d_tail, t_ids, t_logp, t_tail, pc.vocab_size)
    valid = d_valid & t_valid
    p, q = aligned.p_mass.double()[valid], aligned.q_mass.double()[valid]
    return p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True), caches[target].row_sequence()[index][valid]
