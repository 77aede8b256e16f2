"""Drafter/target diagnostics of the paper's Section 4.3 (definitions reconstructed from it).

Per position, over the coordinates where the drafter ``p`` and the target ``q`` differ, with
``ratio_i = q_i / p_i``:

- ``eps_pq = min_i |ratio_i - 1|`` (how close the most similar coordinate is);
- ``rho_pq = min(min_i ratio_i, 1 / max_i ratio_i)`` (ratios lie in ``[rho_pq, 1/rho_pq]``);
- the boosting coefficient of Theorem 4.8 / Table 5 at an operating point ``(a, b)`` of the
  curve C(p, q): ``k = sqrt((1 + a) / (1 - b))`` (:func:`mdboost.md.clamp.boost_coefficient`,
  re-exported here beside the other diagnostics).

Coordinates where both are zero are ignored; ``p_i = 0 < q_i`` gives ``ratio = inf`` (so
``rho_pq = 0``); ``q_i = 0 < p_i`` gives ``ratio = 0`` (also ``rho_pq = 0``). A position with
``p == q`` everywhere has no differing coordinate: both diagnostics are NaN there.
All functions are batched over leading dims and keep the input's device.
"""

from __future__ import annotations

import torch

from mdboost.md.solve import boost_coefficient

__all__ = ["boost_coefficient", "pair_diagnostics"]


def _check_pair(draft_probs: torch.Tensor, target_probs: torch.Tensor) -> None:
    if draft_probs.shape != target_probs.shape:
        raise ValueError(
            f"draft_probs and target_probs must have the same shape, got {tuple(draft_probs.shape)} "
            f"and {tuple(target_probs.shape)}")
    for name, t in (("draft_probs", draft_probs), ("target_probs", target_probs)):
        if torch.isnan(t).any() or (t < 0).any():
            raise ValueError(f"{name} must be non-negative and free of NaN")


def pair_diagnostics(
    draft_probs: torch.Tensor,  # [..., V]
    target_probs: torch.Tensor,  # [..., V]
    mask: torch.Tensor | None = None,  # [..., V] bool, True = coordinate in the support
) -> tuple[torch.Tensor, torch.Tensor]:  # ([...], [...])
    """``eps_pq`` and ``rho_pq`` per position.

    Parameters
    ----------
    draft_probs, target_probs : tensor [..., V]
        Drafter ``p`` and target ``q`` on a common support (e.g. the cached top-k union).
    mask : bool tensor [..., V], optional
        Restrict to these coordinates (padding entries are False).

    Returns
    -------
    eps_pq, rho_pq : tensors [...]
        ``eps_pq >= 0``; ``rho_pq`` in ``[0, 1]``; NaN where no coordinate differs.
    """
    _check_pair(draft_probs, target_probs)
    p, q = draft_probs, target_probs
    valid = (p != q) & ((p > 0) | (q > 0))
    if mask is not None:
        valid = valid & mask
    ratio = torch.where(p > 0, q / p.clamp_min(torch.finfo(p.dtype).tiny), torch.full_like(q, float("inf")))
    inf = torch.full_like(ratio, float("inf"))
    eps = torch.where(valid, (ratio - 1).abs(), inf).amin(dim=-1)
    low = torch.where(valid, ratio, inf).amin(dim=-1)
    high = torch.where(valid, ratio, torch.zeros_like(ratio)).amax(dim=-1)
    rho = torch.minimum(low, 1 / high).clamp(max=1.0)
    none = ~valid.any(dim=-1)
    nan = torch.full_like(eps, float("nan"))
    return torch.where(none, nan, eps), torch.where(none, nan, rho)

