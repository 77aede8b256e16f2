"""The total-variation optimal set of mentored decoding and projections onto it (paper Section 3.2).

For ``f = tv`` the optimum of (f-MD-1) is not unique. With ``U = {p_i >= q_i}``,
``L = {p_i < q_i}`` and the effective budget ``D' = min(D, TV(p, q))``, the optimal set is
(``docs/theory.md``, "The TV optimal set")::

    min(p_i, q_i) <= pi_i <= max(p_i, q_i),   sum_U pi_i = q(U) + D',   sum_L pi_i = q(L) - D'

Every member has the optimal acceptance ``P_acc(pi) = 1 - TV(p, q) + D'`` (``min(1, 1 - TV + D)``)
and ``TV(pi, q) = D'``; every optimum is a member. The clamp solution and the convex combination
``(1 - l) q + l p`` are two members among many.

- :func:`tv_optimal_set`: the bounds and group sums, batched over ``[..., V]``;
- :func:`is_tv_optimal`: membership within a tolerance;
- :func:`project_tv_optimal`: the member closest to a reference ``r`` in ``KL(pi || r)``,
  ``pi_i = clip(s_g r_i, lo_i, hi_i)`` with one scale ``s_g`` per group, found exactly by one
  sort of the clip breakpoints per group (``O(V log V)``; derivation in ``docs/theory.md``);
- :func:`geometric_mixture` and :class:`BoostedMentor`: the boosted ensemble of the pair
  (paper Section 4.3: ``softmax(H_T)`` for ``T = 2``, i.e. ``q^c1 p^c2`` normalized) projected
  onto the set, as an engine mentor (:class:`mdboost.engine.GenerationSettings`'s ``mentor``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mdboost.md._checks import check_budget, check_pair, check_probs, check_real

__all__ = ["TVOptimalSet", "TVProjection", "tv_optimal_set", "is_tv_optimal", "project_tv_optimal", "tv_projection",
           "geometric_mixture", "BoostedMentor"]


@dataclass(frozen=True)
class TVOptimalSet:
    """The optimal set of TV-MD for a batch of pairs.

    Attributes
    ----------
    lower, upper : torch.Tensor of shape (..., V)
        The box ``min(p, q)`` and ``max(p, q)``.
    upper_group : torch.BoolTensor of shape (..., V)
        ``U = {p_i >= q_i}`` (the rest is ``L``).
    upper_sum, lower_sum : torch.Tensor of shape (...)
        The mass of every member on ``U`` (``q(U) + D'``) and on ``L`` (``q(L) - D'``).
    divergence : torch.Tensor of shape (...)
        ``D' = min(D, TV(p, q))``: ``TV(pi, q)`` of every member.
    acceptance : torch.Tensor of shape (...)
        ``P_acc(pi) = 1 - TV(p, q) + D'`` of every member (the optimum).
    """

    lower: torch.Tensor
    upper: torch.Tensor
    upper_group: torch.Tensor
    upper_sum: torch.Tensor
    lower_sum: torch.Tensor
    divergence: torch.Tensor
    acceptance: torch.Tensor


def _set64(p, q, budget):  # [..., V] float64 x2, [...] float64 -> TVOptimalSet in float64
    up = p >= q
    zero = torch.zeros_like(p)
    q_u, q_l = torch.where(up, q, zero).sum(-1), torch.where(up, zero, q).sum(-1)
    p_u, p_l = torch.where(up, p, zero).sum(-1), torch.where(up, zero, p).sum(-1)
    # TV(p, q) from each side; on rows that do not sum to 1 exactly the smaller keeps both groups feasible
    tv = torch.minimum(p_u - q_u, q_l - p_l).clamp(min=0.0)
    eff = torch.minimum(budget, tv)
    return TVOptimalSet(torch.minimum(p, q), torch.maximum(p, q), up, q_u + eff, q_l - eff, eff,
                        (torch.minimum(p, q).sum(-1) + eff).clamp(0.0, 1.0))


def _inputs(draft_probs, target_probs, max_divergence, validate):
    p, q = check_pair(draft_probs, target_probs, validate=validate)
    budget = check_budget("max_divergence", max_divergence, p.shape[:-1], p.device, validate=validate)
    return p, q, p.dtype, budget


def tv_optimal_set(
    draft_probs: torch.Tensor,  # [..., V]
    target_probs: torch.Tensor,  # [..., V]
    max_divergence,  # float or [...]
    *,
    validate: bool = True,
) -> TVOptimalSet:
    """The bounds and group sums of the TV-MD optimal set (module docstring).

    Parameters
    ----------
    draft_probs, target_probs : torch.Tensor of shape (..., V)
        Drafter ``p`` and target ``q``.
    max_divergence : float or tensor broadcastable to (...)
        The budget ``D >= 0`` on ``TV(pi || q)`` (``+inf`` allowed: the set is ``{p}``).
    validate : bool, default=True
        Check the inputs (ValueError naming the argument).

    Returns
    -------
    TVOptimalSet
        Sums in float64, returned in the inputs' compute dtype.

    Examples
    --------
    >>> p = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    >>> q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    >>> s = tv_optimal_set(p, q, 0.1)
    >>> s.upper_group.tolist(), round(float(s.upper_sum), 6), round(float(s.acceptance), 6)
    ([True, False, False], 0.3, 0.6)
    """
    p, q, dtype, budget = _inputs(draft_probs, target_probs, max_divergence, validate)
    s = _set64(p.double(), q.double(), budget)
    return TVOptimalSet(*(x.to(dtype) if x.is_floating_point() else x for x in
                          (s.lower, s.upper, s.upper_group, s.upper_sum, s.lower_sum, s.divergence, s.acceptance)))


def is_tv_optimal(
    mentored_probs: torch.Tensor,  # [..., V]
    draft_probs: torch.Tensor,  # [..., V]
    target_probs: torch.Tensor,  # [..., V]
    max_divergence,
    *,
    atol: float = 1e-9,
    validate: bool = True,
) -> torch.Tensor:  # [...] bool
    """Whether each row ``pi`` lies in the TV-MD optimal set, within ``atol``.

    ``atol`` applies to every coordinate's box and to both group sums.

    Examples
    --------
    >>> p = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    >>> q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    >>> lam = 0.1 / 0.5  # (1 - l) q + l p with l = D / TV(p, q)
    >>> bool(is_tv_optimal((1 - lam) * q + lam * p, p, q, 0.1)), bool(is_tv_optimal(q, p, q, 0.1))
    (True, False)
    """
    p, q, _, budget = _inputs(draft_probs, target_probs, max_divergence, validate)
    pi = check_probs("mentored_probs", mentored_probs, validate=validate)
    if pi.shape != p.shape:
        raise ValueError(f"mentored_probs must have the shape of draft_probs {tuple(p.shape)}, got {tuple(pi.shape)}")
    atol = check_real("atol", atol, low=0.0, high=float("inf"))
    s = _set64(p.double(), q.double(), budget)
    pi = pi.double()
    box = ((pi >= s.lower - atol) & (pi <= s.upper + atol)).all(-1)
    sum_u = torch.where(s.upper_group, pi, torch.zeros_like(pi)).sum(-1)
    sum_l = torch.where(s.upper_group, torch.zeros_like(pi), pi).sum(-1)
    return box & ((sum_u - s.upper_sum).abs() <= atol) & ((sum_l - s.lower_sum).abs() <= atol)


def _clip_scale(r, lo, hi, total):  # [N, V] x3, [N] (float64, r >= 0, lo <= hi) -> pi [N, V], s [N]
    """``clip(s r, lo, hi)`` with the ``s >= 0`` that makes the row sum ``total``.

    ``g(s) = sum_i clip(s r_i, lo_i, hi_i)`` is continuous, non-decreasing and piecewise linear,
    with kinks at ``lo_i / r_i`` (coordinate ``i`` leaves ``lo_i``) and ``hi_i / r_i`` (it
    reaches ``hi_i``). With both kink lists sorted, ``g`` at any ``s`` is prefix sums:
    ``g(s) = hi(B <= s) + lo(A > s) + s r(A <= s < B)``. ``g`` at every kink, one search for
    ``total`` among them, and ``g`` is linear up to the next kink. A coordinate with
    ``r_i = 0`` (or a kink beyond float64) stays at ``lo_i``; where the others cannot carry
    ``total`` even at their upper bounds, the rest is spread over those coordinates in
    proportion to their room ``hi_i - lo_i`` (then no member has a finite ``KL(pi || r)``).
    """
    inf = torch.tensor(float("inf"), dtype=r.dtype, device=r.device)
    pos = r > 0
    kink_lo = torch.where(pos, lo / torch.where(pos, r, 1.0), inf)  # [N, V]
    kink_hi = torch.where(pos, hi / torch.where(pos, r, 1.0), inf)
    pos = pos & torch.isfinite(kink_hi)  # a ratio beyond float64 counts as r_i = 0
    kink_lo, kink_hi = torch.where(pos, kink_lo, inf), torch.where(pos, kink_hi, inf)
    r_act = torch.where(pos, r, torch.zeros_like(r))
    a_sorted, ia = torch.sort(kink_lo, dim=-1)
    b_sorted, ib = torch.sort(kink_hi, dim=-1)
    zero = torch.zeros_like(total)[..., None]
    cum_lo = torch.cat([zero, torch.cumsum(torch.gather(lo, -1, ia), -1)], -1)  # [N, V+1]
    cum_ra = torch.cat([zero, torch.cumsum(torch.gather(r_act, -1, ia), -1)], -1)
    cum_hi = torch.cat([zero, torch.cumsum(torch.gather(hi, -1, ib), -1)], -1)
    cum_rb = torch.cat([zero, torch.cumsum(torch.gather(r_act, -1, ib), -1)], -1)
    lo_total = lo.sum(-1, keepdim=True)

    def parts(s):  # [N, M] -> constant and slope of g at s (the coordinates at a kink s count as moved)
        n_a = torch.searchsorted(a_sorted, s.contiguous(), right=True)
        n_b = torch.searchsorted(b_sorted, s.contiguous(), right=True)
        const = torch.gather(cum_hi, -1, n_b) + lo_total - torch.gather(cum_lo, -1, n_a)
        return const, torch.gather(cum_ra, -1, n_a) - torch.gather(cum_rb, -1, n_b)

    cand = torch.sort(torch.cat([a_sorted, b_sorted], -1), dim=-1).values  # [N, 2V]
    finite = torch.isfinite(cand)
    top = torch.where(finite, cand, torch.zeros_like(cand)).amax(-1, keepdim=True)
    cand = torch.where(finite, cand, top)  # kinks at inf never move: the largest finite kink instead
    const, slope = parts(cand)
    g = const + cand * slope  # [N, 2V], non-decreasing
    k = torch.searchsorted(g, total[..., None].contiguous(), right=True)  # kinks with g <= total
    at = (k - 1).clamp(min=0)
    t = torch.gather(cand, -1, at)
    c_t, s_t = parts(t)
    g_t = c_t + t * s_t
    step = torch.where((k > 0) & (s_t > 0), (total[..., None] - g_t) / torch.where(s_t > 0, s_t, 1.0), 0.0)
    nxt = torch.gather(cand, -1, k.clamp(max=cand.shape[-1] - 1))
    scale = torch.minimum(t + step.clamp(min=0.0), torch.where(k < cand.shape[-1], nxt, inf))
    pi = torch.minimum(torch.maximum(scale * r_act, lo), hi)
    # r = 0 coordinates take what the others cannot carry (in proportion to their room)
    room = torch.where(pos, torch.zeros_like(hi), hi - lo)
    carried = torch.where(pos, hi, lo).sum(-1)
    short = carried < total - 1e-12 * total.abs().clamp(min=1.0)
    share = ((total - pi.sum(-1)) / room.sum(-1).clamp(min=1e-300)).clamp(0.0, 1.0)
    return torch.where(short[..., None], pi + room * share[..., None], pi), scale.squeeze(-1)


@dataclass(frozen=True)
class TVProjection:
    """Output of :func:`tv_projection`.

    Attributes
    ----------
    probs : torch.Tensor of shape (..., V)
        The projection ``pi``.
    upper_scale, lower_scale : torch.Tensor of shape (...)
        ``s_U`` and ``s_L``, float64: ``pi_i = clip(s_g r_i, lo_i, hi_i)`` in the units of the
        given ``reference`` (so a coordinate's value can be recomputed from its own ``p_i``,
        ``q_i``, ``r_i``; except on coordinates with ``r_i = 0`` that the fallback filled).
    """

    probs: torch.Tensor
    upper_scale: torch.Tensor
    lower_scale: torch.Tensor


def project_tv_optimal(
    draft_probs: torch.Tensor,  # [..., V]
    target_probs: torch.Tensor,  # [..., V]
    max_divergence,  # float or [...]
    reference: torch.Tensor,  # [..., V]
    *,
    validate: bool = True,
) -> torch.Tensor:  # [..., V]
    """The member of the TV-MD optimal set closest to ``reference`` in ``KL(pi || r)``
    (:func:`tv_projection`'s ``probs``).

    Examples
    --------
    >>> p = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    >>> q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    >>> project_tv_optimal(p, q, 0.1, reference=q)  # the member closest to q itself
    tensor([0.3000, 0.2625, 0.4375], dtype=torch.float64)
    """
    return tv_projection(draft_probs, target_probs, max_divergence, reference, validate=validate).probs


def tv_projection(
    draft_probs: torch.Tensor,  # [..., V]
    target_probs: torch.Tensor,  # [..., V]
    max_divergence,  # float or [...]
    reference: torch.Tensor,  # [..., V]
    *,
    validate: bool = True,
) -> TVProjection:
    """The member of the TV-MD optimal set closest to ``reference`` in ``KL(pi || r)``.

    ``pi_i = clip(s_U r_i, q_i, p_i)`` on ``U = {p >= q}`` and ``clip(s_L r_i, p_i, q_i)`` on
    ``L``, with the scales that give the group sums of :func:`tv_optimal_set` (the KKT
    conditions of the projection, ``docs/theory.md``); ``O(V log V)`` per row.

    Parameters
    ----------
    draft_probs, target_probs : torch.Tensor of shape (..., V)
        Drafter ``p`` and target ``q``.
    max_divergence : float or tensor broadcastable to (...)
        The TV budget ``D >= 0``.
    reference : torch.Tensor of shape (..., V)
        ``r >= 0``, finite; need not be normalized (KL to ``r`` ignores its scale). Where ``r``
        is 0 on a coordinate, ``pi`` stays at the coordinate's lower bound unless the group
        cannot be filled otherwise (then that mass follows the room ``hi - lo``; an all-zero
        ``r`` gives the convex combination ``(1 - l) q + l p``).
    validate : bool, default=True

    Returns
    -------
    TVProjection
        ``probs`` in the inputs' compute dtype (computed in float64): a member of the set
        (within rounding), so it has the optimal acceptance ``min(1, 1 - TV(p, q) + D)``;
        the two scales.
    """
    p, q, dtype, budget = _inputs(draft_probs, target_probs, max_divergence, validate)
    r = check_probs("reference", reference, validate=validate, sums=False)
    if r.shape != p.shape:
        raise ValueError(f"reference must have the shape of draft_probs {tuple(p.shape)}, got {tuple(r.shape)}")
    batch, vocab = p.shape[:-1], p.shape[-1]
    p64, q64 = p.double().reshape(-1, vocab), q.double().reshape(-1, vocab)
    r64 = r.to(device=p.device, dtype=torch.float64).reshape(-1, vocab)
    s = _set64(p64, q64, budget.reshape(-1))
    up, zero = s.upper_group, torch.zeros_like(p64)
    # both groups in one batched search: [2N, V]
    ref = torch.cat([torch.where(up, r64, zero), torch.where(up, zero, r64)])
    lo = torch.cat([torch.where(up, s.lower, zero), torch.where(up, zero, s.lower)])
    hi = torch.cat([torch.where(up, s.upper, zero), torch.where(up, zero, s.upper)])
    pi, scale = _clip_scale(ref, lo, hi, torch.cat([s.upper_sum, s.lower_sum]))
    n = p64.shape[0]
    return TVProjection((pi[:n] + pi[n:]).reshape(*batch, vocab).to(dtype), scale[:n].reshape(batch),
                        scale[n:].reshape(batch))


def geometric_mixture(
    draft_probs: torch.Tensor,  # [..., V]
    target_probs: torch.Tensor,  # [..., V]
    c_target: float,
    c_drafter: float,
) -> torch.Tensor:  # [..., V]
    """The boosted ensemble of the pair, ``q^c_target p^c_drafter`` normalized (paper Section 4).

    ``softmax(c1 h_q + c2 h_p)`` with logits ``h = log`` of the probabilities (the boosting's
    ``T = 2`` combination up to the logits' per-row shift). A token to which a model with a
    non-zero coefficient gives probability 0 gets 0 (it is outside that model's support).

    Examples
    --------
    >>> p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    >>> q = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64)
    >>> geometric_mixture(p, q, 1.0, 0.0).tolist(), geometric_mixture(p, q, 1.0, 1.0).tolist()
    ([0.25, 0.25, 0.5], [0.5, 0.5, 0.0])
    """
    p, q = check_pair(draft_probs, target_probs, validate=False)
    c1 = check_real("c_target", c_target, low=-float("inf"), high=float("inf"))
    c2 = check_real("c_drafter", c_drafter, low=-float("inf"), high=float("inf"))
    p64, q64 = p.double(), q.double()
    score = torch.zeros_like(p64)
    outside = torch.zeros_like(p64, dtype=torch.bool)
    for c, x in ((c1, q64), (c2, p64)):
        if c != 0:
            score = score + c * torch.where(x > 0, x.log(), torch.zeros_like(x))
            outside |= x <= 0
    score = torch.where(outside, torch.full_like(score, float("-inf")), score)
    empty = torch.isinf(score).all(-1, keepdim=True)  # no common support: the target
    mix = torch.softmax(torch.where(empty, torch.zeros_like(score), score), dim=-1)
    return torch.where(empty, q64, mix).to(p.dtype)


@dataclass(frozen=True)
class BoostedMentor:
    """An engine mentor: the boosted ensemble ``q^c1 p^c2`` projected onto the TV optimal set.

    Called as ``mentor(draft_probs [B, K, V], target_probs [B, K, V]) -> mentored_probs
    [B, K, V]`` (the engine's mentor interface, :class:`mdboost.engine.GenerationSettings`).
    Every emitted distribution has the optimal TV-MD acceptance ``min(1, 1 - TV(p, q) + D)``
    at each position: the same speed as the clamp at budget ``max_divergence``, with the
    quality of the boosted ensemble inside the set.

    Parameters
    ----------
    c_target, c_drafter : float
        The boosting coefficients (``c_target``, ``c_drafter`` of the ranking, fitted on the cache).
    max_divergence : float
        The TV budget ``D >= 0`` per position.
    scale : float, default=1.0
        Temperature of the ensemble: ``q^(s c1) p^(s c2)`` (the ranking's ``boosted_scale``).
    """

    c_target: float
    c_drafter: float
    max_divergence: float
    scale: float = 1.0

    def __post_init__(self):
        for name in ("c_target", "c_drafter"):
            check_real(name, getattr(self, name), low=-float("inf"), high=float("inf"))
        check_real("max_divergence", self.max_divergence, low=0.0, high=float("inf"))
        check_real("scale", self.scale, low=0.0, high=float("inf"))

    def __call__(self, draft_probs: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
        ref = geometric_mixture(draft_probs, target_probs, self.scale * self.c_target, self.scale * self.c_drafter)
        return project_tv_optimal(draft_probs, target_probs, self.max_divergence, ref, validate=False)
