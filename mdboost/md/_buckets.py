"""Exact f-MD in expected linear time: bucket the ratios, bracket on bucket edges, finish on few entries.

The exact primal and dual of :mod:`mdboost.md.solve` without sorting the vocabulary
(``docs/theory.md``, section 4, "Linear-time solve"):

1. **Histogram** (:mod:`mdboost.md._histogram`). The ratios ``r_i = p_i / q_i`` are put in :data:`FINITE` fixed buckets whose
   edges are read off the float64 bits (``PER_OCTAVE`` buckets per octave over
   ``[2^-64, 2^64)``, one bucket below, one above, and one for ``q_i = 0``); per bucket the sums
   of ``p``, ``q`` and ``q g(r)`` in float64 (one ``scatter_add`` each). Float32 rows take the
   ratio, its bucket (read off the float32 bits: the same edges, all exact in float32) and the
   KL log in float32, the terms and sums in float64: the float32 rounding of a ratio moves
   ``D_f`` by about ``1e-8``, far inside float32's contract (``docs/theory.md``, section 9).
2. **Bracket.** At a bucket edge ``x = 1 + a`` the excess ``E(a)`` is exact from the bucket sums,
   and so is ``F(b)`` at an edge ``y = 1 - b``. At each such *event* the other parameter lies in
   one bucket, and ``D~(x, y) = sum_i q_i g(clip(r_i, y, x))`` (increasing in ``x``, decreasing
   in ``y``, exact at two edges) bounds ``D_f`` on both sides. The crossing of the budget lies
   between the largest event whose lower bound exceeds the budget and the smallest one whose
   upper bound fits.
3. **Reduce.** For every point of that bracket, the entries of the buckets beyond it stay in
   ``A`` (or ``B``) and those between stay in ``M``: they are summed into four aggregate entries
   (same ``p``, ``q`` sums, so ``E`` and ``F`` are unchanged on the bracket), and ``D_f`` is off
   by a known constant ``delta`` (the M buckets' ``q g(r)`` sums minus their aggregates' terms).
   The entries of the bracketing buckets plus five aggregates form a small pair, solved exactly
   by :class:`~mdboost.md.breakpoints.Breakpoints` (sort + search) with the budget minus
   ``delta``: the same point as the full sorted solve.

Worst case: when the bracketing buckets hold more than :data:`FALLBACK_FRACTION` of a row's
entries (all ratios within one bucket, ties), the row is solved on its full sorted breakpoints
instead: ``O(V log V)``, exact as ever. Host synchronisations: one (the reduced width and the
rows that fall back).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from mdboost.md._histogram import C1, FINITE, INF, Histogram, Rows, edges, histogram, rows_of
from mdboost.md._xp import TORCH, namespace_for
from mdboost.md.breakpoints import Breakpoints
from mdboost.md.divergences import Divergence

AGGREGATES = 5  # top of A, upper M, lower M, bottom of B, q = 0
FALLBACK_FRACTION = 0.25  # a row whose bracketing buckets hold more entries is solved sorted
NOISE_BUDGET = 1e-12  # primal budgets in (0, NOISE_BUDGET) take the sorted path (D_f is rounding noise there)
MIN_VOCAB = 4096  # solve / verify use this path from this vocabulary on (smaller rows: sorted)


_EDGE_G: dict = {}


def _edge_g(xp, div: Divergence, e_a, e_b):  # g at the A and B edges, [C1 + 1] each, cached per divergence
    key = (div, str(e_a.device), xp.name)
    if key not in _EDGE_G:
        if len(_EDGE_G) >= 64:  # divergences made on the fly: keep the cache bounded
            _EDGE_G.clear()
        _EDGE_G[key] = (xp.asarray(div.g(e_a)), xp.asarray(div.g(e_b)))
    return _EDGE_G[key]


def _cummax(xp, x):  # running maximum along the last axis, in torch (numpy's accumulate is slower)
    if xp is TORCH:
        return torch.cummax(x, -1).values
    return torch.cummax(torch.from_numpy(x), -1).values.numpy()


def _qg(xp, q, g):  # q g with 0 where q = 0 (g may be inf there)
    return xp.where(q > 0, q * g, 0.0)


def _g(xp, div: Divergence, z):  # div.g through torch (the same values in both namespaces)
    return div.g(z) if xp is TORCH else div.g(torch.from_numpy(z)).numpy()


class Events(NamedTuple):
    """The curve at the bucket edges: A side ``x = e[C1 + u]``, B side ``y = e[C1 - side + l]``
    ([N, side + 1] each; ``side`` spans the buckets any row occupies, empty ones beyond add nothing).

    Arrays of the namespace ``xp`` (numpy views on CPU: these are a few dozen ops on
    ``[N, side + 1]`` arrays, where a numpy op costs a fraction of a torch one).
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


def events(h: Histogram, div: Divergence | None) -> Events:
    """Exact ``E``, ``F`` and the two parts of ``D~`` at every bucket edge (``docs/theory.md``, section 4)."""
    xp = namespace_for(h.p)
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
    used = np.flatnonzero((sums[0, :, :FINITE] > 0).any(0) | (sums[1, :, :FINITE] > 0).any(0))
    if used.size == 0:
        return 1
    return int(max(1, C1 - used[0], used[-1] + 1 - C1))


def _events(xp, h: Histogram, div: Divergence | None) -> Events:
    e = edges(h.p.device)
    side = _side(xp, h)
    lo = C1 - side  # first B bucket kept
    e_a, e_b = e[C1:C1 + side + 1], e[lo:C1 + 1]  # [side + 1] each (at most C1 buckets per side)
    # the ten prefix / suffix sums in two torch scans of one [6, N, side] stack (p, q, s of A, then B)
    sums = h.sums  # [3, N, FINITE + 1]
    both = torch.cat([sums[..., C1:C1 + side], sums[..., lo:C1]])  # [6, N, side]
    pad = torch.nn.functional.pad
    fwd = xp.asarray(pad(torch.cumsum(both, -1), (1, 0)))  # [6, N, side + 1]: sum_{b < t}
    rev = xp.asarray(pad(torch.flip(torch.cumsum(torch.flip(both, [-1]), -1), [-1]), (0, 1)))  # sum_{b >= t}
    cp_a, cq_a, cs_a, cp_b, cq_b = fwd[0], fwd[1], fwd[2], fwd[3], fwd[4]
    rp_a, rq_a, rp_b, rq_b, rs_b = rev[0], rev[1], rev[3], rev[4], rev[5]
    p_inf = xp.asarray(h.p[:, INF:].contiguous())
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
        g_a, g_b = _edge_g(xp, div, e[C1:], e[:C1 + 1])
        d_a = _qg(xp, rq_a, g_a[:side + 1]) + cs_a
        d_b = rs_b + _qg(xp, cq_b, g_b[lo:])
    return Events(m_a, m_b, d_a, d_b, tv, m_end, rp_a, rq_a, cp_a, cq_a, cs_a, cp_b, cq_b, rp_b, rq_b, rs_b, p_inf,
                  xp, side)


def _ss(xp, sorted_rows, x, right):  # row-wise searchsorted on [N, L] with x [N, Q]
    if xp is TORCH:
        return torch.searchsorted(sorted_rows.contiguous(), x.contiguous(), right=right)
    side = "right" if right else "left"
    if sorted_rows.shape[0] == 1:
        return np.searchsorted(sorted_rows[0], x, side=side)
    # row by row: numpy's search of sorted queries is several times faster than torch's batched one
    out = np.empty(x.shape, dtype=np.int64)
    for i in range(x.shape[0]):
        out[i] = np.searchsorted(sorted_rows[i], x[i], side=side)
    return out


def bracket(ev: Events, budget: torch.Tensor):  # budget [N, 1] -> m_lo, m_hi [N, 1]
    """``[m_lo, m_hi]`` holding the primal crossing: ``D > budget`` at ``m_lo`` unless it is the end,
    ``D <= budget`` at ``m_hi``. Bounds: at an A event the B parameter lies in one bucket ``l``
    (``D~`` between its two edges), at a B event the A parameter in one bucket ``u``."""
    xp = ev.xp
    with xp.errstate():
        return _bracket(xp, ev, xp.asarray(budget.to(torch.float64).contiguous()))


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
    """The bracketing buckets (A buckets ``C1 + [s_a, t_a)``, B buckets ``[t_b, s_b)``) and aggregates."""

    s_a: torch.Tensor  # [N, 1] long
    t_a: torch.Tensor
    t_b: torch.Tensor
    s_b: torch.Tensor
    agg_p: torch.Tensor  # [N, AGGREGATES] float64
    agg_q: torch.Tensor
    delta: torch.Tensor  # [N, 1]: D_f minus D_f of the reduced pair on the bracket


def reduction(ev: Events, m_lo, m_hi, div: Divergence | None) -> Reduction:
    """Which buckets stay individual for every ``m`` in ``[m_lo, m_hi]``, and the sums of the others.

    ``m_lo``, ``m_hi`` [N, 1] in the namespace of ``ev``; returns torch tensors.
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
    out = (s_a, t_a, t_b + lo, s_b + lo, agg_p, agg_q, delta)
    return Reduction(*(xp.to_torch(x) for x in out))


def reduced_pair(rows: Rows, h: Histogram, red: Reduction, sorted_rows=None):
    """The reduced rows ``(p', q')`` [N, W + AGGREGATES] and the rows that fall back [N] bool.

    Row ``i`` keeps the entries of its bracketing buckets (read from the stored bucket indices),
    then the aggregates; rows with more than :data:`FALLBACK_FRACTION` of the vocabulary in
    those buckets are flagged (and left with their aggregates only). One host synchronisation
    (the reduced width and whether any row falls back).
    """
    n, vocab = rows.p.shape
    dev = rows.p.device
    if namespace_for(rows.p) is not TORCH and rows.p.dtype in (torch.float32, torch.float64):
        b = np.arange(FINITE + 1)  # [FINITE + 1]: which buckets each row keeps, looked up per entry
        s_a, t_a, t_b, s_b = (x.numpy() for x in red[:4])
        kept_bucket = ((b >= C1 + s_a) & (b < C1 + t_a)) | ((b >= t_b) & (b < s_b))
        keep = torch.from_numpy(kept_bucket).gather(1, h.index)  # [N, V]
        return _reduced_pair_np(rows, keep, red, sorted_rows)
    b = torch.arange(FINITE + 1, device=dev)
    kept_bucket = ((b >= C1 + red.s_a) & (b < C1 + red.t_a)).logical_or_((b >= red.t_b) & (b < red.s_b))
    keep = kept_bucket.gather(1, h.index)  # [N, V]
    flat = keep.view(-1).nonzero().squeeze(-1)  # row-major: row by row, in vocabulary order
    row = flat // vocab
    counts = torch.bincount(row, minlength=n)  # [N]
    fallback = counts > max(FALLBACK_FRACTION * vocab, 64)
    if sorted_rows is not None:
        fallback |= sorted_rows
    kept = torch.where(fallback, 0, counts)
    width, any_fallback = torch.stack([kept.max(), fallback.sum()]).tolist() if n else (0, 0)
    if any_fallback:
        sel = ~fallback.index_select(0, row)
        flat, row = flat[sel], row[sel]
    pos = torch.arange(flat.numel(), device=dev) - (torch.cumsum(kept, 0) - kept).index_select(0, row)
    vals_p = rows.p.reshape(-1).index_select(0, flat).to(torch.float64)
    vals_q = rows.q.reshape(-1).index_select(0, flat).to(torch.float64)
    if rows.scale_p is not None:  # the same float64 values as in the histogram's pass
        vals_p, vals_q = vals_p / rows.scale_p[:, 0][row], vals_q / rows.scale_q[:, 0][row]
    total = width + AGGREGATES
    out_p = torch.zeros(n * total, dtype=torch.float64, device=dev)
    out_q = torch.zeros_like(out_p)
    dst = row * total + pos
    out_p.index_copy_(0, dst, vals_p)
    out_q.index_copy_(0, dst, vals_q)
    out_p, out_q = out_p.reshape(n, total), out_q.reshape(n, total)
    out_p[:, width:] = red.agg_p
    out_q[:, width:] = red.agg_q
    return out_p, out_q, fallback


def _reduced_pair_np(rows: Rows, keep: torch.Tensor, red: Reduction, sorted_rows):
    """:func:`reduced_pair` after the per-entry lookup, in numpy (CPU rows): the same values, a
    fraction of the per-op cost (a few dozen ops on the kept entries and on [N] arrays)."""
    n, vocab = rows.p.shape
    flat = np.flatnonzero(keep.numpy())  # row-major: row by row, in vocabulary order
    row = flat // vocab
    counts = np.bincount(row, minlength=n)  # [N]
    fallback = counts > max(FALLBACK_FRACTION * vocab, 64)
    if sorted_rows is not None:
        fallback |= sorted_rows.numpy()
    kept = np.where(fallback, 0, counts)
    width = int(kept.max()) if n else 0
    if fallback.any():
        sel = ~fallback[row]
        flat, row = flat[sel], row[sel]
    pos = np.arange(flat.size) - (np.cumsum(kept) - kept)[row]
    vals_p = rows.p.numpy().reshape(-1)[flat].astype(np.float64)
    vals_q = rows.q.numpy().reshape(-1)[flat].astype(np.float64)
    if rows.scale_p is not None:  # the same float64 values as in the histogram's pass
        vals_p, vals_q = vals_p / rows.scale_p.numpy()[row, 0], vals_q / rows.scale_q.numpy()[row, 0]
    total = width + AGGREGATES
    out_p, out_q = np.zeros((n, total)), np.zeros((n, total))
    dst = row * total + pos
    out_p.reshape(-1)[dst] = vals_p
    out_q.reshape(-1)[dst] = vals_q
    out_p[:, width:] = red.agg_p.numpy()
    out_q[:, width:] = red.agg_q.numpy()
    return torch.from_numpy(out_p), torch.from_numpy(out_q), torch.from_numpy(fallback)


class Prepared(NamedTuple):
    """The reduced problem of every row: solve it with :class:`Breakpoints` and add ``delta``."""

    bp: Breakpoints  # on the reduced rows [N, W + AGGREGATES], float64
    delta: torch.Tensor  # [N, 1]
    fallback: torch.Tensor  # [N] bool: rows to solve on their full sorted breakpoints
    tv: torch.Tensor  # [N, 1]
    m_end: torch.Tensor  # [N, 1]


def prepare_primal(p, q, budget, div: Divergence, normalize: bool) -> tuple[Prepared, torch.Tensor]:
    """Histogram, bracket and reduction of the primal; returns the reduced budget [N, 1] too."""
    rows = rows_of(p, q, normalize)
    h = histogram(rows, div)
    ev = events(h, div)
    m_lo, m_hi = bracket(ev, budget)
    red = reduction(ev, m_lo, m_hi, div)
    # budgets at the rounding level of D_f (float64 sums of O(1) terms) are solved sorted: there
    # D_f is noise and the sorted search's breakpoints are the reference (docs/theory.md, section 4)
    rp, rq, fallback = reduced_pair(rows, h, red, ((budget > 0) & (budget < NOISE_BUDGET)).reshape(-1))
    reduced_budget = torch.where(torch.isinf(budget) | (budget <= 0), budget, (budget - red.delta).clamp(min=0.0))
    bp = Breakpoints(*_sorted(rp, rq), rp.shape[:-1], torch.float64)
    return Prepared(bp, red.delta, fallback, ev.xp.to_torch(ev.tv), ev.xp.to_torch(ev.m_end)), reduced_budget


def prepare_dual(p, q, min_acceptance, div: Divergence, normalize: bool) -> tuple[Prepared, torch.Tensor]:
    """Histogram and reduction of the dual at ``m = clip(1 - min_acceptance)``; returns ``m`` [N, 1]."""
    rows = rows_of(p, q, normalize)
    h = histogram(rows, div)
    ev = events(h, div)
    tv, m_end = ev.xp.to_torch(ev.tv), ev.xp.to_torch(ev.m_end)
    m = torch.minimum(torch.maximum(1 - min_acceptance, m_end), tv)
    m_x = ev.xp.asarray(m.contiguous())
    red = reduction(ev, m_x, m_x, div)
    rp, rq, fallback = reduced_pair(rows, h, red)
    bp = Breakpoints(*_sorted(rp, rq), rp.shape[:-1], torch.float64)
    return Prepared(bp, red.delta, fallback, tv, m_end), m


def _sorted(rp, rq):
    from mdboost.md._sums import _sort_rows

    r = torch.div(rp, rq).nan_to_num_(nan=1.0, posinf=math.inf)
    return _sort_rows(r, rp, rq)


def _finish_primal(bp: Breakpoints, budget, div: Divergence, delta):
    point, _, value = bp._primal64(budget.reshape(-1), div, False, False, with_value=True)
    at_start = (point.a == 0) & (point.b == 0)
    return point, torch.where(at_start | (budget <= 0), 0.0, value + delta)


def _finish_dual(bp: Breakpoints, m, div: Divergence | None, delta, tv):
    from mdboost.md import _search

    point = bp._point64(m)
    if div is None:
        return point, None
    j, k = _search.locate_j(bp, m), _search.locate_k(bp, m)
    value = bp.div_at(m, j, k, div, False).clamp(min=0) + delta
    return point, torch.where(m >= tv, 0.0, value)


def sorted_dual(bp: Breakpoints, min_acceptance, div: Divergence | None):
    """The dual on full sorted breakpoints: its point (float64 [N, 1] fields) and ``D_f`` there [N, 1]."""
    m = bp._clip_m(min_acceptance)
    return _finish_dual(bp, m, div, torch.zeros_like(m), bp._tv)


def sorted_solve(p, q, value, div: Divergence | None, dual: bool, normalize: bool):
    """The same answer from the full sorted breakpoints (the fallback): ``(a, b, acc, D_f, tv)``, [N, 1] each."""
    bp = Breakpoints.build(p, q, validate=False, normalize=normalize)
    if dual:
        point, div_value = sorted_dual(bp, value, div)
    else:
        point, div_value = _finish_primal(bp, value, div, torch.zeros_like(value))
    return (*point, div_value, bp._tv)


def solve_rows(p, q, value, div: Divergence | None, dual: bool, normalize: bool):
    """Exact primal (``value`` = budget) or dual (``value`` = min acceptance) on [N, V] rows.

    Returns ``(a, b, acceptance, D_f, tv)`` as float64 [N, 1] tensors (``D_f`` None for a dual
    without divergence); rows whose bracketing buckets are too full are solved by
    :func:`sorted_solve` (the documented worst case).
    """
    if dual:
        prep, m = prepare_dual(p, q, value, div, normalize)
        point, div_value = _finish_dual(prep.bp, m, div, prep.delta, prep.tv)
    else:
        prep, reduced_budget = prepare_primal(p, q, value, div, normalize)
        point, div_value = _finish_primal(prep.bp, reduced_budget, div, prep.delta)
        div_value = torch.where(value <= 0, 0.0, div_value)
    out = [*point, div_value, prep.tv]
    rows = prep.fallback.nonzero().squeeze(-1)
    if rows.numel():
        sub = sorted_solve(p[rows], q[rows], value[rows], div, dual, normalize)
        for dst, src in zip(out, sub):
            if dst is not None:
                dst[rows] = src
    return tuple(out)


def applies(p: torch.Tensor) -> bool:
    """Whether :func:`solve` and :func:`~mdboost.md.verify.verify` take this path for rows ``p``."""
    return p.shape[-1] >= MIN_VOCAB and p.numel() > 0


def solve_batch(p, q, value, div: Divergence | None, dual: bool, normalize: bool):
    """:func:`solve_rows` on ``[..., V]`` rows with ``value`` [...]: ``(a, b, acceptance, D_f, sd_acceptance)``.

    Outputs have shape [...] in ``p``'s dtype (``D_f`` None for a dual without divergence).
    """
    vocab = p.shape[-1]
    shape = p.shape[:-1]
    a, b, acc, value, tv = solve_rows(p.reshape(-1, vocab), q.reshape(-1, vocab),
                                      value.reshape(-1, 1).to(torch.float64), div, dual, normalize)
    out = (a, b, acc, None if value is None else value.clamp(min=0), (1 - tv).clamp(0.0, 1.0))
    return tuple(None if x is None else x.reshape(shape).to(p.dtype) for x in out)
