"""Speculative verification towards explicit emitted distributions ``pi`` (``verify(mentored_probs=...)``).

Section 2 of ``docs/theory.md``: draft ``x ~ p``, accept with probability ``min(1, pi_x / p_x)``,
at the first rejection draw from ``(pi - p)_+`` normalized; if all K drafts pass, the bonus
token comes from the target at position K. The emitted token at each position follows ``pi``
exactly, with acceptance ``P_acc(pi) = sum_i min(pi_i, p_i)``. Any member of the TV optimal
set (:mod:`mdboost.md.tv_set`), e.g. the boosted projection, is sampled this way.

Randomness is :func:`mdboost.md.verify.verify`'s (:mod:`mdboost.md.sampling`): ``K + 1`` uniforms per row, the acceptance
tests then one inverse-CDF draw (the same ``generator`` contract). With ``pi = q`` this is
standard speculative decoding with the same draws as ``verify`` at budget 0. If the residual
``(pi - p)_+`` is all zero (``pi = p``: a rejection only happens through rounding), the token is
drawn from ``pi`` itself.
"""

from __future__ import annotations

import torch

from mdboost.md._checks import check_probs, compute_dtype
from mdboost.md.divergences import f_divergence, resolve
from mdboost.md.sampling import (VerifyResult, accept_ratio, accepted_prefix, draw_uniforms, emitted_tokens,
                                 inverse_cdf, overlap)

__all__ = ["verify_towards"]


def verify_towards(
    draft_tokens: torch.Tensor,  # [B, K], checked
    draft_probs: torch.Tensor,  # [B, K, V], checked
    target_probs: torch.Tensor,  # [B, K+1, V], checked
    mentored_probs: torch.Tensor,  # [B, K, V]
    *,
    divergence="kl",
    generator=None,
    validate: bool = True,
) -> VerifyResult:
    """Verify K drafts per row towards ``mentored_probs`` (called by ``verify``; module docstring).

    ``divergence`` only names the generator of the reported ``divergence`` stat
    ``D_f(pi || q)``; ``a`` and ``b`` are NaN (``pi`` is not a clamp in general).
    """
    batch, num_draft, vocab = draft_probs.shape
    pi = check_probs("mentored_probs", mentored_probs, ndim=3, validate=validate)
    if tuple(pi.shape) != (batch, num_draft, vocab):
        raise ValueError(f"mentored_probs must have shape {(batch, num_draft, vocab)} (one row per draft), "
                         f"got {tuple(pi.shape)}")
    dtype = compute_dtype(torch.promote_types(torch.promote_types(draft_probs.dtype, target_probs.dtype), pi.dtype))
    p, q_all, pi = draft_probs.to(dtype), target_probs.to(dtype), pi.to(device=draft_probs.device, dtype=dtype)
    q, device = q_all[:, :num_draft], p.device
    tokens = draft_tokens

    def at_draft(x):  # [B, K, V] -> [B, K]
        return torch.gather(x, -1, tokens.unsqueeze(-1)).squeeze(-1)

    p_x, pi_x, q_x = at_draft(p), at_draft(pi), at_draft(q)
    if validate and num_draft and (p_x <= 0).any():
        raise ValueError("draft_tokens contains a token to which draft_probs gives probability 0")
    u = draw_uniforms(batch, num_draft, dtype=dtype, device=device, generator=generator)
    u_acc = u[:, :num_draft]
    num_accepted, by_budget = accepted_prefix(u_acc, accept_ratio(pi_x, p_x), accept_ratio(q_x, p_x))

    bonus = q_all[:, num_draft]  # [B, V]
    if num_draft:
        rpos = num_accepted.clamp(max=num_draft - 1).view(batch, 1, 1).expand(batch, 1, vocab)
        p_rej, pi_rej = torch.gather(p, 1, rpos).squeeze(1), torch.gather(pi, 1, rpos).squeeze(1)  # [B, V]
        resid = (pi_rej - p_rej).clamp(min=0)
        resid = torch.where(resid.sum(-1, keepdim=True) > 0, resid, pi_rej)
        weights = torch.where((num_accepted == num_draft).unsqueeze(-1), bonus, resid)
    else:
        weights = bonus
    sampled = inverse_cdf(weights, u[:, num_draft])
    nan = torch.full((batch, num_draft), float("nan"), dtype=dtype, device=device)
    return VerifyResult(
        tokens=emitted_tokens(tokens, num_accepted, sampled),
        num_accepted=num_accepted,
        acceptance_probability=overlap(p, pi, rescale=validate),
        sd_acceptance=overlap(p, q, rescale=validate),
        divergence=f_divergence(pi, q, resolve(divergence), validate=False).to(dtype),
        accepted_by_budget=by_budget,
        a=nan,
        b=nan.clone(),
    )

