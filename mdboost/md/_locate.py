"""Where a point lies on the curve C(p, q), by a fanout search over the sorted breakpoints (torch).

- :func:`first_true`: a ``FANOUT``-ary search over sorted positions, ``O(log V)`` iterations of
  tiny tensor ops; it locates the segment containing an excess mass ``m`` without any O(V)
  auxiliary array (:func:`locate_j`, :func:`locate_k`).
- :func:`bracket_large`: the primal's bracket for large vocabularies (:mod:`mdboost.md._search`):
  a ``LARGE_FANOUT``-ary search over the A-breakpoints (each knot's B segment by one
  ``searchsorted`` on the precomputed B-breakpoint values, :func:`b_knots`), then the same search
  over the B-breakpoints inside.
"""

from __future__ import annotations

import math

import torch

FANOUT = 16
LARGE_FANOUT = 64  # primal segment search: fewer rounds of slightly wider tiny ops


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
    mm, sums = m.unsqueeze(-1), bp.arrays()
    return first_true(_col(sums.n_le, m), _col(sums.j_max, m), lambda j: bp.knot_a(j) <= mm, bp.vocab)


def locate_k(bp, m: torch.Tensor) -> torch.Tensor:
    """B segment of ``m``: smallest ``k`` in ``[1, n_lt]`` with ``knot_b(k) >= m`` (0 if n_lt = 0)."""
    mm, n_lt = m.unsqueeze(-1), bp.arrays().n_lt
    lo = _col(n_lt.clamp(max=1), m)
    return first_true(lo, _col(n_lt, m), lambda k: bp.knot_b(k) >= mm, bp.vocab)


def b_knots(bp):
    """Monotone B-breakpoint values ``[N, L]`` (``L = max n_lt + 1``) for ``searchsorted``.

    ``kb[k] = knot_b(k)`` for ``k <= n_lt`` (made non-decreasing against rounding), ``+inf`` after.
    """
    vocab, sums = bp.vocab, bp.arrays()
    width = int(sums.n_lt.max()) + 1
    cols = min(width, vocab)  # contiguous slices instead of gathers: knot_b(k) for k < n_lt
    m_b = sums.ratio[:, :cols] * sums.cq[:, :cols] - sums.cp[:, :cols]
    if cols < width:
        m_b = torch.cat([m_b, torch.zeros_like(m_b[:, :1])], -1)
    idx = torch.arange(width, device=sums.ratio.device)
    kb = torch.where(idx > sums.n_lt, math.inf, torch.where(idx == sums.n_lt, sums.tv, m_b))
    return torch.cummax(kb, -1).values.contiguous()


def _locate_k_sorted(bp, kb, m):
    """B segment of ``m`` [N, ...] by one ``searchsorted`` (same result as :func:`locate_k`)."""
    flat = m.reshape(m.shape[0], -1).contiguous()
    k = torch.searchsorted(kb, flat).clamp(min=1)
    return torch.minimum(k, bp.arrays().n_lt).reshape(m.shape)


def bracket_large(bp, budget, div, bound, kb):
    """A-breakpoint search (each knot's B segment by ``searchsorted``), then the B-breakpoints inside."""
    big_budget, sums = budget.unsqueeze(-1), bp.arrays()

    def pred_a(j):
        m = bp.knot_a(j)
        return bp.div_at(m, j, _locate_k_sorted(bp, kb, m), div, bound) > big_budget

    j = first_true(sums.n_le.clone(), sums.j_max.clone(), pred_a, bp.vocab, LARGE_FANOUT)
    m_lo = bp.knot_a(j)
    m_hi = torch.where(j > sums.n_le, bp.knot_a((j - 1).clamp(min=0)), sums.tv)

    def pred_b(k):
        m = torch.minimum(torch.maximum(bp.knot_b(k), m_lo.unsqueeze(-1)), m_hi.unsqueeze(-1))
        return bp.div_at(m, j.unsqueeze(-1).expand(k.shape), k, div, bound) <= big_budget

    k_lo, k_hi = _locate_k_sorted(bp, kb, torch.cat([m_lo, m_hi], -1)).unbind(-1)
    k = first_true(k_lo.unsqueeze(-1), k_hi.unsqueeze(-1), pred_b, bp.vocab, LARGE_FANOUT)
    top = torch.minimum(torch.maximum(bp.knot_b(k), m_lo), m_hi)
    bot = torch.where(k > 0, bp.knot_b((k - 1).clamp(min=0)), m_lo)
    return torch.minimum(torch.maximum(bot, m_lo), top), top, (j, k)
