"""The exact primal of a few small CPU rows: each row's search in Python floats (docs/theory.md, section 4).

:func:`primal_point` searches a :class:`_Row` (one row's sorted sums as 1-D numpy float64
arrays and its scalars), given directly or read off a one-row
:class:`~mdboost.md.breakpoints.Breakpoints` (the rows the batched search loses to rounding);
:func:`primal_points` searches every row of a :class:`~mdboost.md.breakpoints.Breakpoints` one
by one (for :func:`mdboost.md._search.primal_point`: :func:`mdboost.md._router.scalar_search`,
exact mode).
The rows built from a pair itself or from the reduced pair of the linear-time solve are made by
:mod:`mdboost.md._scalar_rows`.

The search is the one of the array path, with its two searches in another form. The bracket:
a binary search over the A-breakpoints (``D_f`` at each on the B segment found by
``searchsorted``), then over the B-breakpoints inside the A segment found (as
``_locate.bracket_large``): ``O(log V)`` evaluations. Inside the segment, a bracketed secant
with a probe across the crossing and a bisection safeguard, down to the array refinement's
tolerance (``2^-50`` of the segment or a few ulps of ``m``), keeping the side ``D_f <= budget``.

Why: one row costs a fixed number of tiny array operations, and at ``V <= 2048`` their call
overhead is most of a ``solve`` call; here each evaluation of ``D_f`` is a few float operations.
Used for the built-in generators with a Python-float form (:attr:`Divergence.g_float
<mdboost.md.divergences.Divergence.g_float>`); the others, the bound
mode and larger batches take the array search. Tested equal to it (``tests/test_md_scalar_row.py``).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from mdboost.md._xp import NUMPY
from mdboost.md.divergences import Divergence

_INF = math.inf
_EPS = float(np.finfo(np.float64).eps)
_TOL_SEG = 2.0 ** -50  # of the segment's width, as the array refinement
MAX_ROUNDS = 128  # refinement rounds; a round that does not halve the bracket is followed by a bisection


class _Row:
    """One row's sorted sums (1-D numpy float64) and scalars, and ``D_f`` on its segments.

    The index conventions of :class:`~mdboost.md._segment.SortedSums`: ``cp[k]``, ``cq[k]`` sum the
    sorted positions ``< k`` (read for ``k <= n_lt``), ``rp[V - j]``, ``rq[V - j]`` those ``>= j``
    (read for ``j >= n_le``), so the arrays may stop where the search stops reading them.
    ``mid`` [V + 1] is the ``q_i g(r_i)`` prefix of :meth:`Breakpoints.prefix`; ``kb`` [n_lt + 1]
    the B-breakpoint values made monotone (``_search._small_b_knots`` up to ``n_lt``).
    """

    __slots__ = ("cp", "cq", "rp", "rq", "ratio", "mid", "v", "n_lt", "n_le", "j_max", "tv", "m_end", "g", "kb")

    def __init__(self, cp, cq, rp, rq, ratio, mid, n_lt, n_le, j_max, tv, m_end, g):
        self.cp, self.cq, self.rp, self.rq, self.ratio, self.mid = cp, cq, rp, rq, ratio, mid
        self.v, self.n_lt, self.n_le, self.j_max, self.tv, self.m_end = ratio.shape[0], n_lt, n_le, j_max, tv, m_end
        self.g = g
        kb = np.empty(n_lt + 1)
        np.multiply(ratio[:n_lt], cq[:n_lt], out=kb[:n_lt])
        np.subtract(kb[:n_lt], cp[:n_lt], out=kb[:n_lt])
        kb[n_lt] = tv
        self.kb = np.maximum.accumulate(kb, out=kb)

    @classmethod
    def of_breakpoints(cls, bp, div, g, row: int = 0) -> "_Row":
        """Row ``row`` of a :class:`~mdboost.md.breakpoints.Breakpoints` (numpy views of CPU rows; a
        host copy of that one row from other devices)."""
        i, s = row, bp.arrays()
        cp, cq, rp, rq, ratio, mid = (x[i].detach().cpu().numpy() for x in (s.cp, s.cq, s.rp, s.rq, s.ratio,
                                                                              bp.prefix(div)))
        counts = torch.cat([x[i] for x in (s.n_lt, s.n_le, s.j_max)]).tolist()
        tv, m_end = torch.cat([s.tv[i], s.m_end[i]]).tolist()
        with np.errstate(invalid="ignore", over="ignore"):
            return cls(cp, cq, rp, rq, ratio, mid, *counts, tv, m_end, g)

    def locate_k(self, m):
        """The B segment of ``m`` (``_locate.locate_k``): ``B = [0, k)``."""
        return min(max(int(self.kb.searchsorted(m)), 1), self.n_lt)

    def knot_a(self, j):
        """``m`` at the A-breakpoint ``a = r_j - 1`` for ``j`` in ``[n_le, j_max]`` (``Breakpoints.knot_a``)."""
        if j >= self.j_max:
            return self.m_end
        t = self.v - j
        m = self.rp.item(t) - self.ratio.item(j) * self.rq.item(t)
        return min(max(m, self.m_end), self.tv)

    def knot_b(self, k, m_lo, m_hi):
        """``m`` at the (monotone) B-breakpoint ``b = 1 - r_k``, within ``[m_lo, m_hi]``."""
        return min(max(self.kb.item(k), m_lo), m_hi)

    def segment(self, j, k):
        """``(pA, denA, offA, qA, loA, hiA, pB, denB, offB, qB, loB, hiB, rest)`` of ``A = [j, V)``, ``B = [0, k)``."""
        v, ratio = self.v, self.ratio.item
        q_a, p_a = self.rq.item(v - j), self.rp.item(v - j)
        q_b, p_b = self.cq.item(k), self.cp.item(k)
        r_j = ratio(min(j, v - 1)) if j < v else _INF
        lo_a = max(ratio(max(j - 1, 0)) - 1.0, 0.0) if j > self.n_le else 0.0
        hi_a = max(r_j - 1.0, lo_a)
        hi_b = min(max(1.0 - ratio(max(k - 1, 0)), 0.0), 1.0) if k >= 1 else 1.0
        lo_b = min(min(max(1.0 - ratio(min(k, v - 1)), 0.0), 1.0) if k < self.n_lt else 0.0, hi_b)
        rest = self.mid.item(k) + self.mid.item(j)
        return (p_a, q_a if q_a > 0 else _INF, -1.0 if q_a > 0 else 0.0, q_a, lo_a, hi_a,
                p_b, -q_b if q_b > 0 else _INF, 1.0 if q_b > 0 else 0.0, q_b, lo_b, hi_b, rest)

    @staticmethod
    def ab(m, seg):
        """``(a, b)`` at ``m`` on ``seg``, within the segment's range (``mdboost.md._segment.ab_on``)."""
        p_a, den_a, off_a, _, lo_a, hi_a, p_b, den_b, off_b, _, lo_b, hi_b, _ = seg
        return (min(max((p_a - m) / den_a + off_a, lo_a), hi_a),
                min(max((p_b + m) / den_b + off_b, lo_b), hi_b))

    def div(self, m, seg):
        """``D_f`` at ``m`` on ``seg`` (``mdboost.md._segment.divergence_on``, exact mode)."""
        p_a, den_a, off_a, q_a, lo_a, hi_a, p_b, den_b, off_b, q_b, lo_b, hi_b, rest = seg
        total = rest
        if q_a > 0:
            total += q_a * self.g(1.0 + min(max((p_a - m) / den_a + off_a, lo_a), hi_a))
        if q_b > 0:
            total += q_b * self.g(1.0 - min(max((p_b + m) / den_b + off_b, lo_b), hi_b))
        return total


def _bracket(row: _Row, budget):
    """``(m_lo, m_hi, seg)``: the segment holding the crossing of ``D_f = budget`` and its ends.

    ``D_f`` grows as ``m`` falls. First the A segment: the first A-breakpoint ``j`` in
    ``[n_le, j_max]`` with ``D_f > budget`` (``D_f`` at the curve's end exceeds the budget: the
    caller checked), then inside it the first B-breakpoint ``k`` with ``D_f <= budget``.
    """
    lo, hi = row.n_le, row.j_max
    while lo < hi:
        mid = (lo + hi) // 2
        m = row.knot_a(mid)
        if row.div(m, row.segment(mid, row.locate_k(m))) > budget:
            hi = mid
        else:
            lo = mid + 1
    j = lo
    m_lo = row.knot_a(j)
    m_hi = row.knot_a(j - 1) if j > row.n_le else row.tv
    lo, hi = row.locate_k(m_lo), row.locate_k(m_hi)
    while lo < hi:
        mid = (lo + hi) // 2
        if row.div(row.knot_b(mid, m_lo, m_hi), row.segment(j, mid)) <= budget:
            hi = mid
        else:
            lo = mid + 1
    k = lo
    top = row.knot_b(k, m_lo, m_hi)
    bot = row.knot_b(k - 1, m_lo, top) if k > 0 else m_lo
    return bot, top, row.segment(j, k)


def _refine(row: _Row, seg, lo, hi, budget):
    """The crossing of ``D_f = budget`` in ``[lo, hi]``, the ``D_f <= budget`` side (``_search.refine``).

    ``h = D_f - budget`` falls in ``m``. Each round evaluates the secant point ``x`` of the bracket
    (the midpoint if the previous round did not halve it), then a probe on the other side of the
    crossing at twice the secant's own error estimate ``|h(x)| / slope``, so that both ends of the
    bracket close in (the role of the array search's ladder); stops at the same tolerance.
    """
    h_hi = row.div(hi, seg) - budget
    if h_hi > 0:  # nothing fits: the answer is hi
        return hi
    h_lo = row.div(lo, seg) - budget
    if not h_lo > 0:  # everything fits: the answer is lo
        return lo
    tol = max((hi - lo) * _TOL_SEG, abs(hi) * (8 * _EPS))
    halve = False
    for _ in range(MAX_ROUNDS):
        width = hi - lo
        if width <= tol:
            break
        x = lo + width / 2 if halve else lo + width * (h_lo / (h_lo - h_hi))
        if not lo < x < hi:  # a secant at an end (or NaN): the midpoint
            x = lo + width / 2
        h = row.div(x, seg) - budget
        if h > 0:
            lo, h_lo = x, h
        else:
            hi, h_hi = x, h
        slope = (h_lo - h_hi) / (hi - lo)
        step = abs(h) / slope * 2 + tol / 4 if slope > 0 else width / 4
        y = x + step if h > 0 else x - step
        if lo < y < hi:
            h = row.div(y, seg) - budget
            if h > 0:
                lo, h_lo = y, h
            else:
                hi, h_hi = y, h
        halve = hi - lo > width / 2
    return hi


def _point(row: _Row, budget: float):
    """``(a, b, m, value)`` in Python floats: the search, the snap and the fallback of ``_search.primal_point``."""
    tv, m_end = row.tv, row.m_end
    if not budget > 0:  # pi = q (a NaN budget, unchecked, too)
        return 0.0, 0.0, tv, 0.0
    seg = row.segment(row.j_max, row.locate_k(m_end))
    if budget >= row.div(m_end, seg):  # the end fits: a one-point bracket on its segment
        m = m_end
    else:
        m_lo, m_hi, seg = _bracket(row, budget)
        m = _refine(row, seg, m_lo, m_hi, budget)
    # the snap of _search.snap: 1 - (1 - m) == m exactly, capped at tv
    acc = 1 - m
    if 1 - acc < m:
        acc = math.nextafter(acc, 0.0)
    if row.div(m, seg) > budget * (1 + 1e-12):  # rounding defeated the search: the curve's start
        return 0.0, 0.0, tv, 0.0
    m = min(1 - acc, max(tv, m))
    if m >= tv:
        return 0.0, 0.0, m, 0.0
    a, b = row.ab(m, seg)
    return a, b, m, max(row.div(m, seg), 0.0)


def lost(m: float, budget: float, tv: float, m_end: float) -> bool:
    """Whether a point at excess mass ``m`` is the curve's start that a search lost to rounding
    returns: a positive budget on a curve of more than one point has a feasible ``m < tv``
    (``D_f`` is continuous and 0 at the start)."""
    return budget > 0 and m >= tv > m_end


def primal_points(bp, budget: torch.Tensor, div: Divergence, g, min_budget: float):
    """:func:`primal_point` on every row of a CPU :class:`~mdboost.md.breakpoints.Breakpoints`:
    ``(a, b, m, value)`` as torch [N, 1] float64, or None where a row's budget is below
    ``min_budget`` (the array search's case) or a row's search is lost to rounding (:func:`lost`).
    Each row is searched alone, on the numpy views of its sums: the values of a batch of one."""
    budgets = budget.reshape(-1).tolist()
    if any(b < min_budget for b in budgets):
        return None
    sums, mid = bp.arrays(NUMPY), bp.prefix(div).numpy()
    n_lt, n_le, j_max = (x[:, 0].tolist() for x in (sums.n_lt, sums.n_le, sums.j_max))
    tv, m_end = sums.tv[:, 0].tolist(), sums.m_end[:, 0].tolist()
    out = []
    with np.errstate(invalid="ignore", over="ignore"):
        for i, b in enumerate(budgets):
            row = _Row(sums.cp[i], sums.cq[i], sums.rp[i], sums.rq[i], sums.ratio[i], mid[i], n_lt[i], n_le[i],
                       j_max[i], tv[i], m_end[i], g)
            point = _point(row, b)
            if lost(point[2], b, tv[i], m_end[i]):
                return None
            out.append(point)
    t = torch.tensor(out, dtype=torch.float64)  # [N, 4]
    return t[:, 0:1], t[:, 1:2], t[:, 2:3], t[:, 3:4]


def primal_point(src, budget: float, div: Divergence, g, with_value: bool = False, floats: bool = False):
    """:func:`mdboost.md._search.primal_point` for one row: ``(a, b, m, value)`` as torch [1, 1] float64.

    ``src``: a one-row :class:`~mdboost.md.breakpoints.Breakpoints` or a :class:`_Row`; with
    ``floats``, Python floats instead of tensors (``value`` then always given).
    """
    row = src if isinstance(src, _Row) else _Row.of_breakpoints(src, div, g)
    a, b, m, value = _point(row, budget)
    if floats:
        return a, b, m, value
    out = torch.tensor([[a], [b], [m], [value]], dtype=torch.float64)
    return out[0:1], out[1:2], out[2:3], out[3:4] if with_value else None
