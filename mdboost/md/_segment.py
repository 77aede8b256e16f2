"""One segment of the curve C(p, q): its constants and ``D_f`` on it, in any array namespace.

Between two neighbouring breakpoints the sets ``A``, ``B``, ``M`` of docs/theory.md (section 4)
are fixed, so ``(a, b)`` and ``D_f`` are closed forms in the excess mass ``m``: ``O(1)`` per
point once :func:`make_segment` has read the segment's sums. The same functions serve the
torch queries of :class:`mdboost.md.breakpoints.Breakpoints` and the numpy rounds of the exact
primal search (:mod:`mdboost.md._search`, namespaces in :mod:`mdboost.md._xp`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from mdboost.md.divergences import Divergence

# the stacked (A, B) rows of a segment: SIGN = (-1, 1) (how m enters each row), AB_HIGH = (inf, 1)
_SIGN_HIGH = torch.tensor([[-1.0, 1.0], [math.inf, 1.0]], dtype=torch.float64)
_CONSTS: dict = {}


def _consts(xp, like):
    """``(SIGN, AB_HIGH, 0, -SIGN)`` in ``xp``, shaped [2, 1, ...] to broadcast against [2, *like.shape]."""
    key = (xp.name, xp.device(like), like.ndim)
    if key not in _CONSTS:
        c = xp.constant(_SIGN_HIGH, like).reshape((2, 2) + (1,) * like.ndim)
        _CONSTS[key] = (c[0], c[1], xp.zeros_like(c[0]), -c[0])
    return _CONSTS[key]


class Segment(NamedTuple):
    """Constants of one segment of C(p, q): ``A`` = sorted positions ``[j, V)``, ``B`` = ``[0, k)``.

    float64 arrays of one namespace (torch tensors or numpy arrays; :mod:`mdboost.md._xp`). ``S``
    is the shape of ``j`` ([N, ...]); the stacked fields hold the A row, then the B row. On the
    segment, at excess mass ``m`` (docs/theory.md, section 4),
    ``a = (p(A) - m) / q(A) - 1`` and ``b = 1 - (p(B) + m) / q(B)``, clamped to the segment's
    own range (``lo``, ``hi``: the values of ``a`` and ``b`` at its two breakpoints, inside
    ``a >= 0`` and ``0 <= b <= 1``); :func:`ab_on` computes both rows in one expression. The clamp
    to the segment keeps ``(a, b)`` consistent with the sets ``A``, ``B`` where ``m`` cannot
    resolve them: with a tiny ``q(A)`` (ratios ``p_i / q_i`` far above 1) the rounding of ``m``
    is a huge error in ``a`` but only an ulp of mass (docs/theory.md, section 9).
    """

    ends: object  # [2, *S]: (p(A), p(B))
    den: object  # [2, *S]: (q(A), -q(B)), inf for an empty set (the B row negated: one expression)
    q: object  # [2, *S]: (q(A), q(B))
    offset: object  # [2, *S]: (-1, 1), 0 for an empty set (so that an empty A or B gives a = 0 or b = 0)
    rest: object  # [*S] or None: sum of q_i g(r_i) over M (exact), q(M) (Thm 3.12 bound), None (no divergence)
    lo: object  # [2, *S]: the smallest (a, b) of the segment
    hi: object  # [2, *S]: the largest (a, b) of the segment


class SortedSums(NamedTuple):
    """The sorted sums of :class:`~mdboost.md.breakpoints.Breakpoints` in one array namespace (numpy views
    share the memory).

    Its public view of the structure (:meth:`~mdboost.md.breakpoints.Breakpoints.arrays`): sorted
    positions count from the smallest ratio ``r_i = p_i / q_i``; the counts are per row.
    """

    cp: object  # [N, V + 1] float64: sum_{i < k} p_i at index k
    cq: object  # [N, V + 1] float64: sum_{i < k} q_i
    rp: object  # [N, V + 1] float64: sum_{i >= j} p_i at index V - j
    rq: object  # [N, V + 1] float64: sum_{i >= j} q_i at index V - j
    ratio: object  # [N, V] float64: r_i (inf where q_i = 0 < p_i)
    n_lt: object  # [N, 1] long: number of r < 1
    n_le: object  # [N, 1] long: number of r <= 1
    j_max: object  # [N, 1] long: the last A segment (the end)
    tv: object  # [N, 1] float64: TV(p, q), the excess mass at the start
    m_end: object  # [N, 1] float64: p(q = 0), the excess mass at the end
    q: object  # [N, V] float64: q_i by ratio (0 where the ratio overflows the input dtype)
    n_fin: object  # [N, 1] long: number of finite r


def make_segment(xp, sums: SortedSums, j, k, mid=None, bound: bool = False) -> Segment:
    """The :class:`Segment` of ``A = [j, V)``, ``B = [0, k)`` (``j``, ``k`` long [N, ...] in ``xp``).

    ``rest`` is ``q(M)`` if ``bound`` (read from the anchored mass sums ``mid`` if given, see
    :meth:`~mdboost.md.breakpoints.Breakpoints.mass_prefix`), else the M-set sum read from
    ``mid`` (see :meth:`~mdboost.md.breakpoints.Breakpoints.prefix`) if given, else None. With numpy, call it
    inside ``xp.errstate()``.
    """
    if xp.name == "numpy":
        return _make_segment_np(xp, sums, j, k, mid, bound)
    vocab = sums.ratio.shape[1]
    qb = xp.take(sums.cq, k)
    q = xp.stack2(xp.take(sums.rq, vocab - j), qb)
    sign, _, _, neg_sign = _consts(xp, j)
    nonempty = q > 0
    den = xp.where(nonempty, q / neg_sign, math.inf)  # an empty set divides by inf: a = 0, b = 0
    lo, hi = _ab_range(xp, sums, j, k)  # a set without mass still bounds (a, b): the others' membership
    if bound:  # q(M), from the anchored mass sums when given (no cancellation)
        rest = xp.take(sums.cq, j) - qb if mid is None else xp.take(mid, k) + xp.take(mid, j)
    elif mid is not None:
        rest = xp.take(mid, k) + xp.take(mid, j)
    else:
        rest = None
    ends = xp.stack2(xp.take(sums.rp, vocab - j), xp.take(sums.cp, k))
    return Segment(ends, den, q, xp.where(nonempty, sign, 0.0), rest, lo, hi)


def _make_segment_np(xp, sums: SortedSums, j, k, mid, bound: bool) -> Segment:
    """:func:`make_segment` on numpy arrays: the same values, each row's offsets computed once."""
    ratio, n_le, n_lt = sums.ratio, sums.n_le, sums.n_lt
    n, vocab = ratio.shape
    shape = np.broadcast_shapes(j.shape, k.shape)
    col = (n,) + (1,) * (len(shape) - 1)
    if len(shape) > 2:
        n_le, n_lt = n_le.reshape(col), n_lt.reshape(col)
    o1 = np.arange(0, n * (vocab + 1), vocab + 1).reshape(col)  # flat row offsets of the [N, V + 1] sums
    o0 = np.arange(0, n * vocab, vocab).reshape(col)  # and of the [N, V] ratios
    fa, fk = (vocab - j) + o1, k + o1
    q, ends, lo, hi = (np.empty((2,) + shape) for _ in range(4))
    q[0], q[1] = sums.rq.take(fa), sums.cq.take(fk)
    ends[0], ends[1] = sums.rp.take(fa), sums.cp.take(fk)
    nonempty = q > 0
    den = q.copy()
    np.negative(den[1], out=den[1])  # q / (1, -1): exact
    np.copyto(den, math.inf, where=~nonempty)  # an empty set divides by inf: a = 0, b = 0
    sign = _consts(xp, j)[0]
    offset = np.where(nonempty, sign, 0.0)
    # _ab_range, written into the stacked rows
    lo_a, lo_b, hi_a, hi_b = lo[0], lo[1], hi[0], hi[1]
    np.subtract(ratio.take(np.minimum(j, vocab - 1) + o0), 1, out=hi_a)
    np.copyto(hi_a, math.inf, where=j >= vocab)
    np.subtract(ratio.take(np.maximum(j - 1, 0) + o0), 1, out=lo_a)
    np.maximum(lo_a, 0.0, out=lo_a)
    np.copyto(lo_a, 0.0, where=j <= n_le)
    np.maximum(hi_a, lo_a, out=hi_a)
    np.subtract(1, ratio.take(np.maximum(k - 1, 0) + o0), out=hi_b)
    np.maximum(hi_b, 0.0, out=hi_b)
    np.minimum(hi_b, 1.0, out=hi_b)
    np.copyto(hi_b, 1.0, where=k < 1)
    np.subtract(1, ratio.take(np.minimum(k, vocab - 1) + o0), out=lo_b)
    np.maximum(lo_b, 0.0, out=lo_b)
    np.minimum(lo_b, 1.0, out=lo_b)
    np.copyto(lo_b, 0.0, where=k >= n_lt)
    np.minimum(lo_b, hi_b, out=lo_b)
    if mid is not None:
        rest = mid.take(fk) + mid.take(j + o1)
    elif bound:
        rest = sums.cq.take(j + o1) - q[1]
    else:
        rest = None
    return Segment(ends, den, q, offset, rest, lo, hi)


def _col(x, like):  # a per-row [N, 1] array viewed to broadcast against [N, ...]
    return x.reshape((x.shape[0],) + (1,) * (like.ndim - 1))


def _ab_range(xp, sums: SortedSums, j, k):
    """``(lo, hi)`` [2, *S]: the range of ``(a, b)`` on the segment ``A = [j, V)``, ``B = [0, k)``.

    ``A`` is exactly the positions ``>= j`` for ``r_(j-1) <= 1 + a <= r_j``, and ``B`` exactly
    those ``< k`` for ``r_(k-1) <= 1 - b <= r_k``; intersected with ``a >= 0``, ``0 <= b <= 1``.
    """
    ratio = sums.ratio
    vocab = ratio.shape[1]
    r_j = xp.where(j < vocab, xp.take(ratio, xp.clip(j, None, vocab - 1)), math.inf)
    r_before = xp.take(ratio, xp.clip(j - 1, 0, None))
    lo_a = xp.where(j > _col(sums.n_le, j), xp.clip(r_before - 1, 0.0, None), 0.0)
    hi_a = xp.maximum(r_j - 1, lo_a)
    r_k = xp.take(ratio, xp.clip(k, None, vocab - 1))
    hi_b = xp.where(k >= 1, xp.clip(1 - xp.take(ratio, xp.clip(k - 1, 0, None)), 0.0, 1.0), 1.0)
    lo_b = xp.minimum(xp.where(k < _col(sums.n_lt, k), xp.clip(1 - r_k, 0.0, 1.0), 0.0), hi_b)
    return xp.stack2(lo_a, lo_b), xp.stack2(hi_a, hi_b)


def ab_on(xp, m, seg: Segment):
    """``(a, b)`` stacked [2, ...] at excess mass ``m`` on a segment, within the segment's range."""
    sign = _consts(xp, m)[0]
    # a division, not a product with 1 / q: a subnormal q(A) has no finite inverse
    return xp.minimum(xp.maximum((seg.ends + sign * m) / seg.den + seg.offset, seg.lo), seg.hi)


def divergence_on(xp, m, seg: Segment, div: Divergence, bound: bool):
    """``D_f`` (or the Thm 3.12 upper bound) at ``m`` on a segment, ``O(1)`` per point.

    ``q(A) g(1 + a) + q(B) g(1 - b)`` plus the M-set sum (exact) or ``q(M) max(g(1 + a), g(1 - b))``
    (bound); docs/theory.md, section 4. Empty sets have ``1 + a = 1 - b = 1`` and ``g(1) = 0``.
    """
    if not bound and xp.name == "numpy":
        return _divergence_np(xp, m, seg, div)
    sign = _consts(xp, m)[0]
    g = xp.g(div, 1 - sign * ab_on(xp, m, seg))  # (1 + a, 1 - b): one generator call on the stacked rows
    total = xp.where(seg.q > 0, seg.q * g, 0.0).sum(0)  # a set without mass adds 0 (even where g = inf)
    if bound:
        return total + xp.where(seg.rest > 0, seg.rest * xp.maximum(g[0], g[1]), 0.0)
    return total + seg.rest


def _divergence_np(xp, m, seg: Segment, div: Divergence):
    """:func:`divergence_on` (exact mode) on numpy arrays: the same operations, mostly in place."""
    sign = _consts(xp, m)[0]
    z = np.add(seg.ends, sign * m)  # ab_on, then (1 + a, 1 - b) = 1 - sign (a, b)
    z /= seg.den
    z += seg.offset
    np.maximum(z, seg.lo, out=z)
    np.minimum(z, seg.hi, out=z)
    z *= sign
    np.subtract(1, z, out=z)
    terms = np.multiply(xp.g(div, z), seg.q)
    np.copyto(terms, 0.0, where=~(seg.q > 0))  # a set without mass adds 0 (even where g = inf)
    total = np.add(terms[0], terms[1])
    total += seg.rest
    return total
