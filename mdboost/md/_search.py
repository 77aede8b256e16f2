"""Batched searches over the breakpoints of C(p, q) (used by :mod:`mdboost.md.breakpoints`).

Searches run on every row at once (the segment searches a fixed number of iterations; the
in-segment refinement checks convergence once per round):

- :func:`primal`: the point where ``D_f`` crosses the budget (``D_f`` grows along the curve,
  docs/theory.md section 4). First the bracket, the pair of neighbouring breakpoints around the
  crossing. For small vocabularies (:func:`mdboost.md._router.small_bracket`, e.g. a top-k restriction, Lemma 6.1)
  :func:`_bracket_small` evaluates ``D_f`` at every ``STRIDE``-th A-breakpoint and B-breakpoint
  (two sorted runs), then at every breakpoint of the two strides straddling the crossing; above,
  :func:`mdboost.md._locate.bracket_large` runs the fanout search over the A-breakpoints, then
  over the B-breakpoints inside. Inside the segment ``D_f`` is an ``O(1)`` closed form
  (:mod:`mdboost.md._segment`); :func:`refine` finds the crossing by a bracketed, safeguarded
  secant search (a first uniform grid, then secant + ladder + midpoint rounds) down to 2^-50 of
  the segment, keeping the side with ``D_f <= budget``.

The small bracket and the refinement are written once over an array namespace ``xp``
(:mod:`mdboost.md._xp`): numpy views on CPU (a tiny op costs a fraction of torch's), torch on
other devices or with autograd, by the rule of :func:`mdboost.md._xp.namespace_for`. The large
bracket and the segment location of a point (:mod:`mdboost.md._locate`) run in torch.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from mdboost.md import _scalar
from mdboost.md._router import NOISE_BUDGET, rescue_rows, scalar_search, small_bracket
from mdboost.md._locate import b_knots, bracket_large, locate_j, locate_k
from mdboost.md._segment import Segment, ab_on, divergence_on, make_segment
from mdboost.md._xp import NUMPY, namespace_for

GRID = 32  # refine: uniform points of its first round
MAX_ROUNDS = 64  # refine: the midpoint alone halves the bracket, so 2^-50 is reached well before
LADDER = 12  # refine: probes at x +- width * 4^-i, i = 1..LADDER, around the secant point x
_LADDER = 4.0 ** -torch.arange(1, LADDER + 1, dtype=torch.float64)
_PROBES = torch.cat([-_LADDER, _LADDER, torch.zeros(1, dtype=torch.float64)])  # [2 LADDER + 1]
_GRID = torch.linspace(0, 1, GRID + 1, dtype=torch.float64)
_EPS = torch.finfo(torch.float64).eps
STRIDE = 16  # small bracket: coarse stride over the A-breakpoints and over the B-breakpoints


def _bracket_small(xp, sums, kb, neg_ka, k_end, budget, div, bound, mid):
    """``(m_lo, m_hi, j, k, d_end)``: the neighbouring breakpoints around the crossing.

    ``D_f`` decreases in ``m``. The A-breakpoints (``-neg_ka[j]``, non-increasing in ``j``) and the
    B-breakpoints (``kb[k]``, non-decreasing in ``k``) are two sorted runs: ``D_f`` is evaluated at
    every ``STRIDE``-th of each (a breakpoint's own index gives one of its two sets, one
    ``searchsorted`` the other), then at every breakpoint of the two strides that straddle the
    crossing (no other breakpoint lies strictly between the kept neighbours). The first round
    also gives ``d_end`` [N, 1], ``D_f`` at the curve's end on its segment ``(j_max, k_end)``;
    rows whose ``budget`` is outside ``(0, d_end)`` do not use the bracket (:func:`_primal`
    overrides them).
    """
    lo_k = xp.clip(sums.n_lt, None, 1)  # B-breakpoints are k in [1, n_lt) (none if n_lt = 0)

    def a_points(j):  # A-breakpoints j in [n_le, j_max] (j_max: the end): (m, j, k)
        j = xp.minimum(xp.maximum(j, sums.n_le), sums.j_max)
        m = -xp.take(neg_ka, j)
        return m, j, xp.minimum(xp.maximum(xp.searchsorted(kb, m), lo_k), sums.n_lt)

    def b_points(k):  # B-breakpoints k in [1, n_lt] (n_lt: the start, m = tv)
        k = xp.minimum(xp.maximum(k, lo_k), sums.n_lt)
        m = xp.minimum(xp.maximum(xp.take(kb, k), sums.m_end), sums.tv)
        return m, xp.minimum(xp.maximum(xp.searchsorted(neg_ka, -m), sums.n_le), sums.j_max), k

    def evaluate(*groups):  # D_f at the points of every group, in one call
        m, j, k = (xp.concatenate(x, axis=-1) for x in zip(*groups))
        return m, divergence_on(xp, m, make_segment(xp, sums, j, k, mid, bound), div, bound)

    def kept(m, d, m_lo, m_hi):  # the tightest neighbours of the crossing among the points
        big = d > budget
        m_lo = xp.maximum(m_lo, xp.amax(xp.where(big, m, -math.inf), axis=-1, keepdims=True))
        return m_lo, xp.minimum(m_hi, xp.amin(xp.where(big, math.inf, m), axis=-1, keepdims=True))

    n_a = int(xp.amax(sums.j_max - sums.n_le)) + 1  # A-breakpoints per row, the end included
    n_b = int(xp.amax(sums.n_lt))  # B-breakpoints per row, the start included
    steps_a = xp.arange(n_a + STRIDE - 1, sums.ratio, STRIDE)  # [S_A]: ceil(n_a / STRIDE) samples
    steps_b = xp.arange(n_b + STRIDE - 1, sums.ratio, STRIDE)
    ma, ja, ka = a_points(sums.n_le + steps_a)  # [N, S_A]
    mb, jb, kb_ = b_points(lo_k + steps_b)  # [N, S_B]
    end = (sums.m_end, sums.j_max, k_end)
    m, d = evaluate((ma, ja, ka), (mb, jb, kb_), end)
    d_end = d[:, -1:]
    m_lo, m_hi = kept(m[:, :-1], d[:, :-1], sums.m_end, sums.tv)
    m_lo = xp.minimum(m_lo, m_hi)
    # the samples are monotone: the A ones at or above m_hi are a prefix, the B ones at or below m_lo too;
    # the breakpoints strictly inside (m_lo, m_hi) lie between the last of that prefix and the next sample
    s_a = xp.sum(ma >= m_hi, axis=-1, keepdims=True)  # [N, 1]
    s_b = xp.sum(mb <= m_lo, axis=-1, keepdims=True)
    fine = xp.arange(STRIDE + 1, sums.ratio)  # [STRIDE + 1]
    fa = a_points(sums.n_le + (s_a - 1) * STRIDE + fine)
    fb = b_points(lo_k + (s_b - 1) * STRIDE + fine)
    m_lo, m_hi = kept(*evaluate(fa, fb), m_lo, m_hi)
    m_lo = xp.minimum(m_lo, m_hi)
    mid_m = (m_lo + m_hi) / 2
    k = xp.minimum(xp.maximum(xp.searchsorted(kb, mid_m), lo_k), sums.n_lt)
    j = xp.minimum(xp.maximum(xp.searchsorted(neg_ka, -mid_m), sums.n_le), sums.j_max)
    return m_lo, m_hi, j, k, d_end


def _a_knots(xp, sums):
    """The negated A-breakpoint values made monotone [N, V + 1]: ``-knot_a(j)`` for ``j`` in
    ``[n_le, j_max]`` (``-m_end`` at ``j_max``) as a running maximum, ``-inf`` before, ``+inf`` after."""
    n, v = sums.ratio.shape
    if xp is NUMPY:  # the same values in fewer numpy calls (in place)
        ratio, idx, inf = sums.ratio, np.arange(v + 1), math.inf
        m_a = np.empty((n, v + 1))  # knot_a at every index: rp[V - i] - r_i rq[V - i]
        np.multiply(ratio, sums.rq[:, v:0:-1], out=m_a[:, :v])
        np.subtract(sums.rp[:, v:0:-1], m_a[:, :v], out=m_a[:, :v])
        np.copyto(m_a, sums.m_end, where=idx >= sums.j_max)  # column V included (j_max <= V)
        np.maximum(m_a, sums.m_end, out=m_a)
        np.minimum(m_a, sums.tv, out=m_a)
        neg_ka = np.negative(m_a, out=m_a)
        np.copyto(neg_ka, inf, where=idx > sums.j_max)
        np.copyto(neg_ka, -inf, where=idx < sums.n_le)
        return _cummax_np(neg_ka)
    idx = xp.arange(v + 1, sums.ratio)  # [V + 1], broadcast against the [N, 1] counts
    ratio = xp.concatenate([sums.ratio, sums.ratio[:, -1:]], axis=-1)  # knot_a at every index, by slices
    m_a = xp.where(idx >= sums.j_max, sums.m_end, xp.flip(sums.rp) - ratio * xp.flip(sums.rq))  # [N, V + 1]
    m_a = xp.minimum(xp.maximum(m_a, sums.m_end), sums.tv)
    return xp.cummax(xp.where(idx < sums.n_le, -math.inf, xp.where(idx > sums.j_max, math.inf, -m_a)))


def _cummax_np(x: np.ndarray) -> np.ndarray:
    """``np.maximum.accumulate(x, -1)`` of a float64 [N, W] array by torch's cummax (the same
    values, NaN propagating alike; several times faster than numpy's along rows)."""
    return torch.cummax(torch.from_numpy(x), -1).values.numpy()


def _small_b_knots(xp, sums):
    """Monotone B-breakpoint values [N, V + 1] for ``searchsorted`` (``+inf`` after ``n_lt``)."""
    if xp is NUMPY:  # the same values in fewer numpy calls (in place, no [N, V + 1] concatenation)
        n, v = sums.ratio.shape
        kb = np.empty((n, v + 1))
        np.multiply(sums.ratio, sums.cq[:, :v], out=kb[:, :v])
        np.multiply(sums.ratio[:, -1], sums.cq[:, v], out=kb[:, v])
        kb -= sums.cp
        idx = np.arange(v + 1)
        np.copyto(kb, sums.tv, where=idx == sums.n_lt)
        np.copyto(kb, math.inf, where=idx > sums.n_lt)
        return _cummax_np(kb)
    idx = xp.arange(sums.ratio.shape[1] + 1, sums.ratio)
    ratio = xp.concatenate([sums.ratio, sums.ratio[:, -1:]], axis=-1)
    m_b = xp.where(idx >= sums.n_lt, sums.tv, ratio * sums.cq - sums.cp)
    return xp.cummax(xp.where(idx > sums.n_lt, math.inf, m_b))


def refine(xp, seg: Segment, lo, hi, budget, div, bound: bool):
    """Bracketed secant search for the crossing inside one segment; returns the ``D <= budget`` side.

    ``h(m) = D(m) - budget`` decreases in ``m``; the bracket ``[lo, hi]`` keeps ``h(lo) > 0 >= h(hi)``.
    The first round evaluates a uniform grid of ``GRID + 1`` points (ends included: a segment that
    fits entirely collapses to ``lo``, one that does not fit at all to ``hi``). Each later round
    evaluates, in one batched call, the secant point ``x`` of the bracket, a ladder
    ``x +- (hi - lo) 4^-i`` (``i = 1..LADDER``) and the midpoint, and keeps the tightest bracket:
    its width is then within a factor 4 of the secant's error, so the next secant is much better
    (superlinear, like the secant method), while the midpoint guarantees at least halving.
    Stops once every row is within ``2^-50`` of its segment or a few ulps of ``m``.
    All arrays [N, 1] float64 in the namespace ``xp``.
    """
    tol = xp.maximum((hi - lo) * 2.0 ** -50, xp.abs(hi) * (8 * _EPS))
    h_lo, h_hi = xp.ones_like(lo), -xp.ones_like(hi)  # placeholders until a point is kept
    probes, grid = xp.constant(_PROBES, lo), xp.constant(_GRID, lo)
    for rnd in range(MAX_ROUNDS):
        width = hi - lo
        if rnd == 0:
            pts = xp.where(grid < 1, lo + width * grid, hi)  # [N, GRID + 1], exact ends
        else:
            if bool(xp.all(width <= tol)):
                break
            x = lo + width * (h_lo / (h_lo - h_hi))
            x = xp.where(xp.isfinite(x), x, lo + width / 2)
            pts = xp.clip(xp.concatenate([x + width * probes, lo + width / 2], axis=-1), lo, hi)  # [N, 2 LADDER + 2]
        h = divergence_on(xp, pts, seg, div, bound) - budget
        above = h > 0
        cand_lo, cand_hi = xp.where(above, pts, -math.inf), xp.where(above, math.inf, pts)
        i_lo = xp.argmax(cand_lo, axis=-1, keepdims=True)
        i_hi = xp.argmin(cand_hi, axis=-1, keepdims=True)
        new_lo, new_hi = xp.take(cand_lo, i_lo), xp.take(cand_hi, i_hi)
        take_lo, take_hi = new_lo >= lo, new_hi <= hi
        lo, h_lo = xp.where(take_lo, new_lo, lo), xp.where(take_lo, xp.take(h, i_lo), h_lo)
        hi, h_hi = xp.where(take_hi, new_hi, hi), xp.where(take_hi, xp.take(h, i_hi), h_hi)
        if rnd == 0:
            hi = xp.where(xp.all(above, axis=-1, keepdims=True), lo, hi)  # nothing fits: the answer is hi
            lo = xp.where(xp.any(above, axis=-1, keepdims=True), lo, hi)  # everything fits: the answer is lo
    return hi


def primal(bp, budget: torch.Tensor, div, bound: bool, xp=None, with_value: bool = False, bracket=None):
    """Largest-acceptance point with ``D_f`` (or its bound) ``<= budget``; budget of shape [N, 1].

    ``xp`` is the array namespace of the small bracket and the refinement (default: the rule of
    :func:`mdboost.md._xp.namespace_for`); ``bracket`` forces ``"small"`` or ``"large"``
    (:func:`mdboost.md._router.small_bracket`). Returns, as torch tensors, the excess mass ``m``
    [N, 1] float64, the :class:`Segment` of its point and, if ``with_value``, ``D_f`` (or the
    bound) at ``m`` on that segment [N, 1] (else None).
    """
    xp = namespace_for(bp.ratios, bp.namespace if xp is None else xp)
    with xp.errstate():
        m, seg = _primal(xp, bp, xp.asarray(budget.to(torch.float64)), div, bound, bracket)
        value = xp.to_torch(divergence_on(xp, m, seg, div, bound)) if with_value else None
    return xp.to_torch(m), Segment(*(None if x is None else xp.to_torch(x) for x in seg)), value


def snap(xp, m, tv):
    """The smallest ``m' >= m`` with ``1 - (1 - m') == m'`` exactly (capped at ``tv``).

    The acceptance ``1 - m'`` of a primal point then gives back the same ``m'`` in the dual
    (:meth:`~mdboost.md.breakpoints.Breakpoints.for_acceptance`), so both return the same
    ``(a, b)`` even where ``a`` is ill-conditioned in ``m``; ``D_f`` does not grow (it decreases in ``m``).
    """
    acc = 1 - m
    acc = xp.where(1 - acc < m, xp.nextafter(acc, xp.zeros_like(acc)), acc)
    return xp.minimum(1 - acc, xp.maximum(tv, m))


def primal_point(bp, budget: torch.Tensor, div, bound: bool, with_value: bool = False, scalar=None, bracket=None,
                 xp=None):
    """:func:`primal` finished in the same namespace: ``(a, b, m, value)`` as torch [N, 1] float64.

    The search keeps the side with ``D <= budget``; where rounding defeated it (extreme ratios
    the float64 sums cannot resolve), a small row is searched again in Python floats
    (:func:`_rescue_rows`), then takes the bound search's point if its ``D_f`` fits
    (:func:`_bound_fallback`), else falls back to the curve's start (``pi = q``).
    ``m`` is snapped (:func:`snap`); ``(a, b)`` are exactly 0 at ``m >= tv``; ``value`` is
    ``D_f`` (or the bound) at the point, 0 at the start, None unless ``with_value``.
    A few small CPU rows of the exact mode are searched one by one in Python floats
    (:func:`mdboost.md._scalar.primal_points`, :func:`mdboost.md._router.scalar_search`);
    ``scalar=False`` takes the array search (and no rescue), ``bracket`` forces its bracket and
    ``xp`` its namespace (default: the one ``bp`` was built with, else
    :func:`mdboost.md._xp.namespace_for`).
    """
    xp = namespace_for(bp.ratios, bp.namespace if xp is None else xp)
    if scalar is not False and scalar_search(bp.ratios.shape[0], bp.vocab, bound, xp):
        g = div.g_float
        points = None if g is None else _scalar.primal_points(bp, budget, div, g, NOISE_BUDGET)
        if points is not None:
            return points if with_value else (*points[:3], None)
        # a budget at the rounding level of D_f, or a row lost to rounding: the array search, its
        # rescue and the bound fallback below
    with xp.errstate():
        sums = bp.arrays(xp)
        b = xp.asarray(budget.to(torch.float64))
        m, seg = _primal(xp, bp, b, div, bound, bracket)
        snapped = snap(xp, m, sums.tv)
        d = divergence_on(xp, xp.concatenate([m, snapped], axis=-1), seg, div, bound)  # [N, 2]: one call
        failed = d[:, :1] > b * (1 + 1e-12)
        m = xp.where(failed, sums.tv, snapped)
        ab = ab_on(xp, m, seg)
        at_sd = m >= sums.tv
        a, b_out = xp.where(at_sd, 0.0, ab[0]), xp.where(at_sd, 0.0, ab[1])
        value = None
        value = xp.where(failed | at_sd, 0.0, xp.maximum(d[:, 1:], 0.0))  # D_f at the snapped point
        if not bound and bool(failed.any()):  # a host read off the CPU
            if scalar is not False and rescue_rows(bp.vocab):
                _rescue_rows(bp, b, div, failed[:, 0], (a, b_out, m, value))
            lost = failed & (m >= sums.tv)  # still at the start
            if bool(lost.any()):
                _bound_fallback(xp, bp, b, div, lost, (a, b_out, m, value), bracket)
        value = xp.to_torch(value) if with_value else None
    return xp.to_torch(a), xp.to_torch(b_out), xp.to_torch(m), value


def _bound_fallback(xp, bp, budget, div, lost, out, bracket=None) -> None:
    """Rows every exact search lost to rounding take the bound search's point where ``D_f``, read
    exactly at that point, fits the budget (else they keep the curve's start).

    The Theorem 3.12 bound is at least ``D_f``, so its point is feasible in exact arithmetic and
    no worse than the start; where ``D_f`` changes by many orders of magnitude within float64's
    resolution of ``m`` (``q`` down to subnormals), the exact crossing cannot be represented while
    the bound's search still lands on a fitting point (docs/theory.md, section 9). ``lost`` [N, 1]
    bool and ``out`` ``(a, b, m, value)`` [N, 1] of the namespace ``xp``, overwritten in place.
    """
    m_b, _ = _primal(xp, bp, budget, div, True, bracket)
    m_t = xp.to_torch(snap(xp, m_b, bp.arrays(xp).tv))
    j, k, tv = locate_j(bp, m_t), locate_k(bp, m_t), bp.arrays().tv
    a_t, b_t = bp.ab(m_t, bp.segment(j, k, None, False), tv)
    d_t = bp.div_at(m_t, j, k, div, False)
    ok = xp.to_torch(lost) & (m_t < tv) & (d_t <= xp.to_torch(budget) * (1 + 1e-12))
    ok_x = xp.asarray(ok)
    for dst, src in zip(out, (a_t, b_t, m_t, d_t.clamp(min=0.0))):
        dst[...] = xp.where(ok_x, xp.asarray(src), dst)


def _rescue_rows(bp, budget, div, failed, out) -> None:
    """Rows where rounding defeated the array search: solved again one by one by the Python-float
    search (:mod:`mdboost.md._scalar`), whose segments are evaluated from their own breakpoints.

    A segment's closed form divides by its ``A`` (or ``B``) mass; where that mass is tiny beside
    the excess ``m`` (``q`` down to subnormals), the form evaluated at the segment's far end can be
    off by many orders of magnitude, and the array search then finds no feasible point inside.
    ``out``: the ``(a, b, m, value)`` [N, 1] arrays of the search's namespace, overwritten in place
    on those rows (rows the scalar search also loses keep the curve's start). Off the CPU each such
    row is copied to the host for its search (they are rare: extreme inputs).
    """
    g = div.g_float
    if g is None:
        return
    rows = failed.nonzero()[0].tolist() if isinstance(failed, np.ndarray) else failed.nonzero()[:, 0].tolist()
    for i in rows:
        if float(budget[i, 0]) < NOISE_BUDGET:  # the scalar search's own limit
            continue
        row = _scalar.primal_point(_scalar._Row.of_breakpoints(bp, div, g, i), float(budget[i, 0]), div, g, True,
                                   floats=True)
        for dst, x in zip(out, row):
            dst[i, 0] = x


def _primal(xp, bp, budget, div, bound, bracket=None):
    sums = bp.arrays(xp)
    mid = xp.asarray(bp.mass_prefix() if bound else bp.prefix(div))
    small = small_bracket(bp.vocab, bracket)
    kb_torch = None if small else b_knots(bp)
    kb = _small_b_knots(xp, sums) if small else xp.asarray(kb_torch)
    k_end = xp.minimum(xp.clip(xp.searchsorted(kb, sums.m_end), 1, None), sums.n_lt)
    if small:  # D_f at the end comes with the bracket's first round
        m_lo, m_hi, j, k, d_end = _bracket_small(xp, sums, kb, _a_knots(xp, sums), k_end, budget, div, bound, mid)
        inner = xp.where((budget > 0) & (budget < d_end), budget, d_end / 2)  # keeps the search well posed
    else:
        d_end = divergence_on(xp, sums.m_end, make_segment(xp, sums, sums.j_max, k_end, mid, bound), div, bound)
        inner = xp.where((budget > 0) & (budget < d_end), budget, d_end / 2)
        m_lo, m_hi, (j, k) = bracket_large(bp, xp.to_torch(inner), div, bound, kb_torch)
        m_lo, m_hi, j, k = (xp.asarray(x) for x in (m_lo, m_hi, j, k))
    at_end = (budget >= d_end) & (budget > 0)  # the end fits: a one-point bracket on its segment
    m_lo, m_hi = xp.where(at_end, sums.m_end, m_lo), xp.where(at_end, sums.m_end, m_hi)
    j, k = xp.where(at_end, sums.j_max, j), xp.where(at_end, k_end, k)
    seg = make_segment(xp, sums, j, k, mid, bound)
    m = refine(xp, seg, m_lo, m_hi, xp.where(at_end, budget, inner), div, bound)
    m = xp.where(budget <= 0, sums.tv, xp.where(at_end, sums.m_end, m))
    if bound:
        seg = _tight_bound_segment(xp, sums, kb, m, seg, budget, div, mid)
    return m, seg


def _tight_bound_segment(xp, sums, kb, m, seg, budget, div, mid):
    """The bound's segment at a breakpoint where the Theorem 3.12 bound jumps (bound mode only).

    Along the curve the bound jumps up at every breakpoint (a token leaving ``A`` or ``B`` for
    ``M`` trades ``g(1 + a)`` or ``g(1 - b)`` for their maximum), so where the budget lies inside
    a jump the crossing is the breakpoint itself, evaluated with the token still in its ``A``
    (``B``) set: the segment on the start's side. The refinement's segment is the one beyond,
    where the same point's bound exceeds the budget (the primal then fell back to ``pi = q``).
    Rows where the bound at ``m`` on ``seg`` exceeds ``budget`` take that segment (``A`` = the
    sorted positions with ``knot_a <= m``, ``B`` those with ``knot_b <= m``) where it fits.
    """
    over = divergence_on(xp, m, seg, div, True) > budget
    if not bool(xp.any(over)):
        return seg
    j = xp.minimum(xp.maximum(xp.searchsorted(_a_knots(xp, sums), -m), sums.n_le), sums.j_max)
    k = xp.searchsorted(kb, xp.nextafter(m, xp.zeros_like(m) + math.inf))  # knot_b <= m
    k = xp.minimum(xp.maximum(k, xp.clip(sums.n_lt, None, 1)), sums.n_lt)
    tight = make_segment(xp, sums, j, k, mid, True)
    use = over & (divergence_on(xp, m, tight, div, True) <= budget)
    return Segment(*(None if x is None else xp.where(use, x, y) for x, y in zip(tight, seg)))
