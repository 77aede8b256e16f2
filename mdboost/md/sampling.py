"""Speculative sampling's shared steps: the draws, the accepted prefix, the emitted tokens.

Both verifiers use them: :func:`mdboost.md.verify.verify` towards the clamp ``pi(a, b)``
(``docs/theory.md``, "Sampling at (a, b)") and :func:`mdboost.md.towards.verify_towards`
towards an explicit ``pi`` (``docs/theory.md``, section 2). They differ only in the acceptance
ratio and in the residual of the final draw; the randomness contract below is theirs.

Randomness. Each row consumes exactly ``K + 1`` uniforms (:func:`draw_uniforms`): columns
``0..K-1`` are the acceptance tests of positions ``0..K-1``, column ``K`` is the single
categorical draw (the residual resample at the first rejection, or the bonus token), sampled by
inverse CDF (:func:`inverse_cdf`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["PLACEHOLDER_TOKEN_ID", "VerifyResult", "accept_ratio", "accepted_prefix", "draw_uniforms",
           "emitted_tokens", "inverse_cdf", "overlap"]

PLACEHOLDER_TOKEN_ID = -1  # pads ``tokens`` after the last emitted token


@dataclass(frozen=True)
class VerifyResult:
    """Output of :func:`mdboost.md.verify.verify`.

    Attributes
    ----------
    tokens : torch.LongTensor of shape (B, K + 1)
        Accepted draft tokens, then the resampled (or bonus) token, then
        ``PLACEHOLDER_TOKEN_ID`` padding. Row ``i`` holds ``num_accepted[i] + 1`` tokens.
    num_accepted : torch.LongTensor of shape (B,)
        Number of accepted draft tokens, in ``0..K``.
    acceptance_probability : torch.Tensor of shape (B, K)
        Optimal MD acceptance probability ``P_acc(pi)`` at each position (on the target's support).
    sd_acceptance : torch.Tensor of shape (B, K)
        Acceptance of standard SD at each position, ``1 - TV(p, q)``, of the rows as solved
        (rescaled to sum 1 when validated: :func:`overlap`), in ``[0, 1]``.
    divergence : torch.Tensor of shape (B, K)
        Realized ``D_f(pi || q)`` at each position.
    accepted_by_budget : torch.BoolTensor of shape (B, K)
        Emitted draft tokens that SD (same uniform) would have rejected.
    a, b : torch.Tensor of shape (B, K)
        The clamp parameters used at each position.

    Stats are computed for all K positions; only positions ``<= num_accepted`` were used.
    With ``top_k`` they refer to the restricted (top-k, renormalised) target.
    """

    tokens: torch.Tensor
    num_accepted: torch.Tensor
    acceptance_probability: torch.Tensor
    sd_acceptance: torch.Tensor
    divergence: torch.Tensor
    accepted_by_budget: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor


def draw_uniforms(batch: int, num_draft: int, *, dtype, device, generator=None) -> torch.Tensor:  # [B, K+1]
    """The ``K + 1`` uniforms per row consumed by :func:`mdboost.md.verify.verify`, in its fixed order.

    ``generator`` may be one :class:`torch.Generator` (one ``torch.rand((B, K+1))`` call) or a
    list of B generators (row ``i`` draws ``torch.rand(K+1)`` from ``generator[i]``), so that a
    batched call equals row-by-row calls exactly.
    """
    if generator is None or isinstance(generator, torch.Generator):
        return torch.rand((batch, num_draft + 1), generator=generator, dtype=dtype, device=device)
    if not isinstance(generator, (list, tuple)):
        raise TypeError(f"generator must be a torch.Generator or a list of {batch} generators, got {generator!r}")
    gens = list(generator)
    if len(gens) != batch or not all(isinstance(g, torch.Generator) for g in gens):
        raise ValueError(f"generator must be a torch.Generator or a list of {batch} generators, got {generator!r}")
    rows = [torch.rand(num_draft + 1, generator=g, dtype=dtype, device=device) for g in gens]
    return torch.stack(rows) if rows else torch.empty((0, num_draft + 1), dtype=dtype, device=device)


def overlap(p: torch.Tensor, r: torch.Tensor, *, rescale: bool) -> torch.Tensor:  # [..., V] x2 -> [...]
    """``sum_i min(p_i, r_i)``: the acceptance of SD from ``p`` towards ``r`` (``r = q``: ``1 - TV(p, q)``).

    Summed in float64 and returned in ``p``'s dtype. ``rescale``: of the rows rescaled to sum 1,
    as the solvers read validated rows (``docs/theory.md``, section 9): valid rows may sum to
    ``1 +- 1e-2`` (half precision), and two rows both above 1 would otherwise overlap by more
    than 1 (``1.002`` for two equal float16 rows). ``min(p_i / s_p, r_i / s_r)`` is computed as
    ``min(p_i s_r / s_p, r_i) / s_r``; the float64 sum is then at most 1 up to its rounding,
    which the clamp to ``[0, 1]`` removes (as every acceptance of the core).

    >>> p, q = torch.tensor([0.6, 0.5], dtype=torch.float64), torch.tensor([0.5, 0.5], dtype=torch.float64)
    >>> round(float(overlap(p, q, rescale=True)), 4), float(overlap(p, q, rescale=False))  # p sums to 1.1
    (0.9545, 1.0)
    """
    if rescale and p.numel():
        s_p, s_r = p.sum(-1, keepdim=True, dtype=torch.float64), r.sum(-1, keepdim=True, dtype=torch.float64)
        mass = torch.minimum(p * (s_r / s_p).to(p.dtype), r).sum(-1, dtype=torch.float64) / s_r.squeeze(-1)
    else:
        mass = torch.minimum(p, r).sum(-1, dtype=torch.float64)
    return mass.clamp(0.0, 1.0).to(p.dtype)


def accept_ratio(num: torch.Tensor, p_x: torch.Tensor) -> torch.Tensor:  # [...] x2 -> [...]
    """``min(1, num / p_x)``, the acceptance probability of a draft ``x`` whose emitted mass is
    ``num`` (``pi_x``, or ``(1+a) q_x`` at a clamp); a draft with ``p_x = 0`` is accepted iff
    ``num > 0``."""
    return torch.where(p_x > 0, num / torch.where(p_x > 0, p_x, 1.0), (num > 0).to(num.dtype)).clamp(max=1)


def accepted_prefix(u_acc: torch.Tensor, ratio: torch.Tensor, sd_ratio: torch.Tensor):  # [B, K] x3 -> [B], [B, K]
    """Accepted drafts per row and the emitted ones that SD would have rejected.

    Draft ``k`` passes its test when ``u_acc[:, k] < ratio[:, k]``; a row emits its drafts up
    to the first failed test. ``sd_ratio`` is SD's ratio ``min(1, q_x / p_x)`` on the same
    uniforms (``VerifyResult.accepted_by_budget``).
    """
    num_accepted = torch.cumprod((u_acc < ratio).long(), dim=-1).sum(-1)  # [B]
    emitted = torch.arange(u_acc.shape[-1], device=u_acc.device) < num_accepted.unsqueeze(-1)  # [B, K]
    return num_accepted, emitted & ~(u_acc < sd_ratio)


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:  # [B, W], [B] -> [B]
    """Inverse-CDF draw; never returns a zero-weight index (rounding-safe).

    The first index whose CDF exceeds ``u`` times the total has a positive weight, unless
    rounding puts ``u`` times the total at the total itself (no index then): those rows take
    the last positive weight, looked up only when some row needs it.
    """
    cdf = torch.cumsum(weights, dim=-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1).contiguous(), right=True).squeeze(-1)
    width = weights.shape[-1]
    beyond = idx >= width  # [B]
    if bool(beyond.any()):
        last = width - 1 - torch.flip(weights[beyond] > 0, [-1]).long().argmax(dim=-1)
        idx = idx.masked_scatter(beyond, last)
    return idx


def emitted_tokens(draft_tokens: torch.Tensor, num_accepted: torch.Tensor,
                   sampled: torch.Tensor) -> torch.Tensor:  # [B, K], [B], [B] -> [B, K+1]
    """The accepted drafts, then the sampled token, then ``PLACEHOLDER_TOKEN_ID`` padding."""
    batch, num_draft = draft_tokens.shape
    ar = torch.arange(num_draft + 1, device=draft_tokens.device)
    pad = torch.full((batch, 1), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=draft_tokens.device)
    n = num_accepted.unsqueeze(-1)
    out = torch.where(ar < n, torch.cat([draft_tokens, pad], dim=1), PLACEHOLDER_TOKEN_ID)
    return torch.where(ar == n, sampled.unsqueeze(-1), out)
