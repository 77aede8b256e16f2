"""Optimal mentored distributions: the f-MD primal/dual solvers and the clamp distribution.

Paper results implemented here (definitions in ``docs/theory.md``):

- Theorem 3.7 / Corollary 3.10: the optimum is the clamp ``pi(a, b) = max{(1-b) q, min{p, (1+a) q}}``
  (:mod:`mdboost.md.clamp`: :func:`clamp` elementwise, :func:`mentored_distribution` on ``[..., V]``
  rows; imported here);
- Definition 3.11 / Theorem 3.13: the optimal couples form one f-independent curve C(p, q),
  searched through :class:`~mdboost.md.breakpoints.Breakpoints` (:func:`solve`);
- Theorem 3.12: the conservative ``mode="bound"``.

:func:`reference` states the exact solve in a page (bisection along the curve); :func:`solve`
checks its arguments and runs the route :mod:`mdboost.md._router` picks (sorted breakpoints,
buckets in expected linear time, one-row searches in Python floats), each tested against it.

Optimal means optimal among distributions supported on the target's support (``pi_i = 0`` where
``q_i = 0``: a token the target's sampling excludes is never emitted); ``solve(..., support="any")``
gives the optimum over all distributions (:mod:`mdboost.md.support`).

``P_acc(pi) = sum_i min(pi_i, p_i)`` is :func:`acceptance_probability`; the boosting coefficient
``k = sqrt((1+a) / (1-b))`` of Table 5 / Theorem 4.8 is :func:`boost_coefficient`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mdboost.md import _buckets, _router, _scalar_rows
from mdboost.md import support as _support
from mdboost.md._checks import _check_budget_range, check_budget, checked_pair, is_number
from mdboost.md._histogram import takes_numpy_pass
from mdboost.md.breakpoints import Breakpoints
from mdboost.md.clamp import acceptance_probability, boost_coefficient, clamp, mentored_distribution, point_to_dtype
from mdboost.md.contract import tolerance
from mdboost.md.divergences import f_divergence, resolve

__all__ = ["MDSolution", "solve", "reference", "clamp", "mentored_distribution", "acceptance_probability", "boost_coefficient"]

MODES = ("exact", "bound")
SUPPORTS = _support.SUPPORTS
ON_INFEASIBLE = ("clip", "raise")


@dataclass(frozen=True)
class MDSolution:
    """The solution of f-MD for a batch of pairs (all tensors of shape ``(...)``).

    Attributes
    ----------
    a, b : torch.Tensor
        Clamp parameters: ``pi = max{(1-b) q, min{p, (1+a) q}}``, ``a >= 0``, ``0 <= b <= 1``.
    acceptance : torch.Tensor
        ``P_acc(pi) = 1 - E(a)``, the optimal acceptance probability (among distributions on
        the target's support unless ``support="any"``), in ``[0, 1]``.
    achieved_divergence : torch.Tensor
        ``D_f(pi || q)`` at the solution, ``>= 0``, read off the solver's sums (prefix sums of
        the sorted breakpoints, or the bucket sums); computed on the full vocabulary for
        ``mode="bound"`` and on rows where ``support="any"`` puts mass off the target's support.
    sd_acceptance : torch.Tensor
        ``1 - TV(p, q)``, the acceptance of standard speculative decoding.
    feasible : torch.BoolTensor
        Whether the request is met: always for a budget (``pi = q`` meets every one); for
        ``min_acceptance``, False where the target is above the largest reachable acceptance
        (``1 - p(q = 0)`` on the target's support), where the solution is the curve's end.
    off_support : torch.Tensor
        The mass ``pi`` puts on tokens with ``q_i = 0``, in proportion to ``p`` there (0 unless
        ``support="any"``): ``mentored_distribution(p, q, a, b, off_support=...)`` gives ``pi``.
    """

    a: torch.Tensor
    b: torch.Tensor
    acceptance: torch.Tensor
    achieved_divergence: torch.Tensor
    sd_acceptance: torch.Tensor
    feasible: torch.Tensor | None = None  # None: filled in (all True)
    off_support: torch.Tensor | None = None  # None: filled in (zeros)

    def __post_init__(self):
        if self.feasible is None:
            object.__setattr__(self, "feasible", torch.ones_like(self.acceptance, dtype=torch.bool))
        if self.off_support is None:
            object.__setattr__(self, "off_support", torch.zeros_like(self.acceptance))

    @property
    def boost_coefficient(self) -> torch.Tensor:
        """``k = sqrt((1+a) / (1-b))`` at the solution (:func:`boost_coefficient`)."""
        return boost_coefficient(self.a, self.b, validate=False)


def solve(
    draft_probs: torch.Tensor,  # [..., V]
    target_probs: torch.Tensor,  # [..., V]
    *,
    max_divergence=None,
    min_acceptance=None,
    divergence="kl",
    mode: str = "exact",
    support: str = "target",
    on_infeasible: str = "clip",
    validate: bool = True,
) -> MDSolution:
    """Solve f-MD for every row: the primal (divergence budget) or the dual (acceptance target).

    Parameters
    ----------
    draft_probs, target_probs : torch.Tensor of shape (..., V)
        Drafter ``p`` and target ``q`` distributions (float32 or float64, any device; float16 /
        bfloat16 are computed and returned in float32).
    max_divergence : float or tensor broadcastable to (...), optional
        Primal budget ``D >= 0`` on ``D_f(pi || q)`` (``+inf`` allowed: ``pi = p``).
    min_acceptance : float or tensor broadcastable to (...), optional
        Dual target ``P`` in ``[0, 1]``: the minimal-divergence ``pi`` with ``P_acc >= P``.
        Targets below SD's acceptance give ``pi = q``; above the reachable maximum, the end
        of the curve (``feasible`` False there). Exactly one of ``max_divergence`` /
        ``min_acceptance`` must be given.
    divergence : str, Divergence or callable, default="kl"
        Generator name (see :mod:`mdboost.md.divergences`), ``"alpha:<a>"`` or a callable.
    mode : {"exact", "bound"}, default="exact"
        Primal only (``"bound"`` with ``min_acceptance`` is a ValueError). ``"exact"``: the
        optimum among distributions supported on the target's support (acceptance within
        ~1e-12 in float64). ``"bound"``: the largest point of the curve whose Theorem 3.12
        upper bound fits the budget (never exceeds it; ``O(log V)`` per query after the build).
    support : {"target", "any"}, default="target"
        ``"target"``: optimal among distributions supported on the target's support (tokens
        with ``q_i = 0``, e.g. outside a top-k / top-p target, are never emitted). ``"any"``:
        the optimum over all distributions, exact; it differs only for generators with a finite
        ``c = lim g(z) / z`` (``rkl``, ``hellinger``, ``neyman``, ``tv``, ``js``, ``alpha:<a>``
        with ``a < 1``), on rows where ``p(q = 0) > 0`` and the budget exceeds the divergence
        at the curve's end (or the target its acceptance), and it puts ``off_support`` mass
        there (:mod:`mdboost.md.support`). Exact mode only; one more sort per call.
    on_infeasible : {"clip", "raise"}, default="clip"
        Dual only, for a target above the largest reachable acceptance: ``"clip"`` returns the
        curve's end with ``feasible`` False; ``"raise"`` raises ValueError (one device sync).
    validate : bool, default=True
        Check the inputs (device synchronisation); False in trusted hot loops. Another type
        (e.g. ``"no"``) is a TypeError.

    Returns
    -------
    MDSolution
        ``acceptance`` in ``[0, 1]`` and ``achieved_divergence >= 0`` (rounding never leaves
        them); ``feasible`` per row. Computed in float64 and returned in the input's compute
        dtype; in float32 (and for half inputs) ``a`` and ``b`` are rounded towards ``pi = q``
        (:func:`~mdboost.md.clamp.point_to_dtype`), so that ``pi(a, b)`` at the returned values
        keeps the budget on the rows as solved (rescaled to sum 1 in float64 when validated):
        ``D_f(pi || q) <= max_divergence (1 + rel) + abs`` with float32's tolerances of
        :func:`mdboost.md.contract.tolerance`, like ``achieved_divergence``.

    Examples
    --------
    >>> import torch
    >>> p = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    >>> q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    >>> sol = solve(p, q, max_divergence=0.05, divergence="tv")
    >>> round(float(sol.acceptance), 6)  # TV oracle: 1 - TV + D
    0.55

    A target with a zero: on its support the acceptance stops at ``1 - p(q = 0)``.

    >>> p, q = torch.tensor([0.5, 0.5], dtype=torch.float64), torch.tensor([1.0, 0.0], dtype=torch.float64)
    >>> sol = solve(p, q, min_acceptance=0.9, divergence="hellinger")
    >>> float(sol.acceptance), bool(sol.feasible)
    (0.5, False)
    >>> sol = solve(p, q, min_acceptance=0.9, divergence="hellinger", support="any")
    >>> round(float(sol.acceptance), 6), round(float(sol.off_support), 6), bool(sol.feasible)
    (0.9, 0.4, True)
    """
    validate = _check_request(max_divergence, min_acceptance, mode, support, on_infeasible, validate)
    return _solve(draft_probs, target_probs, max_divergence, min_acceptance, divergence, mode, support,
                  on_infeasible, validate)


def reference(draft_probs, target_probs, value, dual: bool, divergence="kl", *, iters: int = 64):
    """The exact f-MD solve stated plainly: the definition every route of :func:`solve` is tested against.

    The optimal distributions are the clamps on the curve C(p, q) (Corollary 3.10, Theorem 3.13),
    walked by the excess mass ``m`` (the acceptance is ``1 - m``, ``docs/theory.md`` section 4):
    at ``m``, ``a`` solves ``E(a) = sum_i (p_i - (1+a) q_i)_+ = m`` and ``b`` solves
    ``F(b) = sum_i ((1-b) q_i - p_i)_+ = m`` (both non-increasing: bisection), and ``D_f`` is
    evaluated on the whole clamp. The curve runs from ``m = TV(p, q)`` (``pi = q``, ``D_f = 0``)
    down to ``m_end = min(p(q = 0), TV)``, and ``D_f`` grows along it: the primal is the smallest
    ``m`` with ``D_f <= budget`` (bisection on ``m``), the dual the point at ``m = 1 - P`` clipped
    to ``[m_end, TV]``. ``O(iters^2 V)`` a row: slow, for tests and for reading (``route="reference"``
    of :mod:`mdboost.md._router`).

    Parameters
    ----------
    draft_probs, target_probs : torch.Tensor of shape (..., V)
        ``p`` and ``q``, rows summing to 1 (computed in float64; not checked).
    value : float or tensor broadcastable to (...)
        The budget ``D >= 0`` (primal) or the target acceptance ``P`` (``dual``).
    dual : bool
    divergence : str, Divergence or callable, default="kl"
    iters : int, default=64
        Bisection steps (64 halve any float64 interval below its resolution).

    Returns
    -------
    tuple of torch.Tensor
        ``(a, b, acceptance, D_f, sd_acceptance)``, float64 of shape (...).

    Examples
    --------
    >>> p = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    >>> q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    >>> [round(float(x), 6) for x in reference(p, q, 0.05, False, "tv")]  # TV: acceptance 1 - TV + D
    [0.25, 0.0625, 0.55, 0.05, 0.5]
    """
    div = resolve(divergence)
    p, q = draft_probs.to(torch.float64), target_probs.to(torch.float64)
    zero = torch.zeros(p.shape[:-1], dtype=torch.float64, device=p.device)  # [...]
    value = zero + torch.as_tensor(value, dtype=torch.float64, device=p.device)
    tv = (p - q).clamp(min=0).sum(-1)
    m_end = torch.minimum(torch.where(q == 0, p, 0.0).sum(-1), tv)
    a_max = (torch.where(q > 0, p / q, 0.0).amax(-1) - 1).clamp(min=0)

    def bisect(fn, lo, hi, target):  # the smallest x in [lo, hi] with fn(x) <= target; fn non-increasing
        for _ in range(iters):
            mid = (lo + hi) / 2
            above = fn(mid) > target
            lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
        return hi

    def point(m):  # (a, b) [...] at the excess m [...]; (0, 0) from m = TV on (pi = q)
        u = bisect(lambda u: (p - (1 + torch.expm1(u)).unsqueeze(-1) * q).clamp(min=0).sum(-1),
                   zero, torch.log1p(a_max), m)  # on log(1 + a): ratios span decades
        b = bisect(lambda b: ((1 - b).unsqueeze(-1) * q - p).clamp(min=0).sum(-1), zero, zero + 1, m)
        return torch.where(m >= tv, 0.0, torch.expm1(u)), torch.where(m >= tv, 0.0, b)

    def divergence_at(m):  # D_f(pi || q) [...] on the whole clamp at m
        a, b = point(m)
        return f_divergence(clamp(p, q, a.unsqueeze(-1), b.unsqueeze(-1)), q, div, validate=False)

    if dual:
        m = torch.minimum(torch.maximum(1 - value, m_end), tv)
    else:
        m = torch.where(divergence_at(m_end) <= value, m_end, bisect(divergence_at, m_end, tv, value))
        m = torch.where(value <= 0, tv, m)  # D_f = 0 only at pi = q (rounding makes it 0 just before)
    a, b = point(m)
    return a, b, 1 - m, divergence_at(m), 1 - tv


def _solve(draft_probs, target_probs, max_divergence=None, min_acceptance=None, divergence="kl", mode="exact",
           support="target", on_infeasible="clip", validate=True, route=None, namespace=None) -> MDSolution:
    """:func:`solve` after its argument checks, by ``route`` (one of :data:`mdboost.md._router.ROUTES`;
    None: the router's pick, :func:`mdboost.md._router.pick`).

    ``namespace`` (:data:`~mdboost.md._xp.NUMPY` or :data:`~mdboost.md._xp.TORCH`; None: the rule of
    :func:`mdboost.md._xp.namespace_for`) forces the array namespace of the input checks, of
    the bucketed routes and of the sorted route's build (``TORCH`` on CPU tensors: the
    accelerators' code path).
    """
    div = resolve(divergence)
    dual = min_acceptance is not None
    budget = (float(max_divergence) if mode == "exact" and support == "target" and not dual
              and is_number(max_divergence) else None)  # a Python-number primal: the one-row routes
    g = None if budget is None else div.g_float
    if route is None:
        route = _router.pick(draft_probs, target_probs, budget, g is not None, mode, namespace)
    else:
        _router.check_route(route, draft_probs, budget, g is not None, mode)
    if route == _router.SCALAR_ROW:
        return _scalar_row(draft_probs, target_probs, budget, div, g, validate)
    p, q, row_sums = checked_pair(draft_probs, target_probs, validate=False, namespace=namespace)
    # CPU float32 / float64 rows of the bucketed routes are checked in their histogram pass (one read
    # of the rows; the same errors), the others here
    in_pass = (validate and route in (_router.BUCKETED_ROW, _router.BUCKETED_BATCH)
               and draft_probs.dtype == p.dtype == target_probs.dtype and takes_numpy_pass(p, q, namespace))
    if validate and not in_pass:
        p, q, row_sums = checked_pair(draft_probs, target_probs, validate=True, namespace=namespace)
    if route == _router.BUCKETED_ROW:
        return _bucketed_row(p, q, budget, div, validate, row_sums, in_pass)
    request = min_acceptance if dual else max_divergence
    if route == _router.BUCKETED_BATCH:
        return _bucketed_batch(p, q, request, dual, div, support, on_infeasible, validate, row_sums, in_pass,
                               namespace)
    if route == _router.REFERENCE:
        return _reference_route(p, q, request, dual, div, support, on_infeasible, validate)
    return _sorted(p, q, request, dual, div, mode, support, on_infeasible, validate, namespace)


def _check_request(max_divergence, min_acceptance, mode, support, on_infeasible, validate) -> bool:
    """The checks of :func:`solve`'s arguments other than the rows; returns ``validate`` as a bool."""
    if (max_divergence is None) == (min_acceptance is None):
        raise ValueError(
            f"give exactly one of max_divergence and min_acceptance, got max_divergence={max_divergence!r}, "
            f"min_acceptance={min_acceptance!r}"
        )
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode != "exact" and min_acceptance is not None:
        raise ValueError(f"mode={mode!r} applies to the primal (max_divergence) only; the dual (min_acceptance) "
                         f"is solved exactly: leave mode='exact'")
    if not isinstance(validate, (bool, np.bool_)):
        raise TypeError(f"validate must be True or False, got {validate!r}")
    if not isinstance(support, str) or support not in SUPPORTS:
        raise ValueError(f"support must be one of {SUPPORTS}, got {support!r}")
    if support == "any" and mode != "exact":
        raise ValueError(f"support='any' needs mode='exact', got mode={mode!r}")
    if not isinstance(on_infeasible, str) or on_infeasible not in ON_INFEASIBLE:
        raise ValueError(f"on_infeasible must be one of {ON_INFEASIBLE}, got {on_infeasible!r}")
    return bool(validate)


# ---------------------------------------------------------------- the routes (mdboost.md._router)
def _checked_request(p, request, dual: bool, validate: bool) -> torch.Tensor:  # -> float64 [...]
    """The budget (``max_divergence``) or target acceptance (``min_acceptance``, at most 1) per row of ``p``."""
    name = "min_acceptance" if dual else "max_divergence"
    return check_budget(name, request, p.shape[:-1], p.device, upper=1.0 if dual else None, validate=validate)


def _bucketed_row(p, q, budget: float, div, validate: bool, row_sums, in_pass: bool) -> MDSolution:
    """One CPU row in expected linear time, its reduced row searched in Python floats."""
    if validate:
        _check_budget_range("max_divergence", budget, budget, None)
    return _one_solution(_buckets.solve_one(p, q, budget, div, validate, row_sums, in_pass), p)


def _bucketed_batch(p, q, request, dual, div, support, on_infeasible, validate, row_sums, in_pass,
                    namespace=None) -> MDSolution:
    """Rows in expected linear time (``docs/theory.md``, section 4)."""
    value = _checked_request(p, request, dual, validate)
    sol = MDSolution(*_buckets.solve_batch(p, q, value, div, dual, normalize=validate, row_sums=row_sums,
                                           check=in_pass, xp=namespace))
    p64, q64 = _rows64(p, q, validate) if dual or support == "any" else (None, None)
    return _finish(sol, p64, q64, value, dual, div, support, on_infeasible)


def _reference_route(p, q, request, dual, div, support, on_infeasible, validate) -> MDSolution:
    """:func:`reference` on the rows the routes solve (rescaled where they rescale)."""
    value = _checked_request(p, request, dual, validate)
    p64, q64 = _rows64(p, q, validate)
    a, b, *rest = reference(p64, q64, value, dual, div)
    sol = MDSolution(*point_to_dtype(a, b, p.dtype), *(x.to(p.dtype) for x in rest))
    return _finish(sol, p64, q64, value, dual, div, support, on_infeasible)


def _sorted(p, q, request, dual, div, mode, support, on_infeasible, validate, namespace=None) -> MDSolution:
    """The sorted breakpoints (:class:`~mdboost.md.breakpoints.Breakpoints`) and their search."""
    bp = Breakpoints.from_checked(p, q, normalize=validate, namespace=namespace)
    if not p.shape[:-1].numel():  # an empty batch: the queries check the budget, then nothing to solve
        point = (bp.for_acceptance(request, validate=validate) if dual
                 else bp.for_divergence(request, div, validate=validate))
        return MDSolution(point.a, point.b, point.acceptance, point.a.clone(), bp.sd_acceptance)
    if dual:
        point, value = _buckets.sorted_dual(bp, bp.flat_budget(request, "min_acceptance", 1.0, validate), div)
    elif mode == "exact":  # D_f at the solution from the breakpoints' prefix sums (no pass over V)
        point, _, value = bp.primal64(request, div, False, validate, with_value=True)
        value = torch.where((point.a == 0) & (point.b == 0), 0.0, value)
    else:  # the bound's value is not D_f: computed on the full rows
        point, value = bp.primal64(request, div, True, validate)[0], None
    p64 = q64 = None
    if value is None or dual or support == "any":
        p64, q64 = _rows64(p, q, bp.normalized)
    if value is None:
        a64, b64 = (x.reshape(p.shape[:-1]) for x in point[:2])
        value = f_divergence(mentored_distribution(p64, q64, a64, b64, validate=False), q64, div, validate=False)
    sol = MDSolution(*bp.point_to_output(*point), bp.to_output(value), bp.sd_acceptance)
    return _finish(sol, p64, q64, request, dual, div, support, on_infeasible)


def _scalar_row(p, q, budget: float, div, g, validate: bool) -> MDSolution:
    """One small CPU row by :func:`mdboost.md._scalar_rows.solve_row` (the values of the sorted route)."""
    rows = (p, q) if p.ndim == 1 else (p.reshape(-1), q.reshape(-1))
    a, b, acc, value, sd = _scalar_rows.solve_row(*rows, budget, div, g, validate)
    return _row_solution(a, b, acc, 0.0 if a == 0 and b == 0 else value, sd, p)


def _row_solution(a: float, b: float, acc: float, value: float, sd: float, p) -> MDSolution:
    """The :class:`MDSolution` of one row from Python floats: one tensor of ``p``'s dtype, viewed
    in the batch shape ``p.shape[:-1]`` (all ones), ``feasible`` True, ``off_support`` 0."""
    t = torch.tensor([a, b, acc, value, sd, 0.0], dtype=torch.float64).reshape((6,) + tuple(p.shape[:-1]))
    a_out, b_out = point_to_dtype(t[0], t[1], p.dtype)  # towards pi = q: the budget holds in p's dtype
    t = t.to(p.dtype).unbind(0)
    return MDSolution(a_out, b_out, t[2], t[3], t[4], torch.ones(p.shape[:-1], dtype=torch.bool), t[5])


def _one_solution(out, p) -> MDSolution:
    """The :class:`MDSolution` of one row from the floats ``(a, b, acceptance, D_f, tv)`` of
    :func:`mdboost.md._buckets.solve_one`: the clamps of :func:`solve_batch` and :func:`_finish`."""
    a, b, acc, value, tv = out
    return _row_solution(a, b, acc, value if not value < 0 else 0.0, min(max(1.0 - tv, 0.0), 1.0), p)


def _rows64(p, q, normalized: bool):  # [..., V] x2 -> float64 [..., V] x2
    """The float64 rows the solvers work on (normalized where they normalize)."""
    p64, q64 = p.to(torch.float64), q.to(torch.float64)
    if p.dtype != torch.float64:  # a ratio that overflows the input dtype counts as q_i = 0
        q64 = torch.where(torch.isinf(p / q) & (q > 0), 0.0, q64)
    if normalized:
        p64, q64 = p64 / p64.sum(-1, keepdim=True), q64 / q64.sum(-1, keepdim=True)
    return p64, q64


def _finish(sol: MDSolution, p64, q64, value, dual: bool, div, support: str, on_infeasible: str) -> MDSolution:
    """The optimum over all distributions if asked, the ``feasible`` mask, outputs in range.

    ``p64``, ``q64`` [..., V] float64: the rows solved on (needed only for ``dual`` or
    ``support="any"``); ``value``: the (validated) request.
    """
    a, b, acc, dv, off = sol.a, sol.b, sol.acceptance, sol.achieved_divergence, sol.off_support
    batch = a.shape
    request = None
    if dual or support == "any":
        request = check_budget("min_acceptance" if dual else "max_divergence", value, batch, a.device,
                               validate=False)
    if support == "any" and _support.zero_cost(div) < float("inf"):
        vocab = p64.shape[-1]
        ext = _support.extend(p64.reshape(-1, vocab), q64.reshape(-1, vocab), request.reshape(-1), div, dual)
        rows = ext.rows.reshape(batch)
        new = [*point_to_dtype(ext.a.reshape(batch), ext.b.reshape(batch), a.dtype),
               *(x.reshape(batch).to(a.dtype) for x in ext[3:])]  # a, b, acceptance, off_support
        pi = mentored_distribution(p64, q64, ext.a.reshape(batch), ext.b.reshape(batch), validate=False)
        pi = _support.add_off_support(pi, p64, q64, ext.off_support.reshape(batch))
        d_new = f_divergence(pi, q64, div, validate=False).to(dv.dtype)
        a, b, acc, off = (torch.where(rows, x, old) for x, old in zip(new, (a, b, acc, off)))
        dv = torch.where(rows, d_new, dv)
    feasible = sol.feasible
    if dual:  # the dual returns min(target, reachable maximum): below the target means infeasible
        feasible = acc.double() >= request - tolerance(acc.dtype).sum
        if on_infeasible == "raise" and not bool(feasible.all()):
            bad = tuple((~feasible).nonzero()[0].tolist())
            raise ValueError(
                f"min_acceptance={float(request[bad])!r} is above the largest reachable acceptance "
                f"{float(acc[bad])!r} at row {bad} ({int((~feasible).sum())} infeasible rows); on the "
                f"target's support it is 1 - p(q = 0) (support='any' lifts that restriction)")
    # rounding never leaves the ranges (docs/theory.md, section 9)
    return MDSolution(a, b, acc.clamp(0.0, 1.0), dv.clamp(min=0.0), sol.sd_acceptance, feasible, off)
