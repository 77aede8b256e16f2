"""Speed model for ranking pairs (math note section 6; Leviathan et al. 2023, Thm 3.8 / Cor 3.11).

With a mean per-token acceptance ``alpha`` (assumed i.i.d. over positions), a draft length
``gamma`` and a cost ratio ``c = drafter step time / target step time``:

- expected tokens per target call: ``(1 - alpha^(gamma+1)) / (1 - alpha)``
  (``gamma + 1`` at ``alpha = 1``);
- expected walltime speedup over plain decoding with the target:
  ``(1 - alpha^(gamma+1)) / ((1 - alpha) (gamma c + 1))``.

Mentored decoding leaves the per-token cost of SD unchanged (the note, section 4), so the same
model applies with ``alpha`` = MD acceptance. For a drafter that proposes nothing at some
positions (prompt-lookup ``ngram``), those positions count as acceptance 0: a block that starts
there costs one target call and yields one token, which is what ``alpha = 0`` gives.
"""

from __future__ import annotations

import torch


def _check_alpha(alpha: torch.Tensor) -> torch.Tensor:
    alpha = torch.as_tensor(alpha, dtype=torch.float64)
    if torch.isnan(alpha).any() or (alpha < 0).any() or (alpha > 1).any():
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    return alpha


def expected_tokens(alpha, gamma) -> torch.Tensor:
    """Expected tokens emitted per target call, ``(1 - alpha^(gamma+1)) / (1 - alpha)``.

    Parameters
    ----------
    alpha : float or tensor in [0, 1]
        Mean per-token acceptance probability.
    gamma : int or tensor of ints >= 0
        Draft length (tokens proposed per target call). Broadcasts against ``alpha``.
    """
    alpha = _check_alpha(alpha)
    gamma = torch.as_tensor(gamma, dtype=torch.float64)
    if (gamma < 0).any():
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    geometric = (1 - alpha ** (gamma + 1)) / (1 - alpha).clamp_min(1e-300)
    return torch.where(alpha >= 1, gamma + 1, geometric)


def walltime_speedup(alpha, gamma, cost_ratio) -> torch.Tensor:
    """Predicted walltime speedup ``expected_tokens / (gamma c + 1)`` over target-only decoding.

    Parameters
    ----------
    alpha : float or tensor in [0, 1]
        Mean per-token acceptance probability.
    gamma : int or tensor >= 0
        Draft length.
    cost_ratio : float or tensor >= 0
        ``c`` = drafter step time / target step time (measured).
    """
    c = torch.as_tensor(cost_ratio, dtype=torch.float64)
    if torch.isnan(c).any() or (c < 0).any():
        raise ValueError(f"cost_ratio must be >= 0, got {c}")
    gamma_t = torch.as_tensor(gamma, dtype=torch.float64)
    return expected_tokens(alpha, gamma) / (gamma_t * c + 1)


def best_gamma(alpha, cost_ratio, gamma_min: int = 1, gamma_max: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft length in ``[gamma_min, gamma_max]`` that maximizes the predicted speedup.

    Parameters
    ----------
    alpha : float or tensor [...] in [0, 1]
    cost_ratio : float or tensor [...] >= 0 (broadcast against ``alpha``)
    gamma_min, gamma_max : int
        Search range, ``1 <= gamma_min <= gamma_max``. Ties go to the smallest gamma.

    Returns
    -------
    gamma : LongTensor [...]
    speedup : float64 tensor [...]
        The speedup at that gamma (may be below 1: speculation would not pay off).
    """
    if int(gamma_min) != gamma_min or int(gamma_max) != gamma_max or not 1 <= gamma_min <= gamma_max:
        raise ValueError(f"gamma range must satisfy 1 <= gamma_min <= gamma_max, got {(gamma_min, gamma_max)}")
    alpha = _check_alpha(alpha)
    c = torch.as_tensor(cost_ratio, dtype=torch.float64)
    alpha, c = torch.broadcast_tensors(alpha, c)
    gammas = torch.arange(gamma_min, gamma_max + 1, dtype=torch.float64)  # [G]
    speed = walltime_speedup(alpha.unsqueeze(-1), gammas, c.unsqueeze(-1))  # [..., G]
    best = speed.argmax(dim=-1)  # first maximum: the smallest gamma on ties
    return best + gamma_min, speed.gather(-1, best.unsqueeze(-1)).squeeze(-1)
