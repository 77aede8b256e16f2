"""The histogram of the linear-time solve (:mod:`mdboost.md._buckets`, step 1): fixed buckets of the ratios.

The ratios ``r_i = p_i / q_i`` fall into :data:`FINITE` fixed buckets whose edges are read off
the float64 bits (``2^PER_OCTAVE_BITS`` buckets per octave over ``[2^-64, 2^64)``, one bucket
below, one above, and :data:`INF` for ``q_i = 0``); per bucket the sums of ``p``, ``q`` and
``q g(r)`` in float64 (:func:`histogram`, one pass over the entries by row blocks). Float32 rows
take the ratio, its bucket and the log of ``kl`` / ``rkl`` in float32 (the same edges, all exact
in float32).
"""

from __future__ import annotations

import math
import sys
from typing import NamedTuple

import numpy as np
import torch

from mdboost.md._checks import _check_row_values, check_pair
from mdboost.md._sums import _blocks, neutral_ratios
from mdboost.md._xp import NUMPY, namespace_for
from mdboost.md.divergences import Divergence

PER_OCTAVE_BITS = 5  # 32 buckets per octave: a bucket spans at most a ratio of 1 + 1/32
OCTAVES = 64  # the regular buckets cover [2^-64, 2^64)
_SHIFT = 52 - PER_OCTAVE_BITS
_BASE = (1023 - OCTAVES) << PER_OCTAVE_BITS  # (bits >> _SHIFT) of 2^-64
FINITE = 2 * OCTAVES * (1 << PER_OCTAVE_BITS) + 2  # [0, 2^-64), regular buckets, [2^64, max]
INF = FINITE  # the bucket of q_i = 0 < p_i (and of ratios beyond the input dtype's range)
C1 = 1 + OCTAVES * (1 << PER_OCTAVE_BITS)  # edge index of r = 1
_TINY = 1e-300  # log(max(r, _TINY)) times p: exact 0 for p = 0, and p log r within 1e-298 otherwise
_EDGES: dict = {}


def edges(device) -> torch.Tensor:
    """The bucket edges [FINITE + 1] float64: ``e[0] = 0``, ``e[C1] = 1``, ``e[FINITE] = inf``."""
    key = str(device)
    if key not in _EDGES:
        bits = (torch.arange(FINITE - 1, dtype=torch.int64) + _BASE) << _SHIFT
        reg = bits.view(torch.float64)  # e[1..FINITE-1]: 2^-64 ... 2^64
        e = torch.cat([torch.zeros(1, dtype=torch.float64), reg, torch.full((1,), math.inf, dtype=torch.float64)])
        _EDGES[key] = e.to(device)
    return _EDGES[key]


_HI = 1 if sys.byteorder == "little" else 0  # the int32 word of a float64 holding sign, exponent, top mantissa
_INF_HI = {torch.float64: 0x7FF00000, torch.float32: 0x47F00000}  # high words from inf, and from 2^128


def bucket_index(ratio: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:  # [n, V] float64 -> [n, V] long
    """The bucket of every ratio (no NaN): :data:`INF` for ``inf`` and, for float32 inputs, from 2^128 on.

    Read off the high 32 bits of the float64 (its exponent and top mantissa bits; the order of
    non-negative floats is the order of their bits).
    """
    hi = ratio.view(torch.int32)[..., _HI::2] & 0x7FFFFFFF  # sign cleared: -0.0 is 0, -inf (p / -0.0) is inf
    idx = (hi >> (_SHIFT - 32)).sub_(_BASE - 1).clamp_(0, FINITE - 1)
    return idx.add_(hi >= _INF_HI.get(dtype, _INF_HI[torch.float32])).long()


def _terms(p, q, ratio, div: Divergence):  # q_i g(r_i), [n, V] float64 (only finite buckets are read)
    return q * div.g(torch.nan_to_num(ratio, posinf=1.0))


def _row_blocks(n: int, vocab: int, device) -> list[slice]:
    """Row blocks of the full passes: one block on accelerators, cache-sized blocks on CPU."""
    return [slice(0, n)] if device.type != "cpu" else _blocks(n, vocab)


class Rows(NamedTuple):
    """The input rows and how each block's float64 view is made (same bits in every pass)."""

    p: torch.Tensor  # [N, V] input dtype
    q: torch.Tensor
    scale_p: torch.Tensor | None  # [N, 1] float64 row sums (rows rescaled to sum to 1), or None
    scale_q: torch.Tensor | None

    def block(self, rows: slice):
        """``(p64, q64, ratio)`` [n, V] float64 of a block; ``0/0`` is 1."""
        p64, q64 = self.p[rows].to(torch.float64), self.q[rows].to(torch.float64)
        if self.scale_p is not None:
            p64, q64 = p64 / self.scale_p[rows], q64 / self.scale_q[rows]
        return p64, q64, neutral_ratios(torch.div(p64, q64))

    def block32(self, rows: slice):
        """``(p64, q64, ratio)`` of a float32 block: ``p64``, ``q64`` as in :meth:`block`, the ratio
        float32 (of the rescaled rows, ``0/0`` is 1; it overflows to ``inf`` where the input dtype does)."""
        p, q = self.p[rows], self.q[rows]
        p64, q64 = p.to(torch.float64), q.to(torch.float64)
        if self.scale_p is None:
            ratio = torch.div(p, q)
        else:
            p64, q64 = p64 / self.scale_p[rows], q64 / self.scale_q[rows]
            ratio = torch.div(p, q).mul_((self.scale_q[rows] / self.scale_p[rows]).to(torch.float32))
        return p64, q64, neutral_ratios(ratio)


def rows_of(p, q, normalize: bool, sums=None) -> Rows:
    """:class:`Rows` of ``[N, V]`` inputs; ``normalize`` rescales rows to sum to 1 in float64.

    ``sums``: the float64 row sums ``(sum p, sum q)`` ([N] or [N, 1]) if the caller has them already (the
    input check reads them), else they are taken here (one more pass over each input).
    """
    if not normalize:
        return Rows(p, q, None, None)
    if sums is None:  # rows within the sum tolerance, rescaled in float64 (docs/theory.md, section 9)
        sums = p.sum(-1, dtype=torch.float64), q.sum(-1, dtype=torch.float64)
    return Rows(p, q, *_scales(sums))


class Histogram(NamedTuple):
    """Per-row bucket sums and the bucket of every entry."""

    sums: torch.Tensor  # [3, N, FINITE + 1] float64: sums of p, of q, and of q_i g(r_i)
    index: torch.Tensor  # [N, V] int16 from the CPU pass (a quarter of the bytes to write and read back), else long

    @property
    def p(self) -> torch.Tensor:  # [N, FINITE + 1]
        return self.sums[0]

    @property
    def q(self) -> torch.Tensor:
        return self.sums[1]

    @property
    def s(self) -> torch.Tensor:
        return self.sums[2]


_F32_SHIFT = 23 - PER_OCTAVE_BITS
_F32_OFFSET = ((127 - OCTAVES) << PER_OCTAVE_BITS) - 1  # (bits >> _F32_SHIFT) of 2^-64, minus 1
_F32_INF = 0x7F800000 >> _F32_SHIFT


def _terms32(p64, q64, ratio, div: Divergence):  # q_i g(r_i) [n, V] float64 from a float32 ratio
    return q64 * div.g(torch.nan_to_num(ratio, posinf=1.0).to(torch.float64))


_TINY32 = 1e-38  # float32 counterpart of _TINY: p log(max(r, _TINY32)) is 0 for p = 0


def _index_into(ratio: torch.Tensor, out: torch.Tensor) -> None:  # [n, V] float32/64 ratio -> out [n, V] long
    """The bucket of every float32 or float64 ratio (as :func:`bucket_index`), written into ``out``.

    In int32 arithmetic only (comparisons to bool and mixed-dtype ops cost several passes more):
    ``x = clip(bits - offset, 0, x_inf)``, where ``x_inf`` is the value of ``inf``, and the ``inf``
    bucket's extra 1 is ``(x + 2^k - x_inf) >> k`` for ``2^k > x_inf``.
    """
    sign_off = 0x7FFFFFFF  # the bits with the sign cleared: -0.0 is 0 and -inf is inf (p / -0.0), as in numpy
    if ratio.dtype == torch.float32:
        t, offset, x_inf = (ratio.view(torch.int32) & sign_off) >> _F32_SHIFT, _F32_OFFSET, _F32_INF - _F32_OFFSET
    else:
        t, offset = (ratio.view(torch.int32)[..., _HI::2] & sign_off) >> (_SHIFT - 32), _BASE - 1
        x_inf = (_INF_HI[torch.float64] >> (_SHIFT - 32)) - offset
    k = x_inf.bit_length()
    t.sub_(offset).clamp_(0, x_inf)
    beyond = t.add((1 << k) - x_inf).bitwise_right_shift_(k)  # 1 for inf, else 0
    out.copy_(t.clamp_(max=FINITE - 1).add_(beyond))


def _wlogr(w64, ratio, weight: int):  # w_i log r_i [n, V] float64 (log_form): the terms less p - q
    if weight == 0:  # w = p: 0 where p_i = 0 (the clamp keeps log finite there)
        ratio = ratio.clamp(min=_TINY32 if ratio.dtype == torch.float32 else _TINY)
    return torch.log(ratio).to(torch.float64).mul_(w64)  # w = q: -inf where p_i = 0 < q_i (g(0) = inf)


def _from_log_sums(sums: torch.Tensor, sign: float, xp=None) -> None:  # [3, N, FINITE + 1], in place
    """The ``q g(r)`` sums ``sign (S - P + Q)`` from the ``w log r`` sums ``S`` (:func:`log_form`), >= 0."""
    if namespace_for(sums, xp) is NUMPY:  # the same IEEE operations on the numpy view (a tiny torch op costs more)
        x = sums.numpy()
        s = x[2]
        s[:, INF] = 0.0  # the q = 0 bucket's q g(r) is never read (inf or NaN terms there)
        s -= x[0]
        s += x[1]
        if sign < 0:
            np.negative(s, out=s)
        np.copyto(s, 0.0, where=s < 0)  # clamp_(min=0): -0.0 and NaN stay
        return
    s = sums[2]
    s[:, INF] = 0.0
    s.sub_(sums[0]).add_(sums[1])
    if sign < 0:
        s.neg_()
    s.clamp_(min=0.0)


def takes_numpy_pass(p, q, xp=None) -> bool:
    """Whether the rows ``p``, ``q`` [N, V] take the CPU pass in numpy (:func:`_histogram_np`); ``xp``
    forces the namespace (default: :func:`mdboost.md._xp.namespace_for`)."""
    return namespace_for(p, xp) is NUMPY and p.dtype in _NP_BITS and q.dtype == p.dtype


def histogram_of(p, q, div: Divergence, normalize: bool, sums=None, check: bool = False,
                 xp=None) -> tuple[Rows, Histogram]:
    """:func:`rows_of` and :func:`histogram` of ``[N, V]`` inputs: the rows (with their scales) and their histogram.

    ``check``: make the value checks of :func:`mdboost.md._checks.check_pair` (finite,
    non-negative, rows summing to 1 within the tolerance; the same errors). On the CPU pass the
    checks and the row sums of the rescaling (unless given) are taken per row block from the
    float64 copy of the rows the pass makes anyway: the rows are read once instead of two or
    three times. Elsewhere they are made before the pass. ``xp``: see :func:`takes_numpy_pass`.
    """
    if takes_numpy_pass(p, q, xp):
        return _histogram_np(Rows(p, q, *_scales(sums)), div, normalize, check)
    if check:
        check_pair(p, q)
    rows = rows_of(p, q, normalize, sums)
    return rows, histogram(rows, div, xp)


def _scales(sums):  # row sums (any shape of N entries) -> (scale_p, scale_q) [N, 1], or (None, None)
    return (None, None) if sums is None else tuple(x.reshape(-1, 1) for x in sums)


def histogram(rows: Rows, div: Divergence, xp=None) -> Histogram:
    """Bucket sums of ``p``, ``q`` and ``q g(r)``: one pass over the entries, by row blocks.

    For ``kl`` and ``rkl`` the pass sums ``w log r`` only (``div.forms.log_form``): ``q g(r) =
    sign (w log r - p + q)``, so a bucket's sum of ``q g(r)`` follows from its ``w log r``, ``p``
    and ``q`` sums (one ``log`` per entry, none of the generator's other operations).
    CPU float32 / float64 rows take :func:`_histogram_np` (the same buckets and sums); ``xp``:
    see :func:`takes_numpy_pass`.
    """
    if takes_numpy_pass(rows.p, rows.q, xp):
        return _histogram_np(rows, div)[1]
    n, vocab = rows.p.shape
    sums = torch.zeros((3, n, FINITE + 1), dtype=torch.float64, device=rows.p.device)
    out = list(sums)
    index = torch.empty((n, vocab), dtype=torch.int64, device=rows.p.device)
    f32 = rows.p.dtype == torch.float32  # float32 rows: ratio, bucket and log in float32 (sums in float64)
    form = div.forms.log_form
    for blk in _row_blocks(n, vocab, rows.p.device):
        p64, q64, ratio = rows.block32(blk) if f32 else rows.block(blk)
        idx = index[blk]
        if f32 or rows.p.dtype == torch.float64:
            _index_into(ratio, idx)
        else:
            idx.copy_(bucket_index(ratio, rows.p.dtype))
        if form is not None:
            terms = _wlogr(q64 if form[0] else p64, ratio, form[0])
        else:
            terms = _terms32(p64, q64, ratio, div) if f32 else _terms(p64, q64, ratio, div)
        out[0][blk].scatter_add_(1, idx, p64)
        out[1][blk].scatter_add_(1, idx, q64)
        out[2][blk].scatter_add_(1, idx, terms)
    if form is not None:
        _from_log_sums(sums, form[1], xp)
    return Histogram(sums, index)


# numpy spelling of the CPU pass: (int view, shift of the bits, offset, value of inf, tiny, log dtype)
_NP_BITS = {
    torch.float32: (np.int32, _F32_SHIFT, _F32_OFFSET, _F32_INF - _F32_OFFSET, _TINY32),
    torch.float64: (np.int64, _SHIFT, _BASE - 1, (0x7FF0000000000000 >> _SHIFT) - (_BASE - 1), _TINY),
}


def _index_np(ratio: np.ndarray, tmp: np.ndarray, beyond: np.ndarray, out: np.ndarray) -> None:
    """:func:`_index_into` in numpy (``[n, V]`` ratio -> ``out`` int64), on the bits with the sign
    cleared (``-0.0`` is 0, ``-inf`` is ``inf``); ``tmp``, ``beyond``: int scratch of the ratio's width.

    ``t = bits >> shift`` (exponent and top mantissa bits) is at least ``t_inf`` exactly for
    ``inf`` and NaN, and below ``2 t_inf``, so ``(t + 2^k - t_inf) >> k`` with ``2^k > t_inf``
    is their extra 1 (the :data:`INF` bucket). NaN (``0 / 0``, a neutral ``p_i = q_i = 0``
    entry) lands there too: it leaves that bucket's ``p`` and ``q`` sums unchanged and is never kept.
    """
    int_t, shift, offset, x_inf, _ = _NP_BITS[torch.float32 if ratio.dtype == np.float32 else torch.float64]
    t_inf = x_inf + offset
    k = int(t_inf).bit_length()
    np.right_shift(ratio.view(int_t), shift, out=tmp)
    np.bitwise_and(tmp, (1 << (8 * tmp.itemsize - 1 - shift)) - 1, out=tmp)  # drop the sign (and its copies)
    np.add(tmp, (1 << k) - t_inf, out=beyond)
    np.right_shift(beyond, k, out=beyond)  # 1 for inf and NaN, else 0
    np.subtract(tmp, offset, out=tmp)
    np.clip(tmp, 0, FINITE - 1, out=tmp)
    np.add(tmp, beyond, out=tmp)
    np.copyto(out, tmp)


def _histogram_np(rows: Rows, div: Divergence, normalize: bool | None = None, check: bool = False):
    """:func:`histogram` of CPU float32 / float64 rows: the elementwise steps in numpy (a float32
    ``log`` several times cheaper than torch's), one ``scatter_add`` of the three stacked sums.

    Returns ``(rows, histogram)``. ``normalize`` without the scales in ``rows``: the row sums are
    taken per block (numpy float64 sums of the block's float64 copy) and returned in ``rows``
    (otherwise the scales in ``rows``, if any, are used); ``check``: the value checks of
    :func:`histogram_of` on every block.
    """
    n, vocab = rows.p.shape
    own = bool(normalize) and rows.scale_p is None  # this pass takes the row sums
    if own:
        rows = Rows(rows.p, rows.q, torch.empty((n, 1), dtype=torch.float64), torch.empty((n, 1), dtype=torch.float64))
    scaled = rows.scale_p is not None
    scale_p_np, scale_q_np = (rows.scale_p.numpy(), rows.scale_q.numpy()) if scaled else (None, None)
    int_t, _, _, _, tiny = _NP_BITS[rows.p.dtype]
    sums = torch.zeros((3, n, FINITE + 1), dtype=torch.float64)
    index = torch.empty((n, vocab), dtype=torch.int16)  # FINITE + 1 buckets fit int16
    form = div.forms.log_form
    p_np, q_np, index_np = rows.p.numpy(), rows.q.numpy(), index.numpy()
    blocks = _row_blocks(n, vocab, rows.p.device)
    step = blocks[0].stop - blocks[0].start if blocks else 0
    idx = torch.empty((step, vocab), dtype=torch.int64)  # a block's buckets for scatter_add (int64 only)
    idx_np = idx.numpy()
    src = torch.empty((3, step, vocab), dtype=torch.float64)  # p, q, q g(r) of a block, float64
    src_np = src.numpy()
    ratio_buf = np.empty((step, vocab), dtype=p_np.dtype)
    tmp_buf = np.empty((2, step, vocab), dtype=int_t)
    for blk in blocks:
        size = blk.stop - blk.start
        ratio, p64, q64 = ratio_buf[:size], src_np[0, :size], src_np[1, :size]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            p64[...], q64[...] = p_np[blk], q_np[blk]
            if own or check:
                sp, sq = p64.sum(-1, keepdims=True), q64.sum(-1, keepdims=True)  # [size, 1]
                if check:
                    _check_block(rows, blk, sp, sq)
                if own:
                    scale_p_np[blk], scale_q_np[blk] = sp, sq
            # the ratio of Rows.block / block32: float64 rows divide their rescaled entries; float32
            # rows take the input's ratio times the scale factor, and are rescaled in their bucket sums
            # below (a division per bucket instead of two per entry)
            if ratio.dtype == np.float64:
                if scaled:
                    p64 /= scale_p_np[blk]
                    q64 /= scale_q_np[blk]
                np.divide(p64, q64, out=ratio)
            else:
                np.divide(p_np[blk], q_np[blk], out=ratio)
                if scaled:
                    ratio *= (scale_q_np[blk] / scale_p_np[blk]).astype(np.float32)
            _index_np(ratio, tmp_buf[0, :size], tmp_buf[1, :size], idx_np[:size])
            np.copyto(index_np[blk], tmp_buf[0, :size], casting="unsafe")  # the same values (< 2^15)
            terms = src_np[2, :size]
            if form is not None:  # w log r (log_form)
                if form[0] == 0:  # w = p: 0 where p = 0 (the clamp keeps log finite there)
                    np.maximum(ratio, tiny, out=ratio)
                np.log(ratio, out=ratio)  # w = q: -inf where p = 0 < q (g(0) = inf)
                np.multiply(ratio, q64 if form[0] else p64, out=terms)  # the log widened exactly, then the product
            else:
                terms[...] = ratio
                terms[...] = _terms(torch.from_numpy(p64), torch.from_numpy(q64), torch.from_numpy(terms), div)
        sums[:, blk].scatter_add_(2, idx[:size].unsqueeze(0).expand(3, size, vocab), src[:, :size])
        if scaled and ratio_buf.dtype == np.float32:  # the sums of the rescaled rows: a bucket's sum over the row's
            s_np = sums.numpy()
            s_np[0, blk] /= scale_p_np[blk]
            s_np[1, blk] /= scale_q_np[blk]
            s_np[2, blk] /= scale_p_np[blk] if form is not None and form[0] == 0 else scale_q_np[blk]
    if form is not None:
        _from_log_sums(sums, form[1])
    else:
        sums[2, :, INF] = 0.0  # the q = 0 bucket's q g(r) is never read (inf or NaN terms there)
    return rows, Histogram(sums, index)


def _check_block(rows: Rows, blk: slice, sp, sq) -> None:
    """The value checks of ``check_pair`` on one block: its minima (in the input dtype, exactly
    those of the float64 copies) and float64 row sums, the same errors (naming the argument) as
    the check before the pass."""
    with np.errstate(invalid="ignore"):
        for name, x, s in (("draft_probs", rows.p, sp), ("target_probs", rows.q, sq)):
            x_blk = x[blk]  # its minimum in the input dtype: the float64 copy's, exactly (half the bytes read)
            _check_row_values(name, x_blk, [float(x_blk.numpy().min()), float(s.min()), float(s.max())])
