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
2. **Bracket** (:mod:`mdboost.md._bracket`). At a bucket edge ``x = 1 + a`` the excess ``E(a)`` is
   exact from the bucket sums, and so is ``F(b)`` at an edge ``y = 1 - b``. At each such *event*
   the other parameter lies in one bucket, and ``D~(x, y) = sum_i q_i g(clip(r_i, y, x))``
   (increasing in ``x``, decreasing in ``y``, exact at two edges) bounds ``D_f`` on both sides. The
   crossing of the budget lies between the largest event whose lower bound exceeds the budget and
   the smallest one whose upper bound fits.
3. **Reduce** (:mod:`mdboost.md._bracket`, then :func:`reduced_pair`). For every point of that
   bracket, the entries of the buckets beyond it stay in ``A`` (or ``B``) and those between stay in
   ``M``: they are summed into four aggregate entries (same ``p``, ``q`` sums, so ``E`` and ``F``
   are unchanged on the bracket), and ``D_f`` is off by a known constant ``delta`` (the M buckets'
   ``q g(r)`` sums minus their aggregates' terms). The entries of the bracketing buckets plus five
   aggregates form a small pair, solved exactly by :class:`~mdboost.md.breakpoints.Breakpoints`
   (sort + search) with the budget minus ``delta``: the same point as the full sorted solve.

Worst case: when the bracketing buckets hold more than
:data:`~mdboost.md._router.FALLBACK_FRACTION` of a row's
entries (all ratios within one bucket, ties), the row is solved on its full sorted breakpoints
instead: ``O(V log V)``, exact as ever. Host synchronisations: one (the reduced width and the
rows that fall back).

The namespace of steps 2 and 3 is chosen once (:func:`~mdboost.md._xp.namespace_for` of the
rows): numpy on CPU, torch elsewhere. One CPU row of the exact primal (:func:`solve_one`) skips
the reduced pair's :class:`Breakpoints`: its reduced pair goes to the Python-float search of
:mod:`mdboost.md._scalar` (:func:`mdboost.md._scalar_rows.reduced_row`), the values of the batched
steps on a batch of one, bit for bit.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from mdboost.md import _locate, _router, _scalar, _scalar_rows
from mdboost.md._bracket import Reduction, bracket, events, reduction
from mdboost.md._histogram import C1, FINITE, Histogram, Rows, histogram_of
from mdboost.md._router import NOISE_BUDGET, too_full
from mdboost.md._sums import _sort_rows, neutral_ratios
from mdboost.md._xp import NUMPY, TORCH, namespace_for
from mdboost.md.breakpoints import Breakpoints
from mdboost.md.clamp import point_to_dtype
from mdboost.md.divergences import Divergence

AGGREGATES = 5  # top of A, upper M, lower M, bottom of B, q = 0


def reduced_pair(xp, rows: Rows, h: Histogram, red: Reduction, sorted_rows=None):
    """The reduced rows ``(p', q')`` [N, W + AGGREGATES] and the rows that fall back [N] bool.

    Row ``i`` keeps the entries of its bracketing buckets (read from the stored bucket indices),
    then the aggregates; rows whose buckets hold too many entries (:func:`mdboost.md._router.too_full`)
    are flagged (and left with their aggregates only). One host synchronisation
    (the reduced width and whether any row falls back). ``red`` in the namespace ``xp``.
    """
    n, vocab = rows.p.shape
    dev = rows.p.device
    if xp is not TORCH and rows.p.dtype in (torch.float32, torch.float64):
        return _reduced_pair_np(rows, h, red, sorted_rows)
    red = Reduction(*(xp.to_torch(x) for x in red))
    b = torch.arange(FINITE + 1, device=dev)
    kept_bucket = ((b >= C1 + red.s_a) & (b < C1 + red.t_a)).logical_or_((b >= red.t_b) & (b < red.s_b))
    keep = kept_bucket.gather(1, h.index.long())  # [N, V] (the CPU pass stores int16)
    flat = keep.view(-1).nonzero().squeeze(-1)  # row-major: row by row, in vocabulary order
    row = flat // vocab
    counts = torch.bincount(row, minlength=n)  # [N]
    fallback = too_full(counts, vocab)
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
    if rows.scale_p is not None:  # the float64 entries of the rescaled rows (Rows.block / block32)
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


def _kept_np(h: Histogram, red: Reduction) -> list:
    """The kept entries' positions in each CPU row [count_i], in vocabulary order.

    A bucket index ``i`` lies in ``[lo, lo + w)`` iff ``(i - lo) mod 2^16 < w`` (indices and
    widths are below ``2^15``): two subtractions and two comparisons of the row's int16 indices
    read as uint16, cheaper than a table lookup per entry.
    """
    n = h.index.shape[0]
    s_a, t_a, t_b, s_b = (np.asarray(x).reshape(n) for x in red[:4])
    lo_a, w_a = (C1 + s_a).astype(np.uint16), np.maximum(t_a - s_a, 0).astype(np.uint16)  # A: C1 + [s_a, t_a)
    lo_b, w_b = t_b.astype(np.uint16), np.maximum(s_b - t_b, 0).astype(np.uint16)  # B: [t_b, s_b)
    index = h.index.numpy()
    index = index.view(np.uint16) if index.dtype == np.int16 else index.astype(np.uint16)
    vocab = index.shape[1]
    shifted, in_a, in_b = np.empty(vocab, dtype=np.uint16), np.empty(vocab, dtype=bool), np.empty(vocab, dtype=bool)
    out = []
    for i in range(n):
        np.subtract(index[i], lo_a[i], out=shifted)
        np.less(shifted, w_a[i], out=in_a)
        np.subtract(index[i], lo_b[i], out=shifted)
        np.less(shifted, w_b[i], out=in_b)
        out.append(np.flatnonzero(np.logical_or(in_a, in_b, out=in_a)))
    return out


def _reduced_pair_np(rows: Rows, h: Histogram, red: Reduction, sorted_rows):
    """:func:`reduced_pair` of CPU rows in numpy: the kept positions row by row (:func:`_kept_np`),
    then each row's kept entries taken into its own output row (a flat take of a row, where a
    gather of all rows at once by (row, column) pairs costs several times more): the same values."""
    n, vocab = rows.p.shape
    kept = _kept_np(h, red)
    counts = np.array([k.size for k in kept], dtype=np.int64)
    fallback = too_full(counts, vocab)
    if sorted_rows is not None:
        fallback |= sorted_rows.numpy()
    counts[fallback] = 0
    width = int(counts.max()) if n else 0
    total = width + AGGREGATES
    out_p, out_q = np.zeros((n, total)), np.zeros((n, total))
    if width:
        for i in np.flatnonzero(counts).tolist():
            _take_kept(rows, i, kept[i], out_p[i, :counts[i]], out_q[i, :counts[i]])
    out_p[:, width:] = red.agg_p
    out_q[:, width:] = red.agg_q
    return torch.from_numpy(out_p), torch.from_numpy(out_q), torch.from_numpy(fallback)


def _take_kept(rows: Rows, i: int, col: np.ndarray, out_p: np.ndarray, out_q: np.ndarray) -> None:
    """Row ``i``'s entries at the positions ``col`` into ``out_p``, ``out_q`` (float64 [len(col)]): a
    flat take of the row (strided rows are not copied), divided by the row's sums where the rows are
    rescaled (the float64 entries of Rows.block / block32)."""
    out_p[...], out_q[...] = rows.p.numpy()[i].take(col), rows.q.numpy()[i].take(col)
    if rows.scale_p is not None:
        out_p /= rows.scale_p.numpy()[i, 0]
        out_q /= rows.scale_q.numpy()[i, 0]


def _reduced_row(rows: Rows, h: Histogram, red: Reduction):
    """:func:`reduced_pair` of one CPU row as 1-D float64 arrays ``(p', q')``, or None where it falls back."""
    (flat,) = _kept_np(h, red)
    if too_full(flat.size, rows.p.shape[1]):
        return None
    c = flat.size
    p_r, q_r = np.empty(c + AGGREGATES), np.empty(c + AGGREGATES)
    _take_kept(rows, 0, flat, p_r[:c], q_r[:c])
    p_r[c:], q_r[c:] = red.agg_p[0], red.agg_q[0]
    return p_r, q_r


class Prepared(NamedTuple):
    """The reduced problem of every row: solve it with :class:`Breakpoints` and add ``delta``."""

    bp: Breakpoints  # on the reduced rows [N, W + AGGREGATES], float64
    delta: torch.Tensor  # [N, 1]
    fallback: torch.Tensor  # [N] bool: rows to solve on their full sorted breakpoints
    tv: torch.Tensor  # [N, 1]
    m_end: torch.Tensor  # [N, 1]


def _reduced_budget(budget, delta):
    return torch.where(torch.isinf(budget) | (budget <= 0), budget, (budget - delta).clamp(min=0.0))


def prepare_primal(p, q, budget, div: Divergence, normalize: bool, row_sums=None, check: bool = False,
                   xp=None) -> tuple[Prepared, torch.Tensor]:
    """Histogram, bracket and reduction of the primal; returns the reduced budget [N, 1] too.

    ``row_sums``: the float64 row sums ``(p, q)`` [N, 1] of the input check, if it made them;
    ``check``: make the input's value checks in the histogram's pass (:func:`solve_batch`);
    ``xp``: the namespace (default: :func:`mdboost.md._xp.namespace_for`).
    """
    xp = namespace_for(p, xp)
    rows, h = histogram_of(p, q, div, normalize, row_sums, check, xp)
    ev = events(xp, h, div)
    return _prepare_primal(xp, rows, h, ev, budget, div)


def _prepare_primal(xp, rows, h, ev, budget, div):
    m_lo, m_hi = bracket(ev, xp.asarray(budget.to(torch.float64).contiguous()))
    red = reduction(ev, m_lo, m_hi, div)
    # budgets at the rounding level of D_f (float64 sums of O(1) terms) are solved sorted: there
    # D_f is noise and the sorted search's breakpoints are the reference (docs/theory.md, section 4)
    rp, rq, fallback = reduced_pair(xp, rows, h, red, ((budget > 0) & (budget < NOISE_BUDGET)).reshape(-1))
    delta = xp.to_torch(red.delta)
    bp = Breakpoints(*_sorted(rp, rq, xp), rp.shape[:-1], torch.float64, namespace=xp)
    return Prepared(bp, delta, fallback, xp.to_torch(ev.tv), xp.to_torch(ev.m_end)), _reduced_budget(budget, delta)


def prepare_dual(p, q, min_acceptance, div: Divergence, normalize: bool,
                 row_sums=None, check: bool = False, xp=None) -> tuple[Prepared, torch.Tensor]:
    """Histogram and reduction of the dual at ``m = clip(1 - min_acceptance)``; returns ``m`` [N, 1]."""
    xp = namespace_for(p, xp)
    rows, h = histogram_of(p, q, div, normalize, row_sums, check, xp)
    ev = events(xp, h, div)
    tv, m_end = xp.to_torch(ev.tv), xp.to_torch(ev.m_end)
    m = torch.minimum(torch.maximum(1 - min_acceptance, m_end), tv)
    m_x = xp.asarray(m.contiguous())
    red = reduction(ev, m_x, m_x, div)
    rp, rq, fallback = reduced_pair(xp, rows, h, red)
    bp = Breakpoints(*_sorted(rp, rq, xp), rp.shape[:-1], torch.float64, namespace=xp)
    return Prepared(bp, xp.to_torch(red.delta), fallback, tv, m_end), m


def _sorted(rp, rq, xp=None):
    return _sort_rows(neutral_ratios(torch.div(rp, rq)), rp, rq, xp)


def _finish_primal(bp: Breakpoints, budget, div: Divergence, delta):
    point, _, value = bp.primal64(budget.reshape(-1), div, False, False, with_value=True)
    at_start = (point.a == 0) & (point.b == 0)
    return point, torch.where(at_start | (budget <= 0), 0.0, value + delta)


def _finish_dual(bp: Breakpoints, m, div: Divergence | None, delta, tv):
    point = bp.point64(m)
    if div is None:
        return point, None
    j, k = _locate.locate_j(bp, m), _locate.locate_k(bp, m)
    value = bp.div_at(m, j, k, div, False).clamp(min=0) + delta
    return point, torch.where(m >= tv, 0.0, value)


def sorted_dual(bp: Breakpoints, min_acceptance, div: Divergence | None):
    """The dual on full sorted breakpoints: its point (float64 [N, 1] fields) and ``D_f`` there [N, 1]."""
    m = bp.clip_mass(min_acceptance)
    return _finish_dual(bp, m, div, torch.zeros_like(m), bp.arrays().tv)


def sorted_solve(p, q, value, div: Divergence | None, dual: bool, normalize: bool, xp=None):
    """The same answer from the full sorted breakpoints (the fallback): ``(a, b, acc, D_f, tv)``, [N, 1] each."""
    bp = Breakpoints.build(p, q, validate=False, normalize=normalize, namespace=xp)
    if dual:
        point, div_value = sorted_dual(bp, value, div)
    else:
        point, div_value = _finish_primal(bp, value, div, torch.zeros_like(value))
    return (*point, div_value, bp.arrays().tv)


def _one_row_primal(rows: Rows, h: Histogram, ev, budget: float, div: Divergence, g):
    """The primal of one CPU row, its reduced pair solved by the Python-float search of
    :mod:`mdboost.md._scalar` where :func:`mdboost.md._search.primal_point` would take it:
    ``(a, b, acceptance, D_f, tv)`` as floats, the values of the batched path on a batch of one.
    """
    m_lo, m_hi = bracket(ev, np.full((1, 1), budget))
    red = reduction(ev, m_lo, m_hi, div)
    tv = float(ev.tv[0, 0])
    pair = None if 0 < budget < NOISE_BUDGET else _reduced_row(rows, h, red)
    if pair is None:  # the sorted fallback
        out = sorted_solve(rows.p, rows.q, torch.full((1, 1), budget, dtype=torch.float64), div, False,
                           rows.scale_p is not None)
        return tuple(float(x) for x in out)
    delta = float(red.delta[0, 0])
    reduced = budget if math.isinf(budget) or budget <= 0 else max(budget - delta, 0.0)
    scalar = pair[0].shape[0] <= _router.SMALL_VOCAB and not reduced < NOISE_BUDGET
    if scalar:
        row = _scalar_rows.reduced_row(*pair, div, g)
        a, b, m, value = _scalar.primal_point(row, reduced, div, g, True, floats=True)
        scalar = not _scalar.lost(m, reduced, row.tv, row.m_end)  # lost to rounding: the array search's fallbacks
    if scalar:
        acc = min(max(1.0 - m, 0.0), 1.0)
        value = 0.0 if (a == 0 and b == 0) or reduced <= 0 else value + delta
    else:  # the array search
        bp = Breakpoints(*_sorted(*(torch.from_numpy(x)[None] for x in pair)), (1,), torch.float64)
        point, value = _finish_primal(bp, torch.full((1, 1), reduced, dtype=torch.float64), div,
                                      torch.full((1, 1), delta, dtype=torch.float64))
        a, b, acc, value = (float(x) for x in (*point, value))
    return a, b, acc, 0.0 if budget <= 0 else value, tv


def solve_one(p, q, budget: float, div: Divergence, normalize: bool, row_sums=None, check: bool = False):
    """The primal of one CPU row ``[..., V]`` (one row in all) as Python floats
    ``(a, b, acceptance, D_f, tv)``: :func:`solve_rows` on it, the same values, without tensors
    for the outputs (the route :data:`mdboost.md._router.BUCKETED_ROW`: a generator with a scalar
    form, :attr:`mdboost.md.divergences.Divergence.g_float`)."""
    g = div.g_float
    vocab = p.shape[-1]
    rows, h = histogram_of(p.reshape(1, vocab), q.reshape(1, vocab), div, normalize, row_sums, check)
    return _one_row_primal(rows, h, events(NUMPY, h, div), budget, div, g)


def solve_rows(p, q, value, div: Divergence | None, dual: bool, normalize: bool, row_sums=None,
               check: bool = False, xp=None):
    """Exact primal (``value`` = budget) or dual (``value`` = min acceptance) on [N, V] rows.

    Returns ``(a, b, acceptance, D_f, tv)`` as float64 [N, 1] tensors (``D_f`` None for a dual
    without divergence); rows whose bracketing buckets are too full are solved by
    :func:`sorted_solve` (the documented worst case). ``row_sums``, ``xp``: see :func:`prepare_primal`.
    """
    xp = namespace_for(p, xp)
    if dual:
        prep, m = prepare_dual(p, q, value, div, normalize, row_sums, check, xp)
        point, div_value = _finish_dual(prep.bp, m, div, prep.delta, prep.tv)
    else:
        rows, h = histogram_of(p, q, div, normalize, row_sums, check, xp)
        ev = events(xp, h, div)
        g = div.g_float if xp is NUMPY and p.shape[0] == 1 else None
        if g is not None:
            out = torch.tensor(_one_row_primal(rows, h, ev, float(value), div, g), dtype=torch.float64)
            return tuple(out[i:i + 1, None] for i in range(5))
        prep, reduced_budget = _prepare_primal(xp, rows, h, ev, value, div)
        point, div_value = _finish_primal(prep.bp, reduced_budget, div, prep.delta)
        div_value = torch.where(value <= 0, 0.0, div_value)
    out = [*point, div_value, prep.tv]
    rows = prep.fallback.nonzero().squeeze(-1)
    if rows.numel():
        sub = sorted_solve(p[rows], q[rows], value[rows], div, dual, normalize, xp)
        for dst, src in zip(out, sub):
            if dst is not None:
                dst[rows] = src
    return tuple(out)


def solve_batch(p, q, value, div: Divergence | None, dual: bool, normalize: bool, row_sums=None,
                check: bool = False, xp=None):
    """:func:`solve_rows` on ``[..., V]`` rows with ``value`` [...]: ``(a, b, acceptance, D_f, sd_acceptance)``.

    Outputs have shape [...] in ``p``'s dtype (``D_f`` None for a dual without divergence).
    ``row_sums``: the float64 row sums ``(p, q)`` [...] of the input check (used when ``normalize``);
    ``check``: the input's value checks are made in the histogram's pass
    (:func:`mdboost.md._histogram.histogram_of`); ``xp``: see :func:`prepare_primal`.
    """
    vocab = p.shape[-1]
    shape = p.shape[:-1]
    a, b, acc, value, tv = solve_rows(p.reshape(-1, vocab), q.reshape(-1, vocab),
                                      value.reshape(-1, 1).to(torch.float64), div, dual, normalize, row_sums, check,
                                      xp)
    a, b = point_to_dtype(a.reshape(shape), b.reshape(shape), p.dtype)  # towards pi = q: the budget holds
    out = (acc, None if value is None else value.clamp(min=0), (1 - tv).clamp(0.0, 1.0))
    return (a, b) + tuple(None if x is None else x.reshape(shape).to(p.dtype) for x in out)
