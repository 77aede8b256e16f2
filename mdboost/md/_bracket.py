"""Steps 2 and 3 of the linear-time solve (:mod:`mdboost.md._buckets`): the bracket and the reduction.

From the bucket sums of :mod:`mdboost.md._histogram` (``docs/theory.md``, section 4):

- :func:`events`: ``E``, ``F`` and the two parts of ``D~`` at every bucket edge near ``r = 1``;
- :func:`bracket`: the excess masses ``[m_lo, m_hi]`` holding the primal crossing of the budget;
- :func:`reduction`: for every ``m`` of that bracket, which buckets stay individual (the
  bracketing ones) and the sums of the others (the aggregates, and the divergence offset ``delta``).

Everything here costs a few dozen operations on ``[N, side + 1]`` arrays (``side`` <= :data:`C1`
buckets per side of ``r = 1``), in the namespace ``xp`` the caller chose
(:func:`mdboost.md._xp.namespace_for`): numpy views on CPU, where a tiny numpy op costs a
fraction of a torch one, torch on accelerators (no host synchronisation there).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from mdboost.md._histogram import C1, FINITE, INF, Histogram, edges
from mdboost.md._xp import TORCH, g_numpy
from mdboost.md.divergences import Divergence

_EDGE_G: dict = {}


def _edge_g(xp, div: Divergence, e):  # g at the A and B edges e[C1:], e[:C1 + 1], cached per divergence
    key = (div, str(e.device), xp.name)
    if key not in _EDGE_G:
        if len(_EDGE_G) >= 64:  # divergences made on the fly: keep the cache bounded
            _EDGE_G.clear()
        _EDGE_G[key] = (xp.asarray(div.g(e[C1:])), xp.asarray(div.g(e[:C1 + 1])))
    return _EDGE_G[key]


def _cummax(xp, x):  # running maximum along the last axis
    if xp is TORCH:
        return torch.cummax(x, -1).values
    if x.shape[0] == 1:  # one row: numpy's accumulate, without torch's per-op cost
        return np.maximum.accumulate(x, -1)
    return torch.cummax(torch.from_numpy(x), -1).values.numpy()  # torch's is faster over many rows


def _qg(xp, q, g):  # q g with 0 where q = 0 (g may be inf there)
    return xp.where(q > 0, q * g, 0.0)


def _g(xp, div: Divergence, z):  # div.g (the same values in both namespaces)
    return div.g(z) if xp is TORCH else g_numpy(div, z)


class Events(NamedTuple):
    """The curve at the bucket edges: A side ``x = e[C1 + u]``, B side ``y = e[C1 - side + l]``
    ([N, side + 1] each; ``side`` spans the buckets any row occupies, empty ones beyond add nothing).

    Arrays of the namespace ``xp``.
    """

    m_a: torch.Tensor  # E(x - 1), non-increasing in u, m_a[0] = TV
    m_b: torch.Tensor  # F(1 - y), non-decreasing in l, m_b[side] = TV
    d_a: torch.Tensor  # A part of D~: q(r >= x) g(x) + sum of q g(r) over [1, x)
    d_b: torch.Tensor  # B part of D~: sum of q g(r) over [y, 1) + q(r < y) g(y)
    tv: torch.Tensor  # [N, 1]
    m_end: torch.Tensor  # [N, 1]
    # sums for the aggregates, same index ranges
    rp_a: torch.Tensor  # sum_{b >= C1 + u} p (finite)
    rq_a: torch.Tensor
    cp_a: torch.Tensor  # sum_{C1 <= b < C1 + u} p
    cq_a: torch.Tensor
    cs_a: torch.Tensor  # sum_{C1 <= b < C1 + u} q g(r)
    cp_b: torch.Tensor  # sum_{b < C1 - side + l} p (B indices l are local)
    cq_b: torch.Tensor
    rp_b: torch.Tensor  # sum_{C1 - side + l <= b < C1} p
    rq_b: torch.Tensor
    rs_b: torch.Tensor  # sum_{C1 - side + l <= b < C1} q g(r)
    p_inf: torch.Tensor  # [N, 1]
    xp: object = None  # the namespace of the arrays
    side: int = C1  # buckets per side kept: A buckets C1 .. C1 + side - 1, B buckets C1 - side .. C1 - 1


def events(xp, h: Histogram, div: Divergence | None) -> Events:
    """Exact ``E``, ``F`` and the two parts of ``D~`` at every bucket edge (``docs/theory.md``, section 4)."""
    with xp.errstate():  # inf edges times zero sums are masked
        return _events(xp, h, div)


def _side(xp, h: Histogram) -> int:
    """Buckets per side from ``r = 1`` out to the farthest one any row occupies (at least 1).

    The events at edges beyond it repeat the values at its last edge (their buckets add zeros to
    every sum), so dropping them changes no bracket and no index. In numpy only (one host read
    of the occupied buckets); the torch namespace keeps all :data:`C1` buckets (no host sync).
    """
    if xp is TORCH:
        return C1
    sums = h.sums.numpy()
    if sums.shape[1] == 1:  # one row: no reduction over the rows
        used = np.flatnonzero((sums[0, 0, :FINITE] > 0) | (sums[1, 0, :FINITE] > 0))
    else:
        used = np.flatnonzero((sums[0, :, :FINITE] > 0).any(0) | (sums[1, :, :FINITE] > 0).any(0))
    if used.size == 0:
        return 1
    return int(max(1, C1 - used[0], used[-1] + 1 - C1))


def _scans(xp, sums, side: int):
    """``(fwd, rev)`` [6, N, side + 1]: the sums over the A buckets ``C1 .. C1 + side - 1`` (p, q, s),
    then the B buckets ``C1 - side .. C1 - 1``, before index ``t`` (``fwd``) and from it (``rev``)."""
    lo = C1 - side
    if xp is TORCH:
        both = torch.cat([sums[..., C1:C1 + side], sums[..., lo:C1]])  # [6, N, side]
        pad = torch.nn.functional.pad
        fwd = pad(torch.cumsum(both, -1), (1, 0))
        rev = pad(torch.flip(torch.cumsum(torch.flip(both, [-1]), -1), [-1]), (0, 1))
        return fwd, rev
    s = sums.numpy()
    n = s.shape[1]
    both = np.empty((6, n, side))
    both[:3], both[3:] = s[..., C1:C1 + side], s[..., lo:C1]
    # left-to-right float64 accumulation, as torch's cumsum (the same values)
    fwd, rev = np.empty((6, n, side + 1)), np.empty((6, n, side + 1))
    fwd[..., 0] = 0.0
    rev[..., side] = 0.0
    np.cumsum(both, -1, out=fwd[..., 1:])
    np.cumsum(both[..., ::-1], -1, out=rev[..., side - 1::-1])
    return fwd, rev


def _events(xp, h: Histogram, div: Divergence | None) -> Events:
    e = edges(h.p.device)
    side = _side(xp, h)
    lo = C1 - side  # first B bucket kept
    e_a, e_b = e[C1:C1 + side + 1], e[lo:C1 + 1]  # [side + 1] each (at most C1 buckets per side)
    fwd, rev = _scans(xp, h.sums, side)  # the ten prefix / suffix sums
    cp_a, cq_a, cs_a, cp_b, cq_b = fwd[0], fwd[1], fwd[2], fwd[3], fwd[4]
    rp_a, rq_a, rp_b, rq_b, rs_b = rev[0], rev[1], rev[3], rev[4], rev[5]
    p_inf = h.p[:, INF:].contiguous() if xp is TORCH else h.sums.numpy()[0, :, INF:]  # [N, 1]
    tv = xp.clip(cq_b[:, -1:] - cp_b[:, -1:], 0.0, None)  # F(0) = sum_{r < 1} (q - p)
    m_end = xp.minimum(p_inf, tv)
    ea, eb = xp.asarray(e_a), xp.asarray(e_b)
    m_a = xp.where(rq_a > 0, rp_a - ea * rq_a, 0.0) + p_inf
    m_a = xp.minimum(xp.maximum(m_a, m_end), tv)
    m_a[:, 0:1] = tv  # E(0) = F(0) = TV exactly
    m_a = -_cummax(xp, -m_a)  # running minimum
    m_b = xp.minimum(xp.clip(eb * cq_b - cp_b, 0.0, None), tv)
    m_b[:, -1:] = tv
    m_b = _cummax(xp, m_b)
    if div is None:
        d_a = d_b = None
    else:
        g_a, g_b = _edge_g(xp, div, e)
        d_a = _qg(xp, rq_a, g_a[:side + 1]) + cs_a
        d_b = rs_b + _qg(xp, cq_b, g_b[lo:])
    return Events(m_a, m_b, d_a, d_b, tv, m_end, rp_a, rq_a, cp_a, cq_a, cs_a, cp_b, cq_b, rp_b, rq_b, rs_b, p_inf,
                  xp, side)


def _ss(xp, sorted_rows, x, right):  # row-wise searchsorted on [N, L] with x [N, Q]
    if xp is TORCH:
        return torch.searchsorted(sorted_rows.contiguous(), x.contiguous(), right=right)
    side = "right" if right else "left"
    if sorted_rows.shape[0] == 1:
        return sorted_rows[0].searchsorted(x, side=side)
    # row by row: numpy's search of sorted queries is several times faster than torch's batched one
    # (the array method: np.searchsorted's wrappers cost more than a row's search here)
    out = np.empty(x.shape, dtype=np.int64)
    for row, queries, dst in zip(sorted_rows, x, out):
        dst[...] = row.searchsorted(queries, side=side)
    return out


def bracket(ev: Events, budget):  # budget [N, 1] float64 in ev.xp -> m_lo, m_hi [N, 1]
    """``[m_lo, m_hi]`` holding the primal crossing: ``D > budget`` at ``m_lo`` unless it is the end,
    ``D <= budget`` at ``m_hi``. Bounds: at an A event the B parameter lies in one bucket ``l``
    (``D~`` between its two edges), at a B event the A parameter in one bucket ``u``."""
    xp = ev.xp
    with xp.errstate():
        return _bracket(xp, ev, budget)


def _bracket(xp, ev: Events, budget):
    top = ev.side - 1  # last bucket index on either side (local)
    neg_a = -ev.m_a
    # A events: B bucket l with m_b[l] <= m <= m_b[l + 1]
    l = xp.clip(_ss(xp, ev.m_b, ev.m_a, True) - 1, 0, top)
    lb_a = ev.d_a + xp.take(ev.d_b, l + 1)
    ub_a = ev.d_a + xp.take(ev.d_b, l)
    # B events: A bucket u with m_a[u] >= m >= m_a[u + 1]; only points of the curve (m >= m_end)
    u = xp.clip(_ss(xp, neg_a, -ev.m_b, True) - 1, 0, top)
    lb_b = xp.take(ev.d_a, u) + ev.d_b
    ub_b = xp.take(ev.d_a, u + 1) + ev.d_b
    on_curve = ev.m_b >= ev.m_end
    neg = -math.inf
    m_lo = xp.maximum(xp.amax(xp.where(lb_a > budget, ev.m_a, neg), axis=-1, keepdims=True),
                      xp.amax(xp.where((lb_b > budget) & on_curve, ev.m_b, neg), axis=-1, keepdims=True))
    m_hi = xp.minimum(xp.amin(xp.where(ub_a <= budget, ev.m_a, math.inf), axis=-1, keepdims=True),
                      xp.amin(xp.where((ub_b <= budget) & on_curve, ev.m_b, math.inf), axis=-1, keepdims=True))
    m_hi = xp.minimum(m_hi, ev.tv)
    return xp.minimum(xp.maximum(m_lo, ev.m_end), m_hi), m_hi


class Reduction(NamedTuple):
    """The bracketing buckets (A buckets ``C1 + [s_a, t_a)``, B buckets ``[t_b, s_b)``) and aggregates.

    Arrays of the namespace of the :class:`Events` (the caller converts what it needs).
    """

    s_a: torch.Tensor  # [N, 1] long
    t_a: torch.Tensor
    t_b: torch.Tensor
    s_b: torch.Tensor
    agg_p: torch.Tensor  # [N, AGGREGATES] float64
    agg_q: torch.Tensor
    delta: torch.Tensor  # [N, 1]: D_f minus D_f of the reduced pair on the bracket


def reduction(ev: Events, m_lo, m_hi, div: Divergence | None) -> Reduction:
    """Which buckets stay individual for every ``m`` in ``[m_lo, m_hi]``, and the sums of the others.

    ``m_lo``, ``m_hi`` [N, 1] in the namespace of ``ev``, as the returned arrays.
    """
    xp = ev.xp
    with xp.errstate():
        return _reduction(xp, ev, m_lo, m_hi, div)


def _reduction(xp, ev: Events, m_lo, m_hi, div: Divergence | None) -> Reduction:
    neg_a = -ev.m_a
    t_a = _ss(xp, neg_a, -m_lo, False)  # first u with m_a[u] <= m_lo: entries from there on stay in A
    s_a = xp.clip(_ss(xp, neg_a, -m_hi, True) - 1, 0, None)  # last u with m_a[u] >= m_hi: below it, M
    # E is flat (= m_end) above the largest finite ratio, F flat (= 0) below the smallest: at the
    # curve's end their buckets stay individual, so that a = r_max - 1 and b = 1 - r_min there
    s_a = xp.minimum(s_a, xp.clip(_ss(xp, neg_a, -ev.m_end, False) - 1, 0, None))
    t_a = xp.maximum(t_a, s_a)
    t_b = xp.clip(_ss(xp, ev.m_b, m_lo, True) - 1, 0, None)  # last l with m_b[l] <= m_lo: below it, B
    s_b = _ss(xp, ev.m_b, m_hi, False)  # first l with m_b[l] >= m_hi: from there on, M
    s_b = xp.clip(xp.maximum(xp.maximum(s_b, _ss(xp, ev.m_b, xp.zeros_like(m_hi), True)), t_b), None, ev.side)
    take = xp.take
    agg_p = xp.concatenate([take(ev.rp_a, t_a), take(ev.cp_a, s_a), take(ev.rp_b, s_b), take(ev.cp_b, t_b),
                            ev.p_inf], -1)
    agg_q = xp.concatenate([take(ev.rq_a, t_a), take(ev.cq_a, s_a), take(ev.rq_b, s_b), take(ev.cq_b, t_b),
                            xp.zeros_like(ev.p_inf)], -1)
    if div is None:
        delta = xp.zeros_like(m_lo)
    else:
        mid_q, mid_p = agg_q[:, 1:3], agg_p[:, 1:3]
        ratio = xp.where(mid_q > 0, mid_p / xp.where(mid_q > 0, mid_q, 1.0), 1.0)
        own = xp.sum(_qg(xp, mid_q, _g(xp, div, ratio)), axis=-1, keepdims=True)
        delta = xp.clip(take(ev.cs_a, s_a) + take(ev.rs_b, s_b) - own, 0.0, None)
    lo = C1 - ev.side  # B indices from local to global
    return Reduction(s_a, t_a, t_b + lo, s_b + lo, agg_p, agg_q, delta)
