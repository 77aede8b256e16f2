"""Closed form of f-MD for a deterministic drafter (one-hot ``p``): no sort, ``O(1)`` per row.

A drafter that puts all its mass on one token ``x`` (prompt lookup / n-gram drafters, any
drafter at temperature 0) has ratios ``r_x = 1 / q_x`` and ``r_i = 0`` elsewhere, so the curve
C(p, q) (``docs/theory.md``, "The clamp solution and the curve C(p, q)") is a single segment.
Parametrise it by ``t = pi_x``:

- ``pi_x = (1 + a) q_x = t`` and ``pi_i = (1 - b) q_i`` for ``i != x`` with
  ``1 - b = (1 - t) / (1 - q_x)``, for ``t`` from ``q_x`` (``pi = q``) to 1 (``pi = p``);
- ``P_acc(pi) = sum_i min(pi_i, p_i) = t``;
- ``D_f(pi || q) = q_x g(t / q_x) + (1 - q_x) g((1 - t) / (1 - q_x))`` with the standardized
  generator ``g`` (for KL: the binary KL divergence between ``t`` and ``q_x``), increasing in
  ``t`` on ``[q_x, 1]``.

The primal (largest ``t`` with ``D_f <= D``) is a scalar search per row on this increasing
function, done for all rows at once: a multisection that evaluates ``D_f`` at 1024 points of
the bracket per round (5 rounds narrow it by ``2^50``; few rounds keep the Python overhead of
small batches low); the dual is ``t = clip(P, q_x, 1)``. ``q_x = 0`` (the
target never emits the draft) gives ``t = 0``: the draft is never accepted and ``pi = q``.
The same ``(a, b)`` are what :class:`~mdboost.md.breakpoints.Breakpoints` finds on this input
(tested), at ``O(1)`` instead of ``O(V log V)`` per row.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mdboost.md.divergences import Divergence

__all__ = ["OneHotPoint", "one_hot_divergence", "one_hot_primal", "one_hot_dual"]

_POINTS, _ROUNDS = 1024, 5  # each round shrinks the bracket 1024-fold: 2^-50 in all


class OneHotPoint(NamedTuple):
    """The optimal clamp for one-hot drafts (all tensors of the shape of ``target_prob``)."""

    a: torch.Tensor
    b: torch.Tensor
    acceptance: torch.Tensor  # t = pi_x
    divergence: torch.Tensor  # D_f(pi || q)


def one_hot_divergence(target_prob: torch.Tensor, t: torch.Tensor, div: Divergence) -> torch.Tensor:  # [...]
    """``D_f(pi || q)`` on the one-hot curve at ``pi_x = t`` (``target_prob`` = ``q_x``, float64)."""
    s = target_prob
    inner = (s > 0) & (s < 1)
    s_in = torch.where(inner, s, 0.5)
    z = torch.stack([t / s_in, (1 - t) / (1 - s_in)])  # [2, ...] ratios pi/q on x and off x
    value = s_in * div.g(z[0]) + (1 - s_in) * div.g(z[1])
    return torch.where(inner, value, torch.zeros_like(value))


def _point(s: torch.Tensor, t: torch.Tensor, div: Divergence) -> OneHotPoint:
    inner = (s > 0) & (s < 1)
    s_in = torch.where(inner, s, 0.5)
    a = torch.where(inner, t / s_in - 1, 0.0).clamp(min=0)
    b = torch.where(inner, (t - s_in) / (1 - s_in), 0.0).clamp(0, 1)
    return OneHotPoint(a, b, t, one_hot_divergence(s, t, div))


def one_hot_primal(target_prob: torch.Tensor, max_divergence: torch.Tensor, div: Divergence) -> OneHotPoint:
    """Max acceptance with ``D_f(pi || q) <= max_divergence`` for one-hot drafts.

    Parameters
    ----------
    target_prob : torch.Tensor of shape (...)
        ``q_x``, the target's probability of the drafted token (float64 recommended).
    max_divergence : torch.Tensor broadcastable to (...)
        The budget ``D >= 0``.
    div : Divergence

    Returns
    -------
    OneHotPoint
        Never above the budget: the search keeps its feasible end; budget 0 gives ``pi = q``.
    """
    s = target_prob
    budget = torch.as_tensor(max_divergence, dtype=s.dtype, device=s.device).expand_as(s)
    end = (s > 0).to(s.dtype)  # t can reach 1 unless q_x = 0
    start = torch.where(s > 0, s, 0.0)  # t at pi = q
    lo, hi = start, end
    done = one_hot_divergence(s, end, div) <= budget  # pi = p fits the budget
    fractions = torch.linspace(0, 1, _POINTS + 1, dtype=s.dtype, device=s.device)  # [P+1]
    s_pts, budget_pts = s.unsqueeze(-1), budget.unsqueeze(-1)
    for _ in range(_ROUNDS):
        pts = lo.unsqueeze(-1) + (hi - lo).unsqueeze(-1) * fractions  # [..., P+1], pts[..., 0] = lo
        ok = one_hot_divergence(s_pts, pts, div) <= budget_pts  # a True prefix (D increasing)
        last = (ok.sum(-1, keepdim=True) - 1).clamp(min=0)  # the last feasible point
        lo = pts.gather(-1, last).squeeze(-1)
        hi = pts.gather(-1, (last + 1).clamp(max=_POINTS)).squeeze(-1)
    t = torch.where(budget <= 0, start, torch.where(done, end, lo))  # budget 0: exactly pi = q
    return _point(s, t, div)


def one_hot_dual(target_prob: torch.Tensor, min_acceptance: torch.Tensor, div: Divergence) -> OneHotPoint:
    """Min divergence with ``P_acc >= min_acceptance`` (clipped to the curve) for one-hot drafts."""
    s = target_prob
    target = torch.as_tensor(min_acceptance, dtype=s.dtype, device=s.device).expand_as(s)
    end = (s > 0).to(s.dtype)
    t = torch.minimum(torch.maximum(target, torch.where(s > 0, s, 0.0)), end)
    return _point(s, t, div)
