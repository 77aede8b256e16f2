"""Sorted rows and their prefix sums: the arithmetic under :class:`~mdboost.md.breakpoints.Breakpoints`.

The sort of ``r = p / q`` (:func:`_sort_rows`) and the float64 cumulative sums over the sorted
rows -- ``P_pre``, ``Q_pre``, the mass prefix and the ``q_i g(r_i)`` prefix of a divergence --
in torch, blocked over rows for full vocabularies, and their numpy twins for small CPU rows
(:func:`mdboost.md._router.numpy_sums`), where a tiny torch op costs more than its arithmetic.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from mdboost.md._router import numpy_ok
from mdboost.md.divergences import Divergence

ACC_DTYPE = torch.float64


def _cumsum_np(x: np.ndarray, flip_in: bool = False, flip_out: bool = False) -> torch.Tensor:
    """``np.cumsum(x, -1)`` of a float64 [N, W] array (of ``x[:, ::-1]`` if ``flip_in``; the result
    read backwards if ``flip_out``) as a tensor sharing nothing with ``x``.

    torch's CPU cumsum adds each row left to right in float64 as numpy's does (the same values,
    bit for bit) but runs several times faster over [N, W] rows.
    """
    t = torch.from_numpy(np.ascontiguousarray(x))
    if flip_in:
        t = t.flip(-1)
    out = torch.cumsum(t, -1)
    return out.flip(-1) if flip_out else out


def _cumsums_np(p, q):  # [N, V] float64 x2 -> 4 x [N, V + 1]: the numpy twin of :func:`_cumsums`
    n, vocab = p.shape
    outs = [np.empty((n, vocab + 1)) for _ in range(4)]
    for out, src, flip in zip(outs, (p, q, p, q), (False, False, True, True)):
        out[:, 0] = 0
        t = torch.from_numpy(np.ascontiguousarray(src))
        torch.cumsum(t.flip(-1) if flip else t, -1, out=torch.from_numpy(out)[:, 1:])
    return outs


def _prefix_sums_np(r, q, ratio, n_lt, n_le, div: Divergence) -> np.ndarray:  # [N, V] each -> [N, V + 1]
    """The numpy twin of :func:`_prefix_sums` (one block: small rows)."""
    n, vocab = r.shape
    with np.errstate(all="ignore"):  # inf and NaN terms as in torch (masked below)
        if div.forms.g_ratio is not None:  # the closed form on the float64 ratios
            terms = q * div.forms.g_ratio(ratio, np)
        else:
            z = np.nan_to_num(r.astype(np.float64), posinf=1.0)
            terms = q * div.g_numpy(z)
    mid = np.zeros((n, vocab + 1))
    lo_w, hi_s = int(n_lt.max()), int(n_le.min())
    low = np.where(r[:, :lo_w] < 1, terms[:, :lo_w], 0.0)
    mid[:, :lo_w] = _cumsum_np(low, flip_in=True, flip_out=True).numpy()  # [k] = sum_{k <= i < n_lt}
    rh = r[:, hi_s:]
    high = np.where((rh > 1) & (rh < math.inf), terms[:, hi_s:], 0.0)
    mid[:, hi_s + 1:] += _cumsum_np(high).numpy()  # [j] = sum_{n_le <= i < j}, 0 up to n_le
    return mid


def neutral_ratios(r):
    """The ratios ``r = p / q`` (numpy array or torch tensor) made canonical, in place: ``0 / 0``
    (NaN) is 1 (neutral), and ``p / -0.0`` (``-inf``) is ``+inf``: a negative zero of ``q`` is a zero
    of the target like ``+0.0`` (docs/theory.md, section 4). Returns ``r``."""
    if torch.is_tensor(r):
        return r.nan_to_num_(nan=1.0, posinf=math.inf, neginf=math.inf)
    np.copyto(r, 1.0, where=r != r)
    if r.size and r.min() == -math.inf:
        np.copyto(r, math.inf, where=r == -math.inf)
    return r


def _sort_rows(r, p, q, namespace=None):  # [N, V] each -> r, p, q permuted so that r is ascending
    """Sort rows of ``r >= 0`` (``+inf`` allowed, no NaN) and permute ``p``, ``q`` alike.

    On CPU this sorts packed integer keys (the float's bits, whose order is the float order for
    non-negative values, then the index) with numpy's vectorised sort, several times faster than
    ``torch.sort``, and gathers with one flat ``np.take`` per array. For float64 the lowest
    ``ceil(log2 V)`` mantissa bits make room for the index, so ratios within a relative
    ``2^(ceil(log2 V) - 52)`` of each other may be swapped: a change of the sums far below the
    solver's tolerance, and none across ``r = 1`` or ``r = inf`` (their low bits are zero).
    Other devices use ``torch.sort``, and so does ``namespace=TORCH`` (:mod:`mdboost.md._router`).
    """
    n, vocab = r.shape
    if not numpy_ok(r, namespace) or r.dtype not in (torch.float32, torch.float64) or vocab >= 1 << 31:
        r_sorted, order = torch.sort(r, dim=-1)
        return r_sorted, torch.gather(p, -1, order), torch.gather(q, -1, order)
    rn = r.contiguous().numpy()
    if r.dtype == torch.float32:
        shift = 32
        key = rn.view(np.int32).astype(np.int64) << shift
    else:
        shift = max(1, (vocab - 1).bit_length())
        key = rn.view(np.int64) & ~np.int64((1 << shift) - 1)
    key |= np.arange(vocab, dtype=np.int64)
    key.sort(axis=-1)
    r_sorted = (key >> shift).astype(np.int32).view(np.float32) if r.dtype == torch.float32 else None
    flat = key  # reused in place: index bits, then flat offsets (one fewer full-size array)
    flat &= (1 << shift) - 1
    flat += (np.arange(n, dtype=np.int64) * vocab)[:, None]
    if r_sorted is None:
        r_sorted = np.take(rn, flat)
    p_sorted = np.take(p.contiguous().numpy(), flat)
    return torch.from_numpy(r_sorted), torch.from_numpy(p_sorted), torch.from_numpy(np.take(q.contiguous().numpy(), flat))


BLOCK_ELEMS = 1 << 17  # rows per block in full-vocabulary passes: ~1 MiB of float64, cache resident


def _blocks(n: int, vocab: int):
    step = max(1, BLOCK_ELEMS // max(vocab, 1))
    return [slice(s, min(n, s + step)) for s in range(0, n, step)]


def _empty_sums(n: int, vocab: int, count: int, like: torch.Tensor):
    """``count`` separate [N, V + 1] float64 arrays with a leading 0 column.

    Separate arrays, not one stacked tensor: allocations above glibc's mmap threshold (32 MiB)
    come back as fresh pages on every call, and faulting them in costs more than the sums.
    """
    outs = [torch.empty((n, vocab + 1), dtype=ACC_DTYPE, device=like.device) for _ in range(count)]
    for out in outs:
        out[:, 0] = 0
    return outs


def _cumsums(p: torch.Tensor, q: torch.Tensor):  # [N, V] x2 -> 4 x [N, V+1]
    """``cumsum(p), cumsum(q), cumsum(flip(p)), cumsum(flip(q))``, each with a leading 0.

    Computed in row blocks that stay in cache (one 2-D cumsum over a large array is several
    times slower on CPU than the same work block by block).
    """
    n, vocab = p.shape
    outs = _empty_sums(n, vocab, 4, p)
    for blk in _blocks(n, vocab):
        for src, fwd, rev in ((p[blk], outs[0], outs[2]), (q[blk], outs[1], outs[3])):
            fwd[blk, 1:] = torch.cumsum(src, -1)
            rev[blk, 1:] = torch.cumsum(torch.flip(src, [-1]), -1)
    return tuple(outs)


def _prefix_sums(r, q, ratio, n_lt, n_le, div: Divergence) -> torch.Tensor:  # [N, V] each -> [N, V+1]
    """Range sums of ``q_i g(r_i)`` anchored at ``r = 1`` in one array (see :meth:`Breakpoints.prefix`).

    A generator with a closed form on the float64 ratios (``div.forms.g_ratio``; KL:
    ``q g(r) = q (r log r - r + 1)`` with one ``log``, ``r = 0`` gives ``q``) takes it.
    """
    n, vocab = r.shape
    (mid,) = _empty_sums(n, vocab, 1, r)
    for blk in _blocks(n, vocab):
        rb, qb, zb = r[blk], q[blk], ratio[blk]
        if div.forms.g_ratio is not None:
            terms = qb * div.forms.g_ratio(zb, torch)
        else:
            # q_i = 0 gives 0 * g(1) = 0; an overflowed ratio (q_i tiny) is treated as q_i = 0
            terms = qb * div.g(torch.nan_to_num(rb.to(ACC_DTYPE), posinf=1.0))
        # only columns that can be < n_lt (low part) or > n_le (high part) in this block
        lo_w, hi_s = int(n_lt[blk].max()), int(n_le[blk].min())
        low = torch.flip(torch.where(rb[:, :lo_w] < 1, terms[:, :lo_w], 0.0), [-1])
        mid[blk, :lo_w] = torch.flip(torch.cumsum(low, -1), [-1])  # [k] = sum_{k <= i < n_lt}
        mid[blk, lo_w:] = 0
        rh = rb[:, hi_s:]
        high = torch.where((rh > 1) & (rh < math.inf), terms[:, hi_s:], 0.0)
        mid[blk, hi_s + 1:] += torch.cumsum(high, -1)  # [j] = sum_{n_le <= i < j}, 0 up to n_le
    return mid


def _mass_sums(q, n_le) -> torch.Tensor:  # [N, V], [N, 1] -> [N, V + 1]
    """Range sums of ``q_i`` anchored at ``n_le`` in one array (see :meth:`Breakpoints.mass_prefix`)."""
    n, vocab = q.shape
    (mass,) = _empty_sums(n, vocab, 1, q)
    idx = torch.arange(vocab, device=q.device)
    for blk in _blocks(n, vocab):
        qb, le = q[blk], n_le[blk]
        lo_w, hi_s = int(le.max()), int(le.min())
        low = torch.flip(torch.where(idx[:lo_w] < le, qb[:, :lo_w], 0.0), [-1])
        mass[blk, :lo_w] = torch.flip(torch.cumsum(low, -1), [-1])  # [k] = sum_{k <= i < n_le}
        mass[blk, lo_w:] = 0
        high = torch.where(idx[hi_s:] >= le, qb[:, hi_s:], 0.0)
        mass[blk, hi_s + 1:] += torch.cumsum(high, -1)  # [j] = sum_{n_le <= i < j}, 0 up to n_le
    return mass


def _bcast(col: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-row [N, 1] tensor viewed to broadcast against [N, ...]."""
    return col.reshape((col.shape[0],) + (1,) * (like.ndim - 1))
