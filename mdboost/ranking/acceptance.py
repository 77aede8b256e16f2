"""Per-position acceptance of SD and of mentored decoding at each divergence budget.

On the aligned support of :mod:`mdboost.ranking.support` (probability masses ``p * count``,
``q * count``):

- SD acceptance ``1 - TV(p, q) = sum_i min(p_i, q_i)``
  (``docs/theory.md``, "Speculative decoding towards a distribution pi");
- MD acceptance at budget ``D`` for generator ``f``: the optimum of (f-MD-1) on the target's support,
  ``P_acc(pi(a, b)) = 1 - E(a)``, from :func:`mdboost.solve` (exact primal by default, or the
  conservative Theorem 3.12 bound), with the operating point ``(a, b)`` kept per position for
  the quality and ``k`` diagnostics.

Rows where the drafter has no distribution (a prompt-lookup drafter that proposes nothing) get
acceptance 0 and ``(a, b) = (0, 0)``: nothing is drafted there (see the speed model).
For a one-hot drafter proposing ``x`` this is ``min(1, (1 + a) q_x)`` (and ``q_x`` for SD).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdboost.md.solve import solve
from mdboost.ranking.support import Aligned


@dataclass
class OperatingPoint:
    """Per-position solution at one (divergence, budget): tensors [N]."""

    divergence: str
    max_divergence: float
    acceptance: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    achieved_divergence: torch.Tensor


DRAFTER_TOL = 1e-9  # P_acc within this of 1: the mentored distribution is p (float64 solutions)


def _normalized(mass: torch.Tensor) -> torch.Tensor:
    return mass / mass.sum(-1, keepdim=True)


def drafter_shares(valid: torch.Tensor, ops: list[OperatingPoint]) -> list[float]:
    """Per operating point, the share of the ``valid`` positions where its mentored distribution
    is the drafter's own: ``P_acc = 1`` (``sum_i min(p_i, pi_i) = 1`` iff ``pi = p``). In the
    exact problem these are the positions where the budget is at least ``D_f(p || q)`` and ``p``
    lies in ``q``'s support (``docs/theory.md``, "Degenerate budgets"); reading the solution
    itself holds for ``mode="bound"`` too. At share 1 the point emits the drafter's distribution
    everywhere. NaN without valid positions.
    """
    if not bool(valid.any()):
        return [float("nan")] * len(ops)
    return [float((op.acceptance[valid] >= 1 - DRAFTER_TOL).double().mean()) for op in ops]


def sd_acceptance(aligned: Aligned, valid: torch.Tensor) -> torch.Tensor:  # [N]
    """``sum_i min(p_i, q_i)`` per position (0 where ``valid`` is False)."""
    acc = torch.minimum(aligned.p_mass, aligned.q_mass).sum(-1).clamp(0.0, 1.0)
    return torch.where(valid, acc, torch.zeros_like(acc))


def md_operating_points(aligned: Aligned, valid: torch.Tensor, divergences, budgets, mode: str = "exact",
                        chunk: int = 4096) -> list[OperatingPoint]:
    """Solve (f-MD-1) per position for every divergence and budget.

    Parameters
    ----------
    aligned : Aligned
        ``[N, S]`` support (float64).
    valid : bool tensor [N]
        Rows where the drafter has a distribution.
    divergences : list of str
    budgets : list of float (``max_divergence`` values, >= 0)
    mode : {"exact", "bound"}
    chunk : int
        Rows per solver call (all budgets are solved in one batched call; bounds memory).

    Returns
    -------
    list of OperatingPoint, divergence-major.
    """
    p = _normalized(aligned.p_mass[valid])  # [M, S]
    q = _normalized(aligned.q_mass[valid])
    idx = valid.nonzero().squeeze(-1)
    n, n_b = valid.shape[0], len(budgets)
    budget_t = torch.tensor([float(x) for x in budgets], dtype=torch.float64)[:, None]  # [B, 1]
    out = []
    for div in divergences:
        fields = {k: torch.zeros(n_b, n, dtype=torch.float64) for k in ("acceptance", "a", "b", "achieved")}
        for start in range(0, idx.numel(), chunk):
            sl = slice(start, start + chunk)
            rows = idx[sl]
            shape = (n_b, *p[sl].shape)  # every budget at once: batch [B, rows]
            sol = solve(p[sl].expand(shape), q[sl].expand(shape), max_divergence=budget_t, divergence=div,
                        mode=mode, validate=False)
            fields["acceptance"][:, rows] = sol.acceptance.double()
            fields["a"][:, rows] = sol.a.double()
            fields["b"][:, rows] = sol.b.double()
            fields["achieved"][:, rows] = sol.achieved_divergence.double()
        for i, budget in enumerate(budgets):
            out.append(OperatingPoint(div, float(budget), fields["acceptance"][i].clamp(0.0, 1.0),
                                      fields["a"][i], fields["b"][i], fields["achieved"][i]))
    return out
