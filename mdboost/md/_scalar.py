"""The exact primal search of one small CPU row in Python floats (used by :mod:`mdboost.md._search`).

The same search as :func:`mdboost.md._search.primal_point` for ``N = 1`` (docs/theory.md,
section 4): the bracket between neighbouring breakpoints of the sorted knot values, ``D_f`` at a
knot on the segment found by the same ``searchsorted`` rule, then the crossing inside the
segment, keeping the side with ``D_f <= budget``. Only the two searches differ in form: the
bracket is a binary search over the sorted knots (``O(log V)`` evaluations, where the array
search evaluates every 16th knot and then a stride), and the refinement a bracketed secant
with a probe across the crossing and a bisection safeguard (the array search evaluates ladders of probes per round).
Both stop at the same tolerance (``2^-50`` of the segment or a few ulps of ``m``).

Why: one row costs a fixed number of tiny array operations, and at ``V <= 2048`` their call
overhead is most of a ``solve`` call; here each evaluation of ``D_f`` is a few float operations.
Used for the built-in generators with a scalar twin (:func:`scalar_g`); the others, the bound
mode and batches take the array search. Tested equal to it (``tests/test_md_scalar_row.py``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from mdboost.md.divergences import GENERATORS, Divergence

_INF = math.inf
_EPS = float(np.finfo(np.float64).eps)
_TOL_SEG = 2.0 ** -50  # of the segment's width, as the array refinement
MAX_ROUNDS = 128  # refinement rounds; a round that does not halve the bracket is followed by a bisection


def _xlogx(z):
    return 0.0 if z == 0 else z * math.log(z)


def _f_kl(z):
    return _xlogx(z)


def _f_rkl(z):
    return _INF if z == 0 else -math.log(z)


def _f_hellinger(z):
    s = math.sqrt(z) - 1.0
    return s * s


def _f_pearson(z):
    s = z - 1.0
    return s * s


def _f_neyman(z):
    s = z - 1.0
    return _INF if z == 0 else s * s / z


def _f_tv(z):
    return abs(z - 1.0) / 2.0


def _f_js(z):
    w = 1.0 + z
    return (_xlogx(z) - (0.0 if w == 0 else w * math.log(w / 2.0))) / 2.0


# the generators of mdboost.md.divergences in Python floats (same values; inf where torch gives inf)
_TWINS = {GENERATORS[name].f: fn for name, fn in (
    ("kl", _f_kl), ("rkl", _f_rkl), ("hellinger", _f_hellinger), ("pearson", _f_pearson),
    ("neyman", _f_neyman), ("tv", _f_tv), ("js", _f_js))}


def _g_kl(z):  # g of the built-in kl: z log z - (z - 1), inf at z = inf (the asymptote)
    if z == 0:
        return 1.0
    out = z * math.log(z) - (z - 1.0)
    return out if out == out else _INF


def _g_rkl(z):  # g of the built-in rkl: -log z + (z - 1)
    if z == 0:
        return _INF
    out = -math.log(z) + (z - 1.0)
    return out if out == out else _INF


def scalar_g(div: Divergence):
    """``g(z)`` of ``div`` on a Python float (:meth:`Divergence.g`), or None without a scalar twin."""
    f = _TWINS.get(div.f)
    if f is None:
        return None
    for name, fast in (("kl", _g_kl), ("rkl", _g_rkl)):  # the two most used, in one call
        ref = GENERATORS[name]
        if (div.f, div.fprime_one, div.inf_slope, div.standardize) == (ref.f, ref.fprime_one, ref.inf_slope,
                                                                       ref.standardize):
            return fast
    slope = div.fprime_one if div.standardize else 0.0
    asym = div.inf_slope - div.fprime_one

    def g(z):
        try:
            out = f(z) - slope * (z - 1.0) if slope else f(z)
        except OverflowError:
            out = math.nan
        return asym * z if out != out else out  # NaN (inf - inf): the asymptote, as Divergence.g

    return g


class _Row:
    """One row's sorted sums as 1-D numpy views and Python scalars, and ``D_f`` on its segments."""

    def __init__(self, bp, div, g):
        sums = bp.arrays(_numpy_ns())
        self.cp, self.cq, self.rp, self.rq = sums.cp[0], sums.cq[0], sums.rp[0], sums.rq[0]
        self.ratio = sums.ratio[0]
        self.v = self.ratio.shape[0]
        self.n_lt, self.n_le, self.j_max = int(sums.n_lt[0, 0]), int(sums.n_le[0, 0]), int(sums.j_max[0, 0])
        self.tv, self.m_end = float(sums.tv[0, 0]), float(sums.m_end[0, 0])
        self.mid = bp.prefix(div).numpy()[0]
        self.g = g
        self._knots()

    def _knots(self):
        """``kb``, ``neg_ka`` (the monotone knot arrays of ``locate``) and the sorted knot values."""
        v, n_lt, n_le, j_max, tv, m_end = self.v, self.n_lt, self.n_le, self.j_max, self.tv, self.m_end
        idx = np.arange(v + 1)
        ratio = np.concatenate([self.ratio, self.ratio[-1:]])
        with np.errstate(invalid="ignore", over="ignore"):  # inf ratios times 0 sums: masked
            m_b = np.where(idx >= n_lt, tv, ratio * self.cq - self.cp)
            m_a = np.where(idx >= j_max, m_end, self.rp[::-1] - ratio * self.rq[::-1])
        self.kb = np.maximum.accumulate(np.where(idx > n_lt, _INF, m_b))
        m_a = np.minimum(np.maximum(m_a, m_end), tv)
        self.neg_ka = np.maximum.accumulate(np.where(idx < n_le, -_INF, np.where(idx > j_max, _INF, -m_a)))
        m_b = np.minimum(np.maximum(m_b, m_end), tv)
        knots = np.concatenate([m_a[n_le:max(j_max, n_le)], m_b[1:max(n_lt, 1)]])
        knots.sort()
        self.knots = knots

    def locate(self, m):
        k = min(max(int(self.kb.searchsorted(m)), 1), self.n_lt)
        j = min(max(int(self.neg_ka.searchsorted(-m)), self.n_le), self.j_max)
        return j, k

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
        a, b = self.ab(m, seg)
        q_a, q_b = seg[3], seg[9]
        total = (q_a * self.g(1.0 + a) if q_a > 0 else 0.0) + (q_b * self.g(1.0 - b) if q_b > 0 else 0.0)
        return total + seg[12]

    def div_at(self, m):
        return self.div(m, self.segment(*self.locate(m)))


def _numpy_ns():
    from mdboost.md._xp import NUMPY
    return NUMPY


def _bracket(row: _Row, budget):
    """``(m_lo, m_hi)``: the neighbouring sorted knots around the crossing (``_search._bracket_small``)."""
    knots, count = row.knots, row.knots.shape[0]
    if not count:  # no knot: the curve is one segment (the reference evaluates tv alone)
        big = row.div_at(row.tv) > budget
        return (row.tv, row.tv) if big else (row.m_end, row.tv)
    lo, hi = 0, count  # D_f falls along the ascending knots: first index with D_f <= budget
    while lo < hi:
        mid = (lo + hi) // 2
        if row.div_at(float(knots[mid])) > budget:
            lo = mid + 1
        else:
            hi = mid
    m_lo = max(row.m_end, float(knots[lo - 1]) if lo > 0 else -_INF)
    m_hi = min(row.tv, float(knots[lo]) if lo < count else _INF)
    return min(m_lo, m_hi), m_hi


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


def primal_point(bp, budget: float, div: Divergence, g, with_value: bool = False):
    """:func:`mdboost.md._search.primal_point` for one row: ``(a, b, m, value)`` as torch [1, 1] float64."""
    row = _Row(bp, div, g)
    tv, m_end = row.tv, row.m_end
    k_end = min(max(int(row.kb.searchsorted(m_end)), 1), row.n_lt)
    seg_end = row.segment(row.j_max, k_end)
    d_end = row.div(m_end, seg_end)
    at_end = budget >= d_end and budget > 0  # the end fits: a one-point bracket on its segment
    if budget <= 0:
        m, seg = tv, row.segment(*row.locate(tv))
    elif at_end:
        m, seg = m_end, seg_end
    else:
        m_lo, m_hi = _bracket(row, budget)
        seg = row.segment(*row.locate((m_lo + m_hi) / 2))
        m = _refine(row, seg, m_lo, m_hi, budget)
    # the snap of _search.snap: 1 - (1 - m) == m exactly, capped at tv
    acc = 1 - m
    if 1 - acc < m:
        acc = math.nextafter(acc, 0.0)
    snapped = min(1 - acc, max(tv, m))
    failed = row.div(m, seg) > budget * (1 + 1e-12)
    m = tv if failed else snapped
    at_sd = m >= tv
    a, b = (0.0, 0.0) if at_sd else row.ab(m, seg)
    value = None
    if with_value:
        value = 0.0 if failed or at_sd else max(row.div(m, seg), 0.0)
        value = torch.tensor([[value]], dtype=torch.float64)
    out = torch.tensor([[a], [b], [m]], dtype=torch.float64)
    return out[0:1], out[1:2], out[2:3], value
