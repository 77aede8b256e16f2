"""The rows of the Python-float search (:mod:`mdboost.md._scalar`) built from a pair.

Two entry points (docs/theory.md, section 4):

- :func:`solve_row` on the pair itself, for :func:`mdboost.md.solve.solve` on one 1-D CPU row
  (the route :data:`mdboost.md._router.SCALAR_ROW`): the input check, the sort and the sums of
  :class:`~mdboost.md.breakpoints.Breakpoints` (the same steps and the same float64 values,
  only the parts the search reads: the prefix sums up to ``n_lt``, the suffix sums from
  ``n_le``), then the search, returning Python floats;
- :func:`reduced_row` on the reduced pair of one row of the linear-time solve
  (:func:`mdboost.md._buckets.solve_one`): the same sort and sums, for
  :func:`mdboost.md._scalar.primal_point`.
"""

from __future__ import annotations

import numpy as np
import torch

from mdboost.md import _scalar, _search
from mdboost.md._checks import _check_budget_range, _check_row_values
from mdboost.md._scalar import _INF, _Row
from mdboost.md._sums import neutral_ratios
from mdboost.md.breakpoints import Breakpoints
from mdboost.md.divergences import Divergence


_ARANGE: dict = {}


def _arange(v: int):
    if v not in _ARANGE:
        _ARANGE[v] = np.arange(v, dtype=np.int64)
    return _ARANGE[v]


def _sort_order(r):
    """The stable ascending order of ``r >= 0`` [V] as ``_sums._sort_rows`` on CPU (packed integer keys)."""
    v = r.shape[0]
    if r.dtype == np.float32:
        key = r.view(np.int32).astype(np.int64)
        key <<= 32
        mask = 0xFFFFFFFF
    else:
        shift = max(1, (v - 1).bit_length())
        mask = (1 << shift) - 1
        key = r.view(np.int64) & np.int64(~mask)
    key |= _arange(v)
    key.sort()
    key &= mask
    return key


def solve_row(p: torch.Tensor, q: torch.Tensor, budget: float, div: Divergence, g, validate: bool):
    """``solve(p, q, max_divergence=budget)`` on one 1-D CPU row of float32 or float64 as Python floats.

    Returns ``(a, b, acceptance, achieved_divergence, sd_acceptance)``, the values of the
    general path (:class:`~mdboost.md.breakpoints.Breakpoints` and
    :func:`mdboost.md._scalar.primal_point`): the same check (with the row sums of the normalisation, the sorted rows' float64 sums: they differ
    from the unsorted sums by rounding only), the same sort, the same float64 sums where the
    search reads them, the same search. Raises the errors of ``check_pair`` / ``check_budget``.
    """
    pn, qn = p.numpy(), q.numpy()
    v = pn.shape[0]
    with np.errstate(all="ignore"):
        if validate:
            lo_p, lo_q = float(pn.min()), float(qn.min())
        r = pn / qn  # [V] input dtype; 0/0 -> 1 (neutral), p / 0 -> inf
        zeros = not (validate and lo_q > 0)  # q may have zeros (or is unchecked)
        if zeros:  # 0/0 and p / -0.0 (the ratio is canonical otherwise)
            neutral_ratios(r)
        order = _sort_order(r)
        r_s = r.take(order)
        w = np.empty((2, v))  # sorted p, q in float64
        w[0], w[1] = pn.take(order), qn.take(order)
        p64, q64 = w
        thr = 1.0
        normalized = False
        if validate:  # the check's row sums are the normalisation's (Breakpoints, docs/theory.md section 9)
            sp, sq = float(p64.sum()), float(q64.sum())
            _check_row_values("draft_probs", p, (lo_p, sp, sp))
            _check_row_values("target_probs", q, (lo_q, sq, sq))
            _check_budget_range("max_divergence", budget, budget, None)
            if sp != 1 or sq != 1:
                p64 /= sp
                q64 /= sq
                normalized = True
                thr = r_s.dtype.type(sp / sq)  # r_i (sq / sp) < 1  <=>  r_i < sp / sq
        row = _row_of_sorted(r_s, w, thr, normalized, zeros, div, g)
    a, b, m, value = _scalar.primal_point(row, budget, div, g, True, floats=True)
    if _scalar.lost(m, budget, row.tv, row.m_end):  # lost to rounding: the general path's rescue and fallback
        bp = Breakpoints.from_checked(p[None], q[None], validate)
        point = _search.primal_point(bp, torch.full((1, 1), budget, dtype=torch.float64), div, False, True)
        a, b, m, value = (float(x) for x in point)
    return a, b, min(max(1.0 - m, 0.0), 1.0), value, min(max(1.0 - row.tv, 0.0), 1.0)


def reduced_row(p: np.ndarray, q: np.ndarray, div: Divergence, g) -> _Row:
    """The :class:`_Row` of one float64 pair [W] used as given (no rescaling, zeros allowed): the
    reduced pair of the linear-time solve (:mod:`mdboost.md._buckets`), with the sort, the sums
    and the prefix of ``Breakpoints(r, p, q)`` on it where the search reads them."""
    with np.errstate(all="ignore"):
        r = neutral_ratios(p / q)  # p / 0 -> inf
        order = _sort_order(r)
        w = np.empty((2, r.shape[0]))
        w[0], w[1] = p.take(order), q.take(order)
        return _row_of_sorted(r.take(order), w, 1.0, False, True, div, g)


def _row_of_sorted(r_s, w, thr, normalized: bool, zeros: bool, div: Divergence, g) -> _Row:
    """The :class:`_Row` of sorted ratios ``r_s`` [V] (input dtype) and sorted ``w = (p, q)`` [2, V]
    float64 (rescaled if ``normalized``; ``zeros``: ``q`` may hold zeros): the steps of
    :class:`~mdboost.md.breakpoints.Breakpoints` from the counts on, only the sums the search reads.
    Call under ``np.errstate(all="ignore")``; ``w`` may be changed in place."""
    v = r_s.shape[0]
    p64, q64 = w
    n_lt, n_le = int(r_s.searchsorted(thr, "left")), int(r_s.searchsorted(thr, "right"))
    n_fin = int(r_s.searchsorted(_INF, "left"))
    if n_fin < v and q64[n_fin:].any():  # a ratio that overflows the input dtype: q_i = 0 (section 9)
        q64[n_fin:] = 0.0
    if normalized:
        ratio = p64 / q64
        if zeros:
            ratio = np.where(q64 > 0, ratio, np.where(p64 > 0, _INF, 1.0 / np.float64(thr)))
        r_cmp = ratio
    elif r_s.dtype == np.float64:
        ratio = r_cmp = r_s
    else:
        ratio = p64 / q64 if not zeros else np.where(q64 > 0, p64 / q64, _INF)
        r_cmp = r_s
    pre = np.empty((2, n_lt + 1))  # cp, cq up to n_lt
    pre[:, 0] = 0.0
    np.cumsum(w[:, :n_lt], axis=1, out=pre[:, 1:])
    suf = np.empty((2, v - n_le + 1))  # rp, rq from n_le (read backwards)
    suf[:, 0] = 0.0
    np.cumsum(w[:, :n_le - 1 if n_le else None:-1], axis=1, out=suf[:, 1:])
    tv = pre.item(1, n_lt) - pre.item(0, n_lt)
    m_end = min(suf.item(0, v - n_fin), tv)
    mid = _row_mid(ratio, q64, r_cmp, n_lt, n_le, n_fin, normalized, div)
    return _Row(pre[0], pre[1], suf[0], suf[1], ratio, mid, n_lt, n_le, max(n_fin - 1, n_le), tv, m_end, g)


def _row_mid(ratio, q, r_cmp, n_lt, n_le, n_fin, normalized, div: Divergence):
    """``_sums._prefix_sums_np`` on one row (``Breakpoints.prefix``): only the terms it keeps, the
    same values (a closed form on ``ratio``, ``div.forms.g_ratio``, where there is one; else ``g`` on ``r_cmp``)."""
    v = ratio.shape[0]
    mid = np.zeros(v + 1)
    g_ratio = div.forms.g_ratio
    if g_ratio is not None:
        if n_lt:
            terms = q[:n_lt] * g_ratio(ratio[:n_lt], np)
            if normalized:
                terms = np.where(r_cmp[:n_lt] < 1, terms, 0.0)
            np.cumsum(terms[::-1], out=mid[n_lt - 1::-1])  # [k] = sum_{k <= i < n_lt}
        if n_fin > n_le:
            terms = q[n_le:n_fin] * g_ratio(ratio[n_le:n_fin], np)
            if normalized:
                terms = np.where(r_cmp[n_le:n_fin] > 1, terms, 0.0)
            np.cumsum(terms, out=mid[n_le + 1:n_fin + 1])  # [j] = sum_{n_le <= i < j}, 0 up to n_le
            mid[n_fin + 1:] = mid[n_fin]
        return mid
    # the generator on the two kept slices only (elementwise: the same values as on the whole row); the
    # ratios there are finite and not NaN, so the batched path's nan_to_num leaves them as they are
    if n_lt:
        r_lo = r_cmp[:n_lt]
        terms = q[:n_lt] * div.g_numpy(r_lo.astype(np.float64))
        np.cumsum(np.where(r_lo < 1, terms, 0.0)[::-1], out=mid[n_lt - 1::-1])
    if n_fin > n_le:  # beyond n_fin the terms are masked (infinite ratios): the sum stays
        r_hi = r_cmp[n_le:n_fin]
        terms = q[n_le:n_fin] * div.g_numpy(r_hi.astype(np.float64))
        np.cumsum(np.where((r_hi > 1) & (r_hi < _INF), terms, 0.0), out=mid[n_le + 1:n_fin + 1])
        mid[n_fin + 1:] = mid[n_fin]
    return mid
