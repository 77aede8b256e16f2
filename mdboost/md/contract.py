"""The numerical contract of the mentored decoding core (``docs/theory.md``, section 9).

Every output of :mod:`mdboost.md` on valid input satisfies, per output dtype, the tolerances
of :func:`tolerance`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Tolerance(NamedTuple):
    """Tolerances of the contract for one output dtype."""

    sum: float  # |sum(pi) - 1| and |P_acc(pi) - acceptance|, beyond the inputs' own deviation
    divergence_rel: float  # achieved D <= budget (1 + divergence_rel) + divergence_abs
    divergence_abs: float


_TOL = {
    torch.float64: Tolerance(1e-9, 1e-9, 1e-12),
    torch.float32: Tolerance(1e-5, 1e-5, 1e-7),
}


def tolerance(dtype: torch.dtype) -> Tolerance:
    """The contract's tolerances for outputs of ``dtype`` (half inputs are computed in float32)."""
    return _TOL.get(dtype, _TOL[torch.float32])
