"""Breakpoints of the curve C(p, q): one sort, then dual, exact primal and bound queries.

Implements the paper's Definition 3.11 (the clamp couples ``(a, b)``), Lemmas 5.2/5.3 (the
breakpoints lie on C(p, q), and the curve is continuous and strictly increasing, so a query
between two breakpoints is an interpolation) and the querying procedures of Section 5:

- dual (min acceptance): ``O(log V)``, f-independent (Theorem 3.13);
- exact primal (max divergence): prefix sums of ``q_i g(r_i)`` over the sorted ratios make
  ``D_f`` at any point of the curve ``O(1)`` once its segment is known; a batched binary
  search finds the segment, a fixed-iteration bisection the point inside it;
- bound primal: the same search on the Theorem 3.12 upper bound (never exceeds the budget).

Parametrisation. Sort ``r_i = p_i / q_i`` ascending (``q_i = 0 < p_i`` gives ``r_i = inf``;
``p_i = q_i = 0`` is set to ``r_i = 1``). Points of the curve are indexed by the excess mass
``m = E(a) = F(b)``, with ``P_acc = 1 - m``; ``m`` decreases from ``TV(p, q)`` (``pi = q``)
to ``p(q = 0)`` (``pi = p`` on the support of q). With ``A`` = sorted positions ``>= j``
(``r_i > 1 + a``) and ``B`` = positions ``< k`` (``r_i < 1 - b``):
``a = (P_suf[j] - m) / Q_suf[j] - 1`` and ``b = 1 - (m + P_pre[k]) / Q_pre[k]``.
Breakpoints of ``a`` (``m = E(r_j - 1)``) and of ``b`` (``m = F(1 - r_k)``) are monotone in
the sorted order, so locating ``m`` is one ``torch.searchsorted`` per side.

All sums are accumulated in float64 (the sort stays in the input dtype).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mdboost.md._checks import check_budget, check_pair
from mdboost.md.divergences import Divergence, resolve

ACC_DTYPE = torch.float64
_BISECT_ITERS = 56  # bracket width <= 2^-56 of the segment: float64 resolution


class CurvePoint(NamedTuple):
    """A point ``(a, b)`` of C(p, q) and its acceptance probability ``1 - E(a)``."""

    a: torch.Tensor  # [...]
    b: torch.Tensor  # [...]
    acceptance: torch.Tensor  # [...]


def _rev_cumsum(x: torch.Tensor) -> torch.Tensor:
    """``out[..., i] = sum_{t >= i} x[..., t]``, with a trailing 0 column (length V + 1)."""
    s = torch.flip(torch.cumsum(torch.flip(x, [-1]), -1), [-1])
    return torch.cat([s, torch.zeros_like(x[..., :1])], dim=-1)


def _cumsum0(x: torch.Tensor) -> torch.Tensor:
    """``out[..., i] = sum_{t < i} x[..., t]`` (length V + 1)."""
    return torch.cat([torch.zeros_like(x[..., :1]), torch.cumsum(x, -1)], dim=-1)


def _take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return torch.gather(x, -1, idx)


class Breakpoints:
    """The breakpoint structure of C(p, q) for a batch of drafter/target pairs.

    Build it with :meth:`build`; query it with :meth:`for_acceptance` (dual),
    :meth:`for_divergence` (exact primal), :meth:`for_divergence_bound` (Theorem 3.12 bound),
    :meth:`divergence_at` and :meth:`curve`. Queries take budgets broadcastable to the batch
    shape ``draft_probs.shape[:-1]`` and return tensors of that shape in the input dtype.

    Examples
    --------
    >>> import torch
    >>> p = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    >>> q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    >>> bp = Breakpoints.build(p, q)
    >>> round(float(bp.sd_acceptance), 6)
    0.5
    >>> round(float(bp.for_acceptance(0.6).acceptance), 6)
    0.6
    """

    def __init__(self, *, ratio, q_sorted, p_pre, q_pre, p_suf, q_suf, n_lt, n_le, n_fin, batch_shape, dtype):
        self._r, self._q = ratio, q_sorted  # [N, V] float64, sorted by ratio
        self._p_pre, self._q_pre, self._p_suf, self._q_suf = p_pre, q_pre, p_suf, q_suf  # [N, V+1]
        self._n_lt, self._n_le, self._n_fin = n_lt, n_le, n_fin  # [N, 1] long
        self.batch_shape = torch.Size(batch_shape)
        self.dtype = dtype
        self._j_max = torch.maximum(n_fin - 1, n_le)  # last A segment
        self._tv = _take(q_pre, n_lt) - _take(p_pre, n_lt)  # [N, 1] = F(0) = TV(p, q)
        self._m_end = torch.minimum(_take(p_suf, n_fin), self._tv)  # [N, 1] = p(q = 0)
        self._build_knots()
        self._prefix_cache: dict = {}

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, draft_probs: torch.Tensor, target_probs: torch.Tensor, *, validate: bool = True) -> "Breakpoints":
        """Sort the ratios once and accumulate the prefix sums.

        Parameters
        ----------
        draft_probs : torch.Tensor of shape (..., V)
            Drafter distributions ``p`` (rows sum to 1).
        target_probs : torch.Tensor of shape (..., V)
            Target distributions ``q``.
        validate : bool, default=True
            Check the inputs (raises ValueError naming the bad argument).
        """
        p, q = check_pair(draft_probs, target_probs, validate=validate)
        vocab = p.shape[-1]
        p2, q2 = p.reshape(-1, vocab), q.reshape(-1, vocab)
        r = p2 / q2
        r = torch.where(torch.isnan(r), torch.ones_like(r), r)  # p_i = q_i = 0: neutral
        r_sorted, order = torch.sort(r, dim=-1)
        p_s = torch.gather(p2, -1, order).to(ACC_DTYPE)
        q_s = torch.gather(q2, -1, order).to(ACC_DTYPE)
        finite = torch.isfinite(r_sorted)
        ratio = torch.where(
            finite & (q_s > 0), p_s / torch.where(q_s > 0, q_s, torch.ones_like(q_s)), r_sorted.to(ACC_DTYPE)
        )
        return cls(
            ratio=ratio,
            q_sorted=q_s,
            p_pre=_cumsum0(p_s),
            q_pre=_cumsum0(q_s),
            p_suf=_rev_cumsum(p_s),
            q_suf=_rev_cumsum(q_s),
            n_lt=(r_sorted < 1).sum(-1, keepdim=True),
            n_le=(r_sorted <= 1).sum(-1, keepdim=True),
            n_fin=finite.sum(-1, keepdim=True),
            batch_shape=p.shape[:-1],
            dtype=p.dtype,
        )

    def _build_knots(self) -> None:
        n, vocab = self._r.shape
        pos = torch.arange(vocab + 1, device=self._r.device).expand(n, vocab + 1)
        inf = torch.full_like(self._r[:, :1], float("inf"))
        self._rr = torch.cat([self._r, inf], dim=-1)  # [N, V+1]
        # A side: E at a = r_j - 1 is P_suf[j] - r_j Q_suf[j], non-increasing in j.
        knot_a = self._p_suf[:, :vocab] - self._r * self._q_suf[:, :vocab]
        neg = torch.cat([-knot_a, inf], dim=-1)
        neg = torch.where(pos < self._n_le, -inf, neg)
        neg = torch.where(pos >= self._j_max, inf, neg)
        self._neg_knot_a = torch.cummax(torch.nan_to_num(neg, nan=float("inf"), posinf=float("inf"), neginf=float("-inf")), -1).values.contiguous()
        # B side: F at b = 1 - r_k is r_k Q_pre[k] - P_pre[k], non-decreasing in k; F(0) = TV.
        knot_b = torch.cat([self._r * self._q_pre[:, :vocab] - self._p_pre[:, :vocab], inf], dim=-1)
        knot_b = torch.where(pos == self._n_lt, self._tv, knot_b)
        knot_b = torch.where(pos > self._n_lt, inf, knot_b)
        self._knot_b = torch.cummax(torch.nan_to_num(knot_b, nan=float("inf"), posinf=float("inf"), neginf=float("-inf")), -1).values.contiguous()

    # ------------------------------------------------------------ internals
    def _locate_j(self, m: torch.Tensor) -> torch.Tensor:
        j = torch.searchsorted(self._neg_knot_a, (-m).contiguous(), side="left")
        return torch.minimum(torch.maximum(j, self._n_le), self._j_max)

    def _locate_k(self, m: torch.Tensor) -> torch.Tensor:
        k = torch.searchsorted(self._knot_b, m.contiguous(), side="left")
        return torch.minimum(k.clamp(min=1), self._n_lt)

    def _ab(self, m, j, k):
        q_a, q_b = _take(self._q_suf, j), _take(self._q_pre, k)
        one = torch.ones_like(m)
        a = torch.where(q_a > 0, (_take(self._p_suf, j) - m) / torch.where(q_a > 0, q_a, one) - 1, 0 * m)
        b = torch.where(q_b > 0, 1 - (m + _take(self._p_pre, k)) / torch.where(q_b > 0, q_b, one), 0 * m)
        at_sd = m >= self._tv
        a = torch.where(at_sd, 0 * m, a.clamp(min=0))
        b = torch.where(at_sd, 0 * m, b.clamp(0, 1))
        return a, b

    def _prefix(self, div: Divergence):
        """``R[k] = sum_{k <= i < n_lt} q_i g(r_i)``, ``H[j] = sum_{n_le <= i < j} q_i g(r_i)``."""
        key = div
        if key not in self._prefix_cache:
            pos = torch.arange(self._r.shape[-1], device=self._r.device)
            keep = torch.isfinite(self._r) & (self._q > 0) & (self._r != 1)
            zero = torch.zeros_like(self._q)
            terms = torch.where(keep, self._q * div.g(torch.where(keep, self._r, torch.ones_like(self._r))), zero)
            low = _rev_cumsum(torch.where(pos < self._n_lt, terms, zero))
            high = _cumsum0(torch.where(pos >= self._n_le, terms, zero))
            self._prefix_cache[key] = (low, high)
        return self._prefix_cache[key]

    def _div(self, m, j, k, div: Divergence, bound: bool):
        """D_f (or its Theorem 3.12 upper bound) at the curve point ``m`` of segment ``(j, k)``."""
        a, b = self._ab(m, j, k)
        q_a, q_b = _take(self._q_suf, j), _take(self._q_pre, k)
        g_a, g_b = div.g(1 + a), div.g(1 - b)
        zero = 0 * m
        total = torch.where(q_a > 0, q_a * g_a, zero) + torch.where(q_b > 0, q_b * g_b, zero)
        if bound:
            q_m = _take(self._q_pre, j) - q_b
            return total + torch.where(q_m > 0, q_m * torch.maximum(g_a, g_b), zero)
        low, high = self._prefix(div)
        return total + _take(low, k) + _take(high, j)

    def _knot_m(self, j):
        m = _take(self._p_suf, j) - _take(self._rr, j) * _take(self._q_suf, j)
        m = torch.where(torch.isfinite(m), m, self._m_end)
        return torch.minimum(torch.maximum(m, self._m_end), self._tv)

    def _search(self, budget, div: Divergence, bound: bool):  # budget [N, 1] float64
        iters = max(1, int(self._r.shape[-1] + 1).bit_length())
        # Stage 1: A segment. Smallest knot j with D(E(r_j - 1)) >= budget.
        lo, hi = self._n_le.clone(), self._j_max.clone()
        for _ in range(iters):
            mid = (lo + hi) // 2
            m = self._knot_m(mid)
            big = self._div(m, mid, self._locate_k(m), div, bound) >= budget
            hi, lo = torch.where(big, mid, hi), torch.where(big, lo, mid + 1)
        j = hi
        m_lo = self._knot_m(j)
        m_hi = torch.where(j > self._n_le, self._knot_m((j - 1).clamp(min=0)), self._tv)
        # Stage 2: B segment inside it. Smallest k with D(min(F-knot k, m_hi)) <= budget.
        lo, hi = self._locate_k(m_lo), self._locate_k(m_hi)
        for _ in range(iters):
            mid = (lo + hi) // 2
            m = torch.minimum(torch.maximum(_take(self._knot_b, mid), m_lo), m_hi)
            small = self._div(m, j, mid, div, bound) <= budget
            hi, lo = torch.where(small, mid, hi), torch.where(small, lo, mid + 1)
        k = hi
        m_top = torch.minimum(torch.maximum(_take(self._knot_b, k), m_lo), m_hi)
        m_bot = torch.maximum(_take(self._knot_b, (k - 1).clamp(min=0)), m_lo)
        m_bot = torch.where(k > 0, torch.minimum(m_bot, m_top), m_lo)
        # Stage 3: bisection inside one segment, D(m_bot) >= budget >= D(m_top).
        for _ in range(_BISECT_ITERS):
            mid = (m_bot + m_top) / 2
            big = self._div(mid, j, k, div, bound) > budget
            m_bot, m_top = torch.where(big, mid, m_bot), torch.where(big, m_top, mid)
        return m_top

    def _point(self, m):
        j, k = self._locate_j(m), self._locate_k(m)
        a, b = self._ab(m, j, k)
        return a, b, j, k

    def _flat(self, value, name, upper=None, validate=True):
        t = check_budget(name, value, self.batch_shape, self._r.device, upper=upper, validate=validate)
        return t.reshape(-1, 1)

    def _out(self, x):
        return x.reshape(self.batch_shape).to(self.dtype)

    def _result(self, m) -> CurvePoint:
        a, b, _, _ = self._point(m)
        return CurvePoint(self._out(a), self._out(b), self._out(1 - m))

    # ---------------------------------------------------------------- queries
    @property
    def sd_acceptance(self) -> torch.Tensor:  # [...]
        """Acceptance of standard SD, ``1 - TV(p, q)`` (the curve's start)."""
        return self._out(1 - self._tv)

    @property
    def max_acceptance(self) -> torch.Tensor:  # [...]
        """Acceptance at the curve's end (``pi = p`` on the support of q): ``1 - p(q = 0)``."""
        return self._out(1 - self._m_end)

    def for_acceptance(self, min_acceptance, *, validate: bool = True) -> CurvePoint:
        """Dual: the curve point with acceptance ``min_acceptance`` (f-independent, Theorem 3.13).

        Budgets below the SD acceptance give ``a = b = 0`` (``pi = q``); budgets above
        :attr:`max_acceptance` give the curve's end (the best achievable).
        """
        acc = self._flat(min_acceptance, "min_acceptance", upper=1.0, validate=validate)
        m = torch.minimum(torch.maximum(1 - acc, self._m_end), self._tv)
        return self._result(m)

    def for_divergence(self, max_divergence, divergence="kl", *, validate: bool = True) -> CurvePoint:
        """Exact primal: the curve point where ``D_f(pi || q) = max_divergence`` (Thm 3.7, Cor 3.10).

        Budgets at or above ``D_f`` at the curve's end give the end point.
        """
        return self._primal(max_divergence, divergence, bound=False, validate=validate)

    def for_divergence_bound(self, max_divergence, divergence="kl", *, validate: bool = True) -> CurvePoint:
        """Conservative primal on the Theorem 3.12 upper bound: ``D_f <= max_divergence`` always."""
        return self._primal(max_divergence, divergence, bound=True, validate=validate)

    def _primal(self, max_divergence, divergence, bound, validate) -> CurvePoint:
        div = resolve(divergence)
        budget = self._flat(max_divergence, "max_divergence", validate=validate)
        end = self._m_end
        d_end = self._div(end, self._locate_j(end), self._locate_k(end), div, bound)
        inner = self._search(budget.clamp(max=torch.finfo(ACC_DTYPE).max), div, bound)
        m = torch.where(budget <= 0, self._tv, torch.where(budget >= d_end, end, inner))
        return self._result(m)

    def divergence_at(self, acceptance, divergence="kl", *, bound: bool = False) -> torch.Tensor:
        """``D_f(pi || q)`` (or its Thm 3.12 upper bound) at the curve point of given acceptance.

        ``acceptance`` is clipped to ``[sd_acceptance, max_acceptance]``; O(log V) per query.
        """
        div = resolve(divergence)
        acc = self._flat(acceptance, "acceptance", upper=1.0)
        m = torch.minimum(torch.maximum(1 - acc, self._m_end), self._tv)
        a_, b_, j, k = self._point(m)
        return self._out(self._div(m, j, k, div, bound))

    def curve(self) -> CurvePoint:
        """All breakpoints of the curve, sorted by acceptance, shape ``(..., 2V + 1)``.

        Includes the SD start (``a = b = 0``) and the end point; unused slots are NaN (last).
        """
        n, vocab = self._r.shape
        pos = torch.arange(vocab, device=self._r.device)
        ja = pos.expand(n, vocab)
        valid_a = (ja >= self._n_le) & (ja < self._n_fin)
        m_a = torch.where(valid_a, self._knot_m(ja), torch.full_like(self._r, float("nan")))
        valid_b = ja < self._n_lt
        m_b = torch.where(valid_b, self._knot_b[:, :vocab], torch.full_like(self._r, float("nan")))
        m_all = torch.cat([self._tv, m_a, m_b], dim=-1)  # [N, 2V+1]
        acc = torch.sort(1 - m_all, dim=-1).values  # NaN sorts last
        valid = ~torch.isnan(acc)
        m = torch.where(valid, 1 - acc, self._tv).clamp(min=0)
        m = torch.minimum(torch.maximum(m, self._m_end), self._tv)
        a, b, _, _ = self._point(m)
        nan = torch.full_like(m, float("nan"))
        shape = self.batch_shape + (m.shape[-1],)
        return CurvePoint(
            *(torch.where(valid, x, nan).reshape(shape).to(self.dtype) for x in (a, b, 1 - m))
        )
