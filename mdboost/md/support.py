"""The f-MD optimum over all distributions, tokens the target excludes included.

:func:`mdboost.md.solve.solve` optimizes by default among distributions supported on the
target's support (``pi_i = 0`` where ``q_i = 0``): tokens the target's sampling excludes (top-k,
top-p) are never emitted. Without that restriction (``solve(..., support="any")``), mass put
where ``q_i = 0`` costs ``c = lim_{z -> inf} g(z) / z = f'(inf) - f'(1)`` per unit
(:func:`zero_cost`), finite for ``rkl``, ``hellinger``, ``neyman``, ``tv``, ``js`` and the Amari
``alpha:<a>`` with ``a < 1``. Derivation (``docs/theory.md``, section 4, "Tokens the target
excludes"): moving mass onto an A token costs ``g'(1 + a) < c``, so the optimum follows the
clamp curve C(p, q) to its end (every token with ``q_i > 0`` at ``pi_i >= p_i``), then
continues along one more segment, parametrised by the B level ``beta = 1 - b``:

    pi_i = max(beta q_i, p_i)            where q_i > 0,
    pi_i = t p_i, t = z / p(q = 0)       where q_i = 0,
    m = F(beta) = sum_i (beta q_i - p_i)_+,   z = p(q = 0) - m,   P_acc = 1 - m,
    D_f(pi || q) = sum_{q_i > 0} q_i g(max(beta, r_i)) + c z,

from the curve's end (``m = p(q = 0)``, ``z = 0``) to ``pi = p`` (``m = 0``). ``D_f`` decreases
strictly in ``beta`` there, so the primal is a search over the sorted ratios (``O(V log V)``)
and a bisection inside one segment, both in float64; the dual is ``m = 1 - P`` (f-independent).
Any split of ``z`` over the excluded tokens with ``pi_i <= p_i`` is optimal too; this module
takes the proportional one.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from mdboost.md.divergences import Divergence

__all__ = ["SUPPORTS", "zero_cost", "Extension", "extend", "add_off_support"]

SUPPORTS = ("target", "any")
_ROUNDS = 200  # bisection rounds at most (each halves the bracket; stops once it no longer moves)


def zero_cost(div: Divergence) -> float:
    """``c = lim_{z -> inf} g(z) / z``: what one unit of mass costs where ``q_i = 0``.

    With ``D_f(pi || q) = sum_{q_i > 0} q_i g(pi_i / q_i) + c pi(q = 0)`` (the ``f'(1)`` term of
    the standardized ``g`` sums to ``-f'(1) pi(q = 0)``). ``math.inf`` for ``kl``, ``pearson``,
    ``alpha:<a>`` with ``a > 1``: there both supports give the same optimum.

    Examples
    --------
    >>> from mdboost.md.divergences import resolve
    >>> [zero_cost(resolve(name)) for name in ("kl", "rkl", "hellinger", "tv")]
    [inf, 1.0, 1.0, 0.5]
    """
    if not math.isfinite(div.inf_slope):
        return math.inf
    shift = div.fprime_one if div.standardize and div.fprime_one != 0.0 else 0.0
    return div.inf_slope - shift


class _Sorted(NamedTuple):
    """The target's support sorted by ratio ``r = p / q`` (float64 [N, V] / [N, V + 1])."""

    r: torch.Tensor  # [N, V] ascending; inf where q_i = 0 (also p_i = q_i = 0)
    cp: torch.Tensor  # [N, V + 1]: sum_{i < k} p_i
    cq: torch.Tensor  # [N, V + 1]: sum_{i < k} q_i
    tail: torch.Tensor  # [N, V + 1]: sum_{i >= k} q_i g(r_i)
    knots: torch.Tensor  # [N, V]: m = F(r_i) for r_i < 1, else inf (non-decreasing)
    p_zero: torch.Tensor  # [N, 1]: p(q = 0)
    n_lt: torch.Tensor  # [N, 1] long: number of r_i < 1


def _sort(p, q, div) -> _Sorted:
    n, v = p.shape
    pos = _on_support(p, q)
    r = torch.where(pos, p / torch.where(pos, q, 1.0), math.inf)
    r, order = torch.sort(r, dim=-1)
    ps, qs = p.gather(-1, order), torch.where(pos, q, 0.0).gather(-1, order)
    zero = torch.zeros((n, 1), dtype=p.dtype, device=p.device)
    cp, cq = (torch.cat([zero, x.cumsum(-1)], dim=-1) for x in (ps, qs))
    terms = torch.where(qs > 0, qs * div.g(torch.where(qs > 0, r, 1.0)), 0.0)
    tail = torch.cat([terms.flip(-1).cumsum(-1).flip(-1), zero], dim=-1)  # sums of terms >= 0: no cancellation
    knots = torch.where(r < 1, r * cq[:, :v] - cp[:, :v], math.inf)
    knots = torch.cummax(knots, dim=-1).values  # rounding never breaks the order searchsorted needs
    p_zero = torch.where(pos, 0.0, p).sum(-1, keepdim=True)
    n_lt = (r < 1).sum(-1, keepdim=True)
    return _Sorted(r, cp, cq, tail, knots, p_zero, n_lt)


def _on_support(p, q):
    """``q_i > 0`` with a finite ratio (one that overflows counts as ``q_i = 0``, docs/theory.md section 9)."""
    return (q > 0) & torch.isfinite(p / torch.where(q > 0, q, 1.0))


def _take(x, k):
    return torch.gather(x, -1, k)


def _beta_range(s: _Sorted, k):
    """``[r_(k-1), min(r_k, 1)]``: the B levels of segment ``k`` (``B`` = the first ``k`` sorted tokens)."""
    v = s.r.shape[-1]
    lo = torch.where(k > 0, _take(s.r, (k - 1).clamp(min=0)), 0.0)
    hi = torch.where(k < v, _take(s.r, k.clamp(max=v - 1)), 1.0).clamp(max=1.0)
    return lo, torch.maximum(hi, lo)


def _beta_of(s: _Sorted, m, k):
    """The B level where ``F(beta) = m`` on segment ``k`` (``F = beta q(B) - p(B)``)."""
    lo, hi = _beta_range(s, k)
    qb = _take(s.cq, k)
    beta = (m + _take(s.cp, k)) / torch.where(qb > 0, qb, 1.0)
    return torch.where(qb > 0, beta, hi).minimum(hi).maximum(lo)  # k = 0: m = 0 up to r_0


def _segment(s: _Sorted, m):
    """The segment ``k`` holding excess mass ``m`` (the first knot ``>= m``)."""
    return torch.searchsorted(s.knots, m.contiguous()).minimum(s.n_lt)


def _divergence(s: _Sorted, beta, k, div, c):
    """``D_f`` on the extension at B level ``beta`` of segment ``k`` (docstring of the module)."""
    qb = _take(s.cq, k)
    m = (beta * qb - _take(s.cp, k)).clamp(min=0.0)
    inner = torch.where(qb > 0, qb * div.g(torch.where(qb > 0, beta, 1.0)), 0.0)
    return inner + _take(s.tail, k) + c * (s.p_zero - m).clamp(min=0.0)


class Extension(NamedTuple):
    """The unrestricted optimum of the rows where it leaves the target's support ([N] float64)."""

    rows: torch.Tensor  # bool: the optimum puts mass where q = 0 (other rows: the clamp curve's point)
    a: torch.Tensor  # the smallest a with min(p, (1 + a) q) = p where q > 0
    b: torch.Tensor  # 1 - beta
    acceptance: torch.Tensor  # 1 - m
    off_support: torch.Tensor  # z = p(q = 0) - m


def extend(p, q, value, div: Divergence, dual: bool) -> Extension:
    """The unrestricted f-MD optimum on rows ``p``, ``q`` [N, V] (float64, rows summing to 1).

    ``value`` [N]: the budget ``D`` (primal) or the acceptance target ``P`` (dual). A row is
    extended where ``p(q = 0) > 0``, ``c`` (:func:`zero_cost`) is finite and the budget exceeds
    ``D_f`` at the clamp curve's end (primal), or ``P`` exceeds the curve's end ``1 - p(q = 0)``
    (dual); elsewhere the optimum is the clamp curve's and the fields are placeholders.
    Primal: the extension point is never above the budget (the bisection keeps that side).
    """
    c = zero_cost(div)
    s = _sort(p, q, div)
    finite = math.isfinite(c)
    value = value.reshape(-1, 1).to(p.dtype)
    k_end = _segment(s, s.p_zero)
    beta_end = _beta_of(s, s.p_zero, k_end)
    if dual:
        m = (1 - value).clamp(min=0.0)
        rows = (m < s.p_zero) & finite
        m = torch.minimum(m, s.p_zero)
        k = _segment(s, m)
        beta = _beta_of(s, m, k)
    else:
        d_end = _divergence(s, beta_end, k_end, div, c)
        rows = (s.p_zero > 0) & (value > d_end) & finite
        # the first sorted knot whose D_f fits: D_f decreases along the knots (beta = r_i)
        v = s.r.shape[-1]
        idx = torch.arange(v, device=p.device).expand_as(s.r)
        d_knots = _divergence(s, s.r.clamp(max=1.0), idx, div, c)
        fits = (d_knots <= value) | (idx >= s.n_lt) | (s.knots >= s.p_zero)
        k = torch.where(fits.any(-1, keepdim=True), fits.long().argmax(-1, keepdim=True), s.n_lt)
        k = torch.minimum(k, k_end)
        lo, hi = _beta_range(s, k)
        hi = torch.where(k >= k_end, torch.minimum(hi, beta_end), hi)  # never beyond the curve's end
        lo = torch.where(k == 0, hi, torch.minimum(lo, hi))  # k = 0: pi = p fits the budget
        for _ in range(_ROUNDS):  # bisection: hi always fits (D_f decreases in beta)
            mid = (lo + hi) / 2
            if not bool(((mid > lo) & (mid < hi)).any()):
                break
            ok = _divergence(s, mid, k, div, c) <= value
            lo, hi = torch.where(ok, lo, mid), torch.where(ok, mid, hi)
        beta = hi
        m = (beta * _take(s.cq, k) - _take(s.cp, k)).clamp(min=0.0).minimum(s.p_zero)
    r_fin = torch.where(torch.isfinite(s.r), s.r, 0.0).amax(-1, keepdim=True)
    a = (r_fin - 1).clamp(min=0.0)
    out = (rows, a, (1 - beta).clamp(0.0, 1.0), 1 - m, (s.p_zero - m).clamp(min=0.0))
    return Extension(*(x.squeeze(-1) for x in out))


def add_off_support(pi, p, q, off_support):
    """``pi`` plus ``off_support`` mass on the tokens with ``q_i = 0 < p_i``, split as ``p`` is.

    ``pi``, ``p``, ``q`` of shape (..., V); ``off_support`` of shape (...). Rows without such
    tokens are returned unchanged.
    """
    zero = ~_on_support(p, q) & (p > 0)
    p_zero = torch.where(zero, p, 0.0).sum(-1, keepdim=True)
    share = torch.where(p_zero > 0, off_support.unsqueeze(-1).to(p.dtype) / torch.where(p_zero > 0, p_zero, 1.0), 0.0)
    return torch.where(zero, pi + share * p, pi)
