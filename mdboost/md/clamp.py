"""The clamp: the form of every optimal mentored distribution, and what is read off it.

Paper results implemented here (definitions in ``docs/theory.md``, section 4):

- Theorem 3.7 / Corollary 3.10: the optimum is the clamp ``pi(a, b) = max{(1-b) q, min{p, (1+a) q}}``
  (:func:`clamp` elementwise, :func:`mentored_distribution` on ``[..., V]`` rows, with the mass a
  ``support="any"`` solution puts off the target's support);
- ``P_acc(pi) = sum_i min(pi_i, p_i)`` of SD towards ``pi`` (:func:`acceptance_probability`);
- Table 5 / Theorem 4.8: the boosting coefficient ``k = sqrt((1+a) / (1-b))`` (:func:`boost_coefficient`);
- a float64 point ``(a, b)`` in a lower output dtype, rounded towards ``pi = q`` (:func:`point_to_dtype`).

Where on the curve C(p, q) the clamp sits is :mod:`mdboost.md.solve`'s job; these functions take
``(a, b)`` as given. All four are re-exported by :mod:`mdboost.md.solve`.
"""

from __future__ import annotations

import torch

from mdboost.md import support as _support
from mdboost.md._checks import _as_real_tensor, check_budget, check_pair, check_probs

__all__ = ["clamp", "mentored_distribution", "acceptance_probability", "boost_coefficient", "point_to_dtype"]


def boost_coefficient(a, b, *, validate: bool = True) -> torch.Tensor:
    """The boosting coefficient ``k = sqrt((1 + a) / (1 - b))`` (paper, Table 5 / Theorem 4.8).

    Parameters
    ----------
    a, b : float or tensor, broadcastable
        A clamp point: ``a >= 0``, ``0 <= b <= 1``.
    validate : bool, default=True
        Check the ranges (a device synchronisation); False for points from :func:`solve`.

    Returns
    -------
    torch.Tensor
        ``k >= 1``, in ``a``'s float dtype (float64 for integer ``a``); ``inf`` where ``b = 1``.

    Examples
    --------
    >>> float(boost_coefficient(0.0, 0.75))
    2.0
    """
    if not (torch.is_tensor(a) and a.is_floating_point()):
        a = _as_real_tensor("a", a, None)
    b = _as_real_tensor("b", b, a.device).to(a.dtype)
    if validate and ((a < 0).any() or (b < 0).any() or (b > 1).any() or a.isnan().any() or b.isnan().any()):
        raise ValueError(f"boost_coefficient needs a >= 0 and 0 <= b <= 1, got a={a}, b={b}")
    return torch.sqrt((1 + a) / (1 - b))


def clamp(draft_probs, target_probs, a, b) -> torch.Tensor:
    """The clamp ``max{(1-b) q, min{p, (1+a) q}}`` elementwise (``docs/theory.md`` section 4).

    The one implementation of the clamp: :func:`mentored_distribution` applies it to whole rows,
    the ranking to single tokens (:func:`mdboost.ranking.quality.mentored_true_prob`), to a
    common top-k support with its tail bucket (:func:`mdboost.ranking.chains.budget_tilt`) and
    to ratios ``p / q`` with ``q = 1`` (:func:`mdboost.ranking.chains.conditional_acceptance`).

    Parameters
    ----------
    draft_probs, target_probs : tensor or float
        ``p`` and ``q`` (probabilities, masses or ratios); at least one argument is a tensor.
    a, b : float or tensor
        Clamp parameters, ``a >= 0``, ``0 <= b <= 1`` (not checked). All four broadcast together:
        give ``a``, ``b`` a trailing axis of size 1 to clamp ``[..., V]`` rows per ``(...)``.

    Returns
    -------
    torch.Tensor
        The broadcast shape; no renormalisation.

    Examples
    --------
    >>> clamp(torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.2, 0.3, 0.5]), 1.0, 0.5)
    tensor([0.4000, 0.2000, 0.2500])
    """
    return torch.maximum((1 - b) * target_probs, torch.minimum(draft_probs, (1 + a) * target_probs))


def mentored_distribution(
    draft_probs: torch.Tensor,  # [..., V]
    target_probs: torch.Tensor,  # [..., V]
    a,  # scalar or [...]
    b,  # scalar or [...]
    *,
    off_support=None,  # scalar or [...]
    validate: bool = True,
) -> torch.Tensor:  # [..., V]
    """The clamp ``pi(a, b) = max{(1-b) q, min{p, (1+a) q}}`` coordinate-wise (Cor 3.10).

    It sums to one exactly when ``(a, b)`` is on the curve C(p, q); no renormalisation is done.
    With ``off_support`` (from ``solve(..., support="any")``), that mass is added on the tokens
    with ``q_i = 0 < p_i``, split in proportion to ``p`` (``docs/theory.md``, section 4).

    Parameters
    ----------
    draft_probs, target_probs : torch.Tensor of shape (..., V)
        ``p`` and ``q``.
    a, b : float or tensor broadcastable to (...)
        ``a >= 0`` (``+inf`` allowed), ``0 <= b <= 1``.
    off_support : float or tensor broadcastable to (...), optional
        Mass in ``[0, 1]`` on the tokens the target excludes (:attr:`MDSolution.off_support`).
    validate : bool, default=True
        Check the inputs (rows, ranges; raises ValueError naming the argument).

    Returns
    -------
    torch.Tensor of shape (..., V)
        In the common dtype of ``draft_probs`` and ``target_probs`` (float32 for half
        precision; float32 with float64 gives float64); an ``a`` beyond that
        dtype's range acts as its largest finite value, and a ``q_i`` whose ratio ``p_i / q_i``
        overflows the dtype counts as 0, as in the solvers (``docs/theory.md``, section 9).

    Examples
    --------
    >>> p, q = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.2, 0.3, 0.5])
    >>> mentored_distribution(p, q, 1.0, 0.5)
    tensor([0.4000, 0.2000, 0.2500])
    """
    p, q = check_pair(draft_probs, target_probs, validate=validate)
    batch, device = p.shape[:-1], p.device
    a = check_budget("a", a, batch, device, validate=validate)
    b = check_budget("b", b, batch, device, upper=1.0, validate=validate)
    a = a.clamp(max=torch.finfo(p.dtype).max).to(p.dtype).unsqueeze(-1)
    q = torch.where(torch.isinf(p / q) & (q > 0), 0.0, q)  # a ratio beyond the dtype's range: q_i = 0
    pi = clamp(p, q, a, b.to(p.dtype).unsqueeze(-1))
    if off_support is None:
        return pi
    off = check_budget("off_support", off_support, batch, device, upper=1.0, validate=validate)
    return _support.add_off_support(pi, p, q, off)


def acceptance_probability(
    draft_probs: torch.Tensor,  # [..., V]
    output_probs: torch.Tensor,  # [..., V]
    *,
    validate: bool = True,
) -> torch.Tensor:  # [...]
    """``P_acc(pi) = sum_i min(pi_i, p_i) = 1 - TV(pi, p)`` for SD towards ``pi`` (``docs/theory.md`` section 2).

    ``output_probs = target_probs`` gives the acceptance of standard SD. ``validate`` checks
    both rows (finite, non-negative, summing to 1 within the tolerance).
    """
    p = check_probs("draft_probs", draft_probs, validate=validate)
    pi = check_probs("output_probs", output_probs, validate=validate)
    if p.shape != pi.shape:
        raise ValueError(f"draft_probs and output_probs must have the same shape, got {tuple(p.shape)} "
                         f"and {tuple(pi.shape)}")
    return torch.minimum(p, pi).sum(dim=-1)


def point_to_dtype(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A clamp point ``(a, b)`` (float64, any shape) in ``dtype``, each rounded towards 0.

    The solvers work in float64; their points are returned in the input's compute dtype
    (``docs/theory.md``, section 9). Rounded towards 0, the clamp's interval
    ``[(1-b) q_i, (1+a) q_i]`` in ``dtype`` lies inside the float64 point's, so every
    ``pi_i`` moves towards ``q_i`` (or stays): no term ``q_i g(pi_i / q_i)`` of the standardized
    generator (``g >= 0``, convex, ``g(1) = 0``) grows, and ``D_f(pi || q)`` stays within the
    budget the float64 point met, while the mass of ``pi`` moves by at most an ulp of ``a`` and of
    ``b`` (times ``q``'s mass). Rounding to the nearest value instead can turn ``b = 1 - 6e-12``
    into ``b = 1`` in float32: ``pi_i = 0`` where ``q_i > 0``, an infinite ``rkl``. NaN (an unused
    slot) stays NaN, ``+inf`` stays ``+inf``; a finite ``a`` beyond ``dtype``'s range becomes its
    largest finite value (what :func:`mentored_distribution` reads it as).

    Examples
    --------
    >>> a, b = point_to_dtype(torch.tensor(0.1, dtype=torch.float64),
    ...                       torch.tensor(1 - 6e-12, dtype=torch.float64), torch.float32)
    >>> float(b) < 1, float(a) <= 0.1
    (True, True)
    """
    if dtype == a.dtype == b.dtype:
        return a, b
    ab = torch.stack(torch.broadcast_tensors(a, b)).to(torch.float64)  # [2, ...]
    out = ab.to(dtype)
    out = torch.where(out.to(torch.float64) > ab, torch.nextafter(out, torch.zeros_like(out)), out)
    return out[0], out[1]
