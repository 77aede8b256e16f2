"""The numerical contract of the mentored decoding core (``docs/theory.md``, section 9).

For valid input, every output of :mod:`mdboost.md` satisfies, per output dtype, the tolerances
of :func:`tolerance`: no NaN; a curve point ``(a, b)`` with ``a >= 0``, ``0 <= b <= 1`` whose
``pi = mentored_distribution(p, q, a, b)`` sums to 1 and has ``P_acc(pi) = acceptance`` within
``sum`` (beyond the inputs' own deviation from 1); an achieved divergence in ``[0, budget]``
within ``divergence_rel * budget + divergence_abs`` (exact and bound modes); the exact mode's
acceptance at least the bound mode's (within ``sum``); acceptances in ``[0, 1]``. Half-precision
inputs are computed in float32 (sums in float64) and have float32's tolerances.

Low precision. The solvers work in float64 on the rows rescaled to sum 1 (validated input) and
return ``(a, b)`` in the output dtype rounded towards ``pi = q``
(:func:`mdboost.md.clamp.point_to_dtype`): ``D_f(pi(a, b) || q)`` on those rows, with ``pi``
evaluated at the returned float32 ``(a, b)``, stays within the budget's tolerance, as the
reported achieved divergence does (rounding ``b = 1 - 6e-12`` to nearest gave ``b = 1`` and
an infinite ``rkl``). On the unrescaled rows of a float16 input (off by up to ``1e-2``) that
value moves with the rows' own deviation, which no choice of ``(a, b)`` removes. Probabilities
read off the rows (``verify``'s ``sd_acceptance``) are of the rescaled rows too.

The fuzz harness of the test suite (``tests/_fuzz_core.py``) checks these on generated inputs.

Examples
--------
>>> import torch
>>> tolerance(torch.float64).sum
1e-09
>>> tolerance(torch.bfloat16) == tolerance(torch.float32)
True
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["Tolerance", "tolerance"]


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
    """The contract's tolerances for outputs of ``dtype`` (half precision: float32's)."""
    return _TOL.get(dtype, _TOL[torch.float32])
