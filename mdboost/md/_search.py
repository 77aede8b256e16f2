"""Batched searches over the breakpoints of C(p, q) (used by :mod:`mdboost.md.breakpoints`).

Searches run on every row at once (the segment searches a fixed number of iterations; the
secant refinement checks convergence once per round):

- :func:`first_true`: a ``FANOUT``-ary search over sorted positions, ``O(log V)`` iterations of
  tiny tensor ops; it locates the segment containing an excess mass ``m`` without any O(V)
  auxiliary array (:func:`locate_j`, :func:`locate_k`).
- :func:`primal`: the segment where ``D_f`` crosses the budget. For small vocabularies
  (``<= SMALL_VOCAB``, e.g. a top-k restriction, Lemma 6.1) ``D_f`` is evaluated at every
  breakpoint at once (one batched call, two ``searchsorted``); above, a ``LARGE_FANOUT``-ary
  search over the A-breakpoints, each knot's B segment found by one ``searchsorted`` on the
  precomputed B-breakpoint values, then the same search over the B-breakpoints inside it.
  Inside the segment ``D_f`` is an ``O(1)`` closed form; :func:`_refine` finds the crossing by a
  bracketed, safeguarded secant search (a first uniform grid, then secant + ladder + midpoint
  rounds) down to 2^-50 of the segment, keeping the side with ``D_f <= budget``.
- :func:`_primal_small_np`: the exact primal of a small vocabulary on CPU (e.g. ``verify`` with
  ``top_k``) in float64 numpy, where a tiny op costs far less than in torch: ``D_f`` at every
  ``STRIDE``-th sorted breakpoint, then at every breakpoint of the stride holding the crossing,
  then :func:`_refine`'s rounds (:func:`_refine_np`). Other devices and the bound use torch.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from mdboost.md.divergences import GENERATORS

FANOUT = 16
LARGE_FANOUT = 64  # primal segment search: fewer rounds of slightly wider tiny ops
GRID = 32  # _refine: uniform points of its first round
MAX_ROUNDS = 64  # _refine: the midpoint alone halves the bracket, so 2^-50 is reached well before
LADDER = 12  # _refine: probes at x +- width * 4^-i, i = 1..LADDER, around the secant point x
_LADDER = 4.0 ** -torch.arange(1, LADDER + 1, dtype=torch.float64)
SMALL_VOCAB = 2048
STRIDE = 16  # numpy small path: coarse stride of the knot search
NUMPY_SMALL = True  # exact primal of a small CPU vocabulary in numpy float64 (cheap per-op cost)


def _iters(vocab: int, fanout: int = FANOUT) -> int:
    return max(1, math.ceil(math.log(vocab + 1) / math.log(fanout))) + 1


def first_true(lo: torch.Tensor, hi: torch.Tensor, pred, vocab: int, fanout: int = FANOUT) -> torch.Tensor:
    """Smallest index in ``[lo, hi]`` where the monotone ``pred`` holds (``pred(hi)`` assumed).

    ``lo``, ``hi``: long tensors of one shape [N, ...]; ``pred`` maps candidate indices of shape
    [N, ..., FANOUT + 1] to booleans.
    """
    steps = torch.arange(fanout + 1, device=lo.device)
    for _ in range(_iters(vocab, fanout)):
        cand = lo.unsqueeze(-1) + ((hi - lo).unsqueeze(-1) * steps) // fanout
        t = pred(cand) | (cand >= hi.unsqueeze(-1))
        first = t.long().argmax(-1, keepdim=True)  # the first True
        prev = cand.gather(-1, (first - 1).clamp(min=0)).squeeze(-1)
        lo = torch.where(first.squeeze(-1) > 0, prev + 1, lo)
        hi = cand.gather(-1, first).squeeze(-1)
    return hi


def _col(col: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return col.reshape((col.shape[0],) + (1,) * (like.ndim - 1)).expand(like.shape)


def locate_j(bp, m: torch.Tensor) -> torch.Tensor:
    """A segment of ``m``: smallest ``j`` in ``[n_le, j_max]`` with ``knot_a(j) <= m``."""
    mm = m.unsqueeze(-1)
    return first_true(_col(bp._n_le, m), _col(bp._j_max, m), lambda j: bp.knot_a(j) <= mm, bp.vocab)


def locate_k(bp, m: torch.Tensor) -> torch.Tensor:
    """B segment of ``m``: smallest ``k`` in ``[1, n_lt]`` with ``knot_b(k) >= m`` (0 if n_lt = 0)."""
    mm = m.unsqueeze(-1)
    lo = _col(bp._n_lt.clamp(max=1), m)
    return first_true(lo, _col(bp._n_lt, m), lambda k: bp.knot_b(k) >= mm, bp.vocab)


def _b_knots(bp):
    """Monotone B-breakpoint values ``[N, L]`` (``L = max n_lt + 1``) for ``searchsorted``.

    ``kb[k] = knot_b(k)`` for ``k <= n_lt`` (made non-decreasing against rounding), ``+inf`` after.
    """
    vocab = bp._r.shape[1]
    width = int(bp._n_lt.max()) + 1
    cols = min(width, vocab)  # contiguous slices instead of gathers: knot_b(k) for k < n_lt
    m_b = bp._ratio[:, :cols] * bp._cq[:, :cols] - bp._cp[:, :cols]
    if cols < width:
        m_b = torch.cat([m_b, torch.zeros_like(m_b[:, :1])], -1)
    idx = torch.arange(width, device=bp._r.device)
    kb = torch.where(idx > bp._n_lt, math.inf, torch.where(idx == bp._n_lt, bp._tv, m_b))
    return torch.cummax(kb, -1).values.contiguous()


def _locate_k_sorted(bp, kb, m):
    """B segment of ``m`` [N, ...] by one ``searchsorted`` (same result as :func:`locate_k`)."""
    flat = m.reshape(m.shape[0], -1).contiguous()
    k = torch.searchsorted(kb, flat).clamp(min=1)
    return torch.minimum(k, bp._n_lt).reshape(m.shape)


def _bracket_large(bp, budget, div, bound, kb):
    """A-breakpoint search (each knot's B segment by ``searchsorted``), then the B-breakpoints inside."""
    big_budget = budget.unsqueeze(-1)

    def pred_a(j):
        m = bp.knot_a(j)
        return bp.div_at(m, j, _locate_k_sorted(bp, kb, m), div, bound) > big_budget

    j = first_true(bp._n_le.clone(), bp._j_max.clone(), pred_a, bp.vocab, LARGE_FANOUT)
    m_lo = bp.knot_a(j)
    m_hi = torch.where(j > bp._n_le, bp.knot_a((j - 1).clamp(min=0)), bp._tv)

    def pred_b(k):
        m = torch.minimum(torch.maximum(bp.knot_b(k), m_lo.unsqueeze(-1)), m_hi.unsqueeze(-1))
        return bp.div_at(m, j.unsqueeze(-1).expand(k.shape), k, div, bound) <= big_budget

    k_lo, k_hi = _locate_k_sorted(bp, kb, torch.cat([m_lo, m_hi], -1)).unbind(-1)
    k = first_true(k_lo.unsqueeze(-1), k_hi.unsqueeze(-1), pred_b, bp.vocab, LARGE_FANOUT)
    top = torch.minimum(torch.maximum(bp.knot_b(k), m_lo), m_hi)
    bot = torch.where(k > 0, bp.knot_b((k - 1).clamp(min=0)), m_lo)
    return torch.minimum(torch.maximum(bot, m_lo), top), top, (j, k)


def _sorted_knots(bp):
    """Breakpoint values at every position, and monotone copies for ``searchsorted``."""
    n, vocab = bp._r.shape
    idx = torch.arange(vocab + 1, device=bp._r.device).expand(n, vocab + 1)
    m_a, m_b = bp.knot_a(idx), bp.knot_b(idx)  # [N, V+1]
    kb = torch.cummax(torch.where(idx > bp._n_lt, math.inf, m_b), -1).values.contiguous()
    neg = torch.where(idx < bp._n_le, -math.inf, torch.where(idx > bp._j_max, math.inf, -m_a))
    return idx[:, :vocab], m_a[:, :vocab], m_b[:, :vocab], kb, torch.cummax(neg, -1).values.contiguous()


def _sorted_locate(bp, kb, neg_ka, m):
    """``(j, k)`` of ``m`` [N, Q] by ``searchsorted`` on the monotone breakpoint arrays."""
    k = torch.minimum(torch.searchsorted(kb, m.contiguous()).clamp(min=1), bp._n_lt)
    j = torch.searchsorted(neg_ka, (-m).contiguous())
    return torch.minimum(torch.maximum(j, bp._n_le), bp._j_max), k


def _bracket_small(bp, knots, budget, div, bound):
    """``D_f`` at every breakpoint at once; the bracket is the pair of neighbouring knots.

    A- and B-knots go through one concatenated ``div_at`` call [N, 2V] (fewer tiny ops).
    """
    idx, m_a, m_b, kb, neg_ka = knots
    m_b = torch.minimum(torch.maximum(m_b, bp._m_end), bp._tv)
    k_a = torch.minimum(torch.searchsorted(kb, m_a.contiguous()).clamp(min=1), bp._n_lt)
    j_b = torch.minimum(torch.maximum(torch.searchsorted(neg_ka, (-m_b).contiguous()), bp._n_le), bp._j_max)
    m_all = torch.cat([m_a, m_b], -1)  # [N, 2V]
    valid = torch.cat([(idx >= bp._n_le) & (idx < bp._j_max), (idx >= 1) & (idx < bp._n_lt)], -1)
    big = bp.div_at(m_all, torch.cat([idx, j_b], -1), torch.cat([k_a, idx], -1), div, bound) > budget
    m_lo = torch.where(valid & big, m_all, -math.inf).max(-1, keepdim=True).values
    m_hi = torch.where(valid & ~big, m_all, math.inf).min(-1, keepdim=True).values
    m_lo = torch.maximum(bp._m_end, m_lo)
    m_hi = torch.minimum(bp._tv, m_hi)
    m_lo = torch.minimum(m_lo, m_hi)
    return m_lo, m_hi, _sorted_locate(bp, kb, neg_ka, (m_lo + m_hi) / 2)


def _refine(bp, seg, lo, hi, budget, div, bound):
    """Bracketed secant search for the crossing inside one segment; returns the ``D <= budget`` side.

    ``h(m) = D(m) - budget`` decreases in ``m``; the bracket ``[lo, hi]`` keeps ``h(lo) > 0 >= h(hi)``.
    The first round evaluates a uniform grid of ``GRID + 1`` points (ends included: a segment that
    fits entirely collapses to ``lo``, one that does not fit at all to ``hi``). Each later round
    evaluates, in one batched call, the secant point ``x`` of the bracket, a ladder
    ``x +- (hi - lo) 4^-i`` (``i = 1..LADDER``) and the midpoint, and keeps the tightest bracket:
    its width is then within a factor 4 of the secant's error, so the next secant is much better
    (superlinear, like the secant method), while the midpoint guarantees at least halving.
    Stops once every row is within ``2^-50`` of its segment or a few ulps of ``m``.
    """
    tol = torch.maximum((hi - lo) * 2.0 ** -50, hi.abs() * 8 * torch.finfo(hi.dtype).eps)
    h_lo, h_hi = torch.ones_like(lo), -torch.ones_like(hi)  # placeholders until a point is kept
    ladder = torch.cat([-_LADDER, _LADDER, torch.zeros(1, dtype=torch.float64)]).to(lo.device, lo.dtype)
    grid = torch.linspace(0, 1, GRID + 1, dtype=lo.dtype, device=lo.device)
    for rnd in range(MAX_ROUNDS):
        width = hi - lo
        if rnd == 0:
            pts = torch.where(grid < 1, lo + width * grid, hi)  # [N, GRID + 1], exact ends
        else:
            if bool((width <= tol).all()):
                break
            x = lo + width * (h_lo / (h_lo - h_hi))
            x = torch.where(torch.isfinite(x), x, lo + width / 2)
            pts = torch.cat([x + width * ladder, lo + width / 2], -1).clamp(min=lo, max=hi)  # [N, 2 LADDER + 2]
        h = bp.div_on(pts, seg, div, bound) - budget
        above = h > 0
        new_lo, i_lo = torch.where(above, pts, -math.inf).max(-1, keepdim=True)
        new_hi, i_hi = torch.where(above, math.inf, pts).min(-1, keepdim=True)
        take_lo, take_hi = new_lo >= lo, new_hi <= hi
        lo = torch.where(take_lo, new_lo, lo)
        h_lo = torch.where(take_lo, h.gather(-1, i_lo), h_lo)
        hi = torch.where(take_hi, new_hi, hi)
        h_hi = torch.where(take_hi, h.gather(-1, i_hi), h_hi)
        if rnd == 0:
            hi = torch.where(above.all(-1, keepdim=True), lo, hi)  # nothing fits: the answer is hi
            lo = torch.where(above.any(-1, keepdim=True), lo, hi)  # everything fits: the answer is lo
    return hi


def primal(bp, budget: torch.Tensor, div, bound: bool):
    """Largest-acceptance point with ``D_f`` (or its bound) ``<= budget``; budget of shape [N, 1].

    Returns the excess mass ``m`` [N, 1] and the constants of its segment.
    """
    m_end, tv = bp._m_end, bp._tv
    small = bp.vocab <= SMALL_VOCAB
    if small and NUMPY_SMALL and not bound and bp._r.device.type == "cpu" and not bp._cp.requires_grad:
        return _primal_small_np(bp, budget, div)
    knots = _sorted_knots(bp) if small else None
    kb = knots[3] if small else _b_knots(bp)
    k_end = _locate_k_sorted(bp, kb, m_end)
    d_end = bp.div_at(m_end, bp._j_max, k_end, div, bound)
    inner = torch.where((budget > 0) & (budget < d_end), budget, d_end / 2)  # keeps the search well posed
    if small:
        m_lo, m_hi, (j, k) = _bracket_small(bp, knots, inner, div, bound)
    else:
        m_lo, m_hi, (j, k) = _bracket_large(bp, inner, div, bound, kb)
    at_end = (budget >= d_end) & (budget > 0)  # the end fits: a one-point bracket on its segment
    m_lo, m_hi = torch.where(at_end, m_end, m_lo), torch.where(at_end, m_end, m_hi)
    j, k = torch.where(at_end, bp._j_max, j), torch.where(at_end, k_end, k)
    seg = bp.segment(j, k, div, bound)
    m = _refine(bp, seg, m_lo, m_hi, torch.where(at_end, budget, inner), div, bound)
    return torch.where(budget <= 0, tv, torch.where(at_end, m_end, m)), seg


def _np_take(arr, idx):
    """``arr[n, idx[n, :]]`` for a C-contiguous ``arr`` [N, L] (one flat take, no per-call index grids)."""
    rows, width = arr.shape
    return np.take(arr, idx + np.arange(0, rows * width, width)[:, None])


class _NpCurve:
    """Float64 numpy views of a CPU :class:`Breakpoints` (small vocabularies: per-op overhead dominates)."""

    def __init__(self, bp, div):
        self.v = bp.vocab
        self.cp, self.cq, self.rp, self.rq = (x.numpy() for x in (bp._cp, bp._cq, bp._rp, bp._rq))
        self.ratio = bp._ratio.to(torch.float64).numpy()
        self.n_lt, self.n_le, self.j_max = bp._n_lt.numpy(), bp._n_le.numpy(), bp._j_max.numpy()
        self.tv, self.m_end = bp._tv.numpy(), bp._m_end.numpy()
        self.mid = bp.prefix(div).numpy()
        self.div = div
        kl = GENERATORS["kl"]  # the built-in KL: its g(z) = z log z - (z - 1) directly in numpy
        self.kl = div.f is kl.f and div.fprime_one == kl.fprime_one and div.standardize

    def segment(self, j, k):
        qa, qb = _np_take(self.rq, self.v - j), _np_take(self.cq, k)
        with np.errstate(divide="ignore"):
            inv_qa, inv_qb = np.where(qa > 0, 1 / qa, 0.0), np.where(qb > 0, 1 / qb, 0.0)
        return {"pa": _np_take(self.rp, self.v - j), "pb": _np_take(self.cp, k), "qa": qa, "qb": qb,
                "inv_qa": inv_qa, "inv_qb": inv_qb, "has_b": (qb > 0).astype(np.float64),
                "mid": _np_take(self.mid, k) + _np_take(self.mid, j)}

    def div_on(self, m, seg):
        a = np.maximum((seg["pa"] - m) * seg["inv_qa"] - 1, 0.0)
        b = np.clip((1 - (m + seg["pb"]) * seg["inv_qb"]) * seg["has_b"], 0.0, 1.0)
        z = np.stack([1 + a, 1 - b])
        if self.kl:
            g = np.where(z > 0, z * np.log(z), 0.0) - (z - 1.0)
        else:
            g = self.div.g(torch.from_numpy(z)).numpy()
        with np.errstate(invalid="ignore"):
            ta = np.where(seg["qa"] > 0, seg["qa"] * g[0], 0.0)
            tb = np.where(seg["qb"] > 0, seg["qb"] * g[1], 0.0)
        return ta + tb + seg["mid"]

    def div_at(self, m, j, k):
        return self.div_on(m, self.segment(j, k))


def _ss(sorted_arr, x):  # row-wise searchsorted (left) through torch: numpy has no batched one
    return torch.searchsorted(torch.from_numpy(sorted_arr), torch.from_numpy(np.ascontiguousarray(x))).numpy()


def _primal_small_np(bp, budget, div):
    """:func:`primal` (exact mode) for a small vocabulary on CPU, in float64 numpy.

    Same steps as the torch path (``D_f`` at every breakpoint, then :func:`_refine`'s rounds),
    with numpy's much cheaper per-op cost on these [N, ~2V] arrays.
    """
    with np.errstate(divide="ignore", invalid="ignore"):  # inf budgets / inf terms, as in torch
        return _primal_np(_NpCurve(bp, div), bp, budget.to(torch.float64).numpy())


def _primal_np(c, bp, budget):
    n, v = bp._r.shape
    idx = np.broadcast_to(np.arange(v + 1), (n, v + 1))
    ratio = np.concatenate([c.ratio, c.ratio[:, -1:]], 1)  # knot_a / knot_b at every index, by slices
    m_a = np.where(idx >= c.j_max, c.m_end, c.rp[:, ::-1] - ratio * c.rq[:, ::-1])
    m_a = np.minimum(np.maximum(m_a, c.m_end), c.tv)
    m_b = np.where(idx >= c.n_lt, c.tv, ratio * c.cq - c.cp)
    kb = np.maximum.accumulate(np.where(idx > c.n_lt, math.inf, m_b), 1)
    neg_ka = np.maximum.accumulate(np.where(idx < c.n_le, -math.inf, np.where(idx > c.j_max, math.inf, -m_a)), 1)

    def locate(m):
        k = np.minimum(np.maximum(_ss(kb, m), 1), c.n_lt)
        j = np.minimum(np.maximum(_ss(neg_ka, -m), c.n_le), c.j_max)
        return j, k

    k_end = np.minimum(np.maximum(_ss(kb, c.m_end), 1), c.n_lt)
    d_end = c.div_at(c.m_end, c.j_max, k_end)
    inner = np.where((budget > 0) & (budget < d_end), budget, d_end / 2)
    # bracket: the neighbouring knots around the crossing, by D_f at every STRIDE-th sorted knot
    # (D_f decreases in m), then at every knot of the one stride that holds the crossing
    idx_v, m_a, m_b = idx[:, :v], m_a[:, :v], np.minimum(np.maximum(m_b[:, :v], c.m_end), c.tv)
    # m_a decreases along the sorted order and m_b increases: reversed A then B is a few sorted
    # runs, which a stable (tim)sort merges in about linear time
    valid = np.concatenate([((idx_v >= c.n_le) & (idx_v < c.j_max))[:, ::-1], (idx_v >= 1) & (idx_v < c.n_lt)], -1)
    knots = np.sort(np.where(valid, np.concatenate([m_a[:, ::-1], m_b], -1), math.inf), -1, kind="stable")  # [N, 2V]
    last = np.maximum(valid.sum(-1, keepdims=True) - 1, 0)

    def big_at(cols):
        m = np.where(np.isfinite(knots[:, :1]), _np_take(knots, np.minimum(cols, last)), c.tv)
        return m, c.div_at(m, *locate(m)) > inner

    steps = np.arange(0, 2 * v + STRIDE, STRIDE)
    _, big = big_at(np.broadcast_to(steps, (n, steps.size)))
    start = steps[np.maximum(big.sum(-1, keepdims=True) - 1, 0)]
    m_fine, big = big_at(start + np.arange(STRIDE + 1))
    m_lo = np.maximum(c.m_end, np.where(big, m_fine, -math.inf).max(-1, keepdims=True))
    m_hi = np.minimum(c.tv, np.where(big, math.inf, m_fine).min(-1, keepdims=True))
    m_lo = np.minimum(m_lo, m_hi)
    j, k = locate((m_lo + m_hi) / 2)
    at_end = (budget >= d_end) & (budget > 0)
    m_lo, m_hi = np.where(at_end, c.m_end, m_lo), np.where(at_end, c.m_end, m_hi)
    j, k = np.where(at_end, c.j_max, j), np.where(at_end, k_end, k)
    seg = c.segment(j, k)
    m = _refine_np(c, seg, m_lo, m_hi, np.where(at_end, budget, inner))
    m = np.where(budget <= 0, c.tv, np.where(at_end, c.m_end, m))
    keys = ("pa", "pb", "inv_qa", "inv_qb", "has_b")
    out = {key: torch.from_numpy(seg[key]) for key in keys}
    out["value"] = torch.from_numpy(c.div_on(m, seg))  # D_f at m (what the search kept: <= budget)
    return torch.from_numpy(m), out


def _refine_np(c, seg, lo, hi, budget):
    """:func:`_refine` in numpy (same rounds, same bracket rules)."""
    tol = np.maximum((hi - lo) * 2.0 ** -50, np.abs(hi) * 8 * np.finfo(np.float64).eps)
    h_lo, h_hi = np.ones_like(lo), -np.ones_like(hi)
    ladder = np.concatenate([-_LADDER.numpy(), _LADDER.numpy(), [0.0]])
    grid = np.linspace(0, 1, GRID + 1)
    for rnd in range(MAX_ROUNDS):
        width = hi - lo
        if rnd == 0:
            pts = np.where(grid < 1, lo + width * grid, hi)
        else:
            if (width <= tol).all():
                break
            with np.errstate(divide="ignore", invalid="ignore"):
                x = lo + width * (h_lo / (h_lo - h_hi))
            x = np.where(np.isfinite(x), x, lo + width / 2)
            pts = np.clip(np.concatenate([x + width * ladder, lo + width / 2], -1), lo, hi)
        h = c.div_on(pts, seg) - budget
        above = h > 0
        cand_lo, cand_hi = np.where(above, pts, -math.inf), np.where(above, math.inf, pts)
        i_lo, i_hi = cand_lo.argmax(-1)[:, None], cand_hi.argmin(-1)[:, None]
        new_lo, new_hi = _np_take(cand_lo, i_lo), _np_take(cand_hi, i_hi)
        take_lo, take_hi = new_lo >= lo, new_hi <= hi
        lo, h_lo = np.where(take_lo, new_lo, lo), np.where(take_lo, _np_take(h, i_lo), h_lo)
        hi, h_hi = np.where(take_hi, new_hi, hi), np.where(take_hi, _np_take(h, i_hi), h_hi)
        if rnd == 0:
            hi = np.where(above.all(-1, keepdims=True), lo, hi)
            lo = np.where(above.any(-1, keepdims=True), lo, hi)
    return hi
