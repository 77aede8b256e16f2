"""Block verification (Sun et al. 2024), as vLLM 0.34.0 runs it for ``rejection_sample_method="block"``.

Token-wise rejection accepts draft ``j`` on its own ratio ``min(1, q_j(x_j) / p_j(x_j))`` and stops
at the first rejection. Block verification judges the block as a whole: it keeps the running joint
ratio ``r_j = min(1, r_{j-1} q_j(x_j) / p_j(x_j))`` (``r_{-1} = 1``), accepts the *longest* prefix
whose test passes, and resamples from a residual scaled by the accepted prefix's ratio. Emitted
tokens still follow the target exactly, and the expected number of accepted drafts is at least
token-wise rejection's (``docs/theory.md``, section 5b, which proves both and derives the law
:func:`block_acceptance_law` computes).

The port (0-indexed positions ``j = 0..K-1``; ``p`` drafter, ``q`` target; file
``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py`` of the vLLM 0.34.0 wheel):

- ``r_j``: ``_compute_cumulative_log_p_kernel``, line 413 (``log r_j = min(log r_{j-1} + log q -
  log p, 0)``, in log space there; here in probability space, the same values up to rounding);
- the test of position ``j < K - 1``: ``h_j = R_j / (R_j + 1 - r_j)`` with the next position's
  residual mass ``R_j = sum_y max(r_j q_{j+1}(y) - p_{j+1}(y), 0)`` (line 512; line 100 is its
  closed form ``r_j (1 - q_{j+1}(x_{j+1}))`` for one-hot drafts), ``h_j = 1`` where the
  denominator is 0 (line 673); the last position tests ``h_{K-1} = r_{K-1}`` (line 675);
- the accepted length is the *largest* ``j + 1`` whose test passes, 0 if none (line 676: every
  position is tested, later passes overwrite earlier ones);
- the final token: the bonus from ``q_K`` if all ``K`` drafts pass, else, at ``t = num_accepted``,
  a draw from ``max(r_{t-1} q_t - p_t, 0)`` normalised (lines 965-975; ``r_{-1} = 1``, the
  token-wise residual ``(q - p)_+``). If that residual is all zero (a rejection of probability
  zero, reached only by rounding) the draw is from ``q_t`` (vLLM leaves it to its Gumbel argmax
  over ``-inf`` logits).

Randomness. vLLM draws one uniform per draft position, ``tl_rand32(seed ^ (j << 32), pos)``
(lines 615-616), and the final token by a Gumbel-max over the residual keyed by the request's
seed and position (``_seeded_resample_argmax``, line 788). Here each row consumes the ``K + 1``
uniforms of :func:`mdboost.md.sampling.draw_uniforms`: columns ``0..K-1`` are the tests of
positions ``0..K-1`` (all ``K`` are read, not only up to a first rejection), column ``K`` is the
categorical draw by inverse CDF: the same law as vLLM's draws, not the same tokens for a seed.
vLLM accepts on ``u <= h`` with ``u`` in ``(0, 1]``, here on ``u < h`` with ``u`` in ``[0, 1)``:
probability ``h`` either way.

Greedy drafts. With ``draft_sample_method="greedy"`` (vLLM's default, ``vllm/config/speculative.py``
line 682) vLLM keeps no draft logits and verifies the drafts as one-hot (``rejection_sampler_utils.py``
lines 100 and 989-1001): pass one-hot ``draft_probs`` here. Then ``r_j = prod_{i<=j} q_i(x_i)`` and
block verification emits exactly the law of token-wise rejection (``docs/theory.md``, section 5b):
no gain, in law; not the same accepted counts for the same uniforms. A target at temperature 0
(vLLM's ``is_greedy``, line 617) is verified by argmax match whatever the method; here that is a
one-hot target row.
"""

from __future__ import annotations

import math

import torch

from mdboost.md._checks import check_positive_int, check_probs, check_verify_inputs, compute_dtype
from mdboost.md.sampling import VerifyResult, accept_ratio, draw_uniforms, emitted_tokens, inverse_cdf, overlap

__all__ = ["block_acceptance_estimate", "block_acceptance_law", "block_verify", "joint_ratios"]

MAX_STATES = 1 << 22  # (state, slot) pairs one step of block_acceptance_law may enumerate


def joint_ratios(draft_prob: torch.Tensor, target_prob: torch.Tensor) -> torch.Tensor:  # [..., K] x2 -> [..., K]
    """The running joint ratio ``r_j = min(1, r_{j-1} q_j / p_j)``, ``r_{-1} = 1``, along the last axis.

    ``draft_prob`` and ``target_prob`` are the drafter's and the target's probabilities of the
    drafted tokens (``p_j(x_j) > 0``). ``r_j`` is the probability that block verification accepts
    at least ``j + 1`` drafts given them (``docs/theory.md``, section 5b, the lemma).

    >>> joint_ratios(torch.tensor([0.5, 0.5, 0.25]), torch.tensor([1.0, 0.25, 1.0]))
    tensor([1.0000, 0.5000, 1.0000])
    """
    step = _ratio_steps(draft_prob, target_prob)  # [..., K]
    out, r = [], torch.ones_like(draft_prob[..., :1])  # [..., 1]
    for j in range(draft_prob.shape[-1]):
        r = torch.where(r > 0, torch.clamp(r * step[..., j:j + 1], max=1.0), r)
        out.append(r)
    return torch.cat(out, dim=-1) if out else draft_prob.clone()


def _ratio_steps(draft_prob, target_prob):  # [..., K] x2 -> [..., K]
    """``q / p`` per drafted token, unclamped (``r_j = min(1, r_{j-1} * step_j)``); 0 where ``q = 0``."""
    safe = torch.where(draft_prob > 0, draft_prob, torch.ones_like(draft_prob))
    beyond = torch.where(target_prob > 0, math.inf, 0.0).to(target_prob.dtype)  # a draft p never proposes
    return torch.where(draft_prob > 0, target_prob / safe, beyond)


def block_verify(
    draft_tokens: torch.Tensor,  # [B, K]
    draft_probs: torch.Tensor,  # [B, K, V]
    target_probs: torch.Tensor,  # [B, K+1, V]
    *,
    generator=None,
    validate: bool = True,
) -> VerifyResult:
    """Verify K draft tokens per row by block verification (lossless; see the module docstring).

    Parameters
    ----------
    draft_tokens : torch.LongTensor of shape (B, K)
        Tokens proposed by the drafter (``draft_tokens[:, k] ~ draft_probs[:, k]``).
    draft_probs : torch.Tensor of shape (B, K, V)
        Drafter distributions ``p`` (one-hot rows for greedy drafts, as vLLM's default).
    target_probs : torch.Tensor of shape (B, K+1, V)
        Target distributions ``q``; position K gives the bonus token.
    generator : torch.Generator or list of B generators, optional
        Source of the ``K + 1`` uniforms per row (:func:`mdboost.md.sampling.draw_uniforms`).
    validate : bool, default=True
        Check inputs (raises ValueError naming the argument).

    Returns
    -------
    VerifyResult
        ``acceptance_probability`` and ``sd_acceptance`` hold ``1 - TV(p_j, q_j)`` (the emitted
        law is ``q``, so ``P_acc(q)``), ``divergence``, ``a`` and ``b`` are 0;
        ``accepted_by_budget`` marks the emitted drafts that token-wise rejection would have
        rejected on the same uniforms (the drafts block verification recovers).
    """
    tokens, p, q_all = check_verify_inputs(draft_tokens, draft_probs, target_probs, validate=validate)
    batch, num_draft, vocab = p.shape
    dtype = compute_dtype(torch.promote_types(p.dtype, q_all.dtype))
    p, q_all = p.to(dtype), q_all.to(dtype)
    q = q_all[:, :num_draft]  # [B, K, V]
    p_x = torch.gather(p, -1, tokens.unsqueeze(-1)).squeeze(-1)  # [B, K]
    if validate and num_draft and (p_x <= 0).any():
        raise ValueError("draft_tokens contains a token to which draft_probs gives probability 0")
    q_x = torch.gather(q, -1, tokens.unsqueeze(-1)).squeeze(-1)  # [B, K]

    u = draw_uniforms(batch, num_draft, dtype=dtype, device=p.device, generator=generator)  # [B, K+1]
    r = joint_ratios(p_x, q_x)  # [B, K]
    passed = u[:, :num_draft] < _thresholds(r, p, q)  # [B, K]
    rank = torch.arange(1, num_draft + 1, device=p.device)  # [K]
    num_accepted = (passed.long() * rank).amax(-1) if num_draft else torch.zeros(batch, dtype=torch.long,
                                                                                     device=p.device)
    sampled = _final_token(p, q_all, r, num_accepted, u[:, num_draft])
    sd_acc = overlap(p, q, rescale=validate)  # [B, K]
    emitted = rank.unsqueeze(0) <= num_accepted.unsqueeze(-1)  # [B, K]
    zeros = torch.zeros_like(sd_acc)
    return VerifyResult(
        tokens=emitted_tokens(tokens, num_accepted, sampled),
        num_accepted=num_accepted,
        acceptance_probability=sd_acc,
        sd_acceptance=sd_acc,
        divergence=zeros,
        accepted_by_budget=emitted & ~(u[:, :num_draft] < accept_ratio(q_x, p_x)),
        a=zeros,
        b=zeros.clone(),
    )


def _thresholds(r, p, q):  # [B, K], [B, K, V], [B, K, V] -> [B, K]
    """The test ``h_j`` of each position: ``R_j / (R_j + 1 - r_j)`` with the next position's
    residual mass ``R_j``, 1 where that denominator is 0; ``h_{K-1} = r_{K-1}``."""
    resid = (r[:, :-1].unsqueeze(-1) * q[:, 1:] - p[:, 1:]).clamp(min=0).sum(-1)  # [B, K-1]
    denom = resid + 1 - r[:, :-1]
    h = torch.where(denom > 0, resid / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.ones_like(denom))
    return torch.cat([h.clamp(0, 1), r[:, -1:]], dim=-1)


def _final_token(p, q_all, r, num_accepted, u):  # [B, K, V], [B, K+1, V], [B, K], [B], [B] -> [B]
    """The one categorical draw: ``max(r_{t-1} q_t - p_t, 0)`` at ``t = num_accepted < K``, else
    the bonus ``q_K``; ``q_t`` where that residual is all zero."""
    batch, num_draft = r.shape
    rows = torch.arange(batch, device=p.device)
    t = num_accepted  # [B]
    bonus = t == num_draft
    q_t = q_all[rows, t]  # [B, V]
    if num_draft == 0:
        return inverse_cdf(q_t, u)
    t_in = t.clamp(max=num_draft - 1)
    r_prev = torch.where(t_in > 0, r[rows, (t_in - 1).clamp(min=0)], torch.ones_like(r[:, 0]))  # [B]
    resid = (r_prev.unsqueeze(-1) * q_t - p[rows, t_in]).clamp(min=0)  # [B, V]
    empty = (resid.sum(-1) <= 0).unsqueeze(-1)
    weights = torch.where(bonus.unsqueeze(-1) | empty, q_t, resid)
    return inverse_cdf(weights, u)


def _checked_slots(draft_probs, target_probs, counts, validate):  # -> p, q, mass [N, K, S] float64, batch shape
    """Slot values and their masses ``value * count`` (each position's masses sum to 1), flattened to rows."""
    p = check_probs("draft_probs", draft_probs, validate=validate, sums=False)
    q = check_probs("target_probs", target_probs, validate=validate, sums=False)
    if p.ndim < 2 or p.shape != q.shape:
        raise ValueError(f"draft_probs and target_probs must have one shape (..., K, S), got {tuple(p.shape)} "
                         f"and {tuple(q.shape)}")
    c = torch.ones_like(p) if counts is None else check_probs("counts", counts, validate=validate, sums=False)
    try:
        c = torch.broadcast_to(c.to(p.device), p.shape)
    except RuntimeError as exc:
        raise ValueError(f"counts of shape {tuple(c.shape)} does not broadcast to {tuple(p.shape)}") from exc
    p, q, c = (x.to(torch.float64).reshape((-1,) + tuple(p.shape[-2:])) for x in (p, q, c))
    if validate:  # each position's slot masses are a distribution
        check_probs("draft_probs * counts", p * c)
        check_probs("target_probs * counts", q * c)
    return p, q, p * c, tuple(draft_probs.shape[:-2])


def block_acceptance_law(draft_probs, target_probs, counts=None, *, max_states: int = MAX_STATES,
                         validate: bool = True) -> torch.Tensor:  # [..., K, S] x2 (counts too) -> [..., K]
    """Exact law of block verification's accepted length when positions ignore the drafted tokens.

    Position ``j`` of a block drafts from ``p_j`` and is judged against ``q_j``, the same whatever
    was drafted before (the ranking's approximation: each position's pair read off a cached text).
    Then ``P(accepted >= j + 1) = E[r_j]`` over drafts ``x_i ~ p_i``, with the joint ratio
    ``r_j = min(1, r_{j-1} q_j(x_j) / p_j(x_j))`` (``docs/theory.md``, section 5b). The ratio is
    a Markov chain; this enumerates its distinct states position by position (equal states
    merged), which is exact and tractable for small supports: the states can grow as ``S ** j``
    (generic ratios give distinct products), so large supports take
    :func:`block_acceptance_estimate`.

    Parameters
    ----------
    draft_probs, target_probs : torch.Tensor of shape (..., K, S)
        Per-token values of ``p_j`` and ``q_j`` on ``S`` slots.
    counts : torch.Tensor broadcastable to (..., K, S), optional
        Tokens per slot (:class:`mdboost.ranking.support.Aligned`'s ``count``); the slot masses
        ``value * count`` of each position sum to 1. None: one token per slot.
    max_states : int, default=MAX_STATES
        Most (state, slot) pairs one position may enumerate; beyond it a ValueError names the
        Monte-Carlo estimator.
    validate : bool, default=True

    Returns
    -------
    torch.Tensor of shape (..., K), float64
        ``P(accepted >= j)`` for ``j = 1..K``; its sum is the expected accepted length.

    Examples
    --------
    The first draft is accepted as often as token-wise (``1 - TV``); the second more often:

    >>> p = torch.tensor([[0.75, 0.25], [0.75, 0.25]], dtype=torch.float64)
    >>> q = torch.tensor([[0.25, 0.75], [0.25, 0.75]], dtype=torch.float64)
    >>> block_acceptance_law(p, q)
    tensor([0.5000, 0.3750], dtype=torch.float64)

    Token-wise rejection accepts two drafts with probability ``0.5 * 0.5 = 0.25``.
    """
    max_states = check_positive_int("max_states", max_states, allow_none=False)
    p, q, mass, batch_shape = _checked_slots(draft_probs, target_probs, counts, validate)
    rows, num_draft = p.shape[:2]
    out = torch.zeros((rows, num_draft), dtype=torch.float64, device=p.device)
    for n in range(rows):
        r = w = torch.ones(1, dtype=torch.float64, device=p.device)  # states and their probabilities
        for j in range(num_draft):
            keep = mass[n, j] > 0  # slots the drafter proposes
            if r.numel() * int(keep.sum()) > max_states:
                raise ValueError(f"block_acceptance_law: position {j} would enumerate more than max_states="
                                 f"{max_states} (state, slot) pairs; use block_acceptance_estimate")
            step = _ratio_steps(p[n, j, keep], q[n, j, keep])  # [S']
            r_new = torch.where(r.unsqueeze(-1) > 0, (r.unsqueeze(-1) * step).clamp(max=1.0), 0.0).reshape(-1)
            r, where = torch.unique(r_new, return_inverse=True)
            w = torch.zeros_like(r).index_add_(0, where, (w.unsqueeze(-1) * mass[n, j, keep]).reshape(-1))
            out[n, j] = (w * r).sum()
    return out.reshape(batch_shape + (num_draft,))


def block_acceptance_estimate(draft_probs, target_probs, counts=None, *, num_samples: int = 4096, generator=None,
                              validate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:  # -> 2 x [..., K]
    """Seeded Monte-Carlo estimate of :func:`block_acceptance_law`, and its standard error.

    Draws ``num_samples`` blocks ``x_j ~ p_j`` per row and averages the joint ratio ``r_j``, whose
    mean is ``P(accepted >= j + 1)`` (it is that probability given the drafts, so it never varies
    more than the indicator it replaces). Cost ``O(num_samples * K * log S)`` per row, for any
    support.

    Parameters
    ----------
    draft_probs, target_probs, counts
        As in :func:`block_acceptance_law`.
    num_samples : int, default=4096
    generator : torch.Generator, optional
        Source of the ``num_samples * K`` uniforms of each row, drawn position by position.
    validate : bool, default=True

    Returns
    -------
    mean, stderr : torch.Tensor of shape (..., K), float64
        The estimate of ``P(accepted >= j)``, ``j = 1..K``, and its standard error
        (sample standard deviation over ``sqrt(num_samples)``).
    """
    num_samples = check_positive_int("num_samples", num_samples, allow_none=False)
    p, q, mass, batch_shape = _checked_slots(draft_probs, target_probs, counts, validate)
    rows, num_draft, width = p.shape
    cdf = torch.cumsum(mass, dim=-1)  # [N, K, S]
    last = width - 1 - torch.flip(mass > 0, [-1]).long().argmax(-1)  # [N, K] the last proposed slot
    step = _ratio_steps(p, q)  # [N, K, S]
    r = torch.ones((rows, num_samples), dtype=torch.float64, device=p.device)
    means, errors = [], []
    for j in range(num_draft):
        u = torch.rand((rows, num_samples), generator=generator, dtype=torch.float64, device=p.device)
        slot = torch.searchsorted(cdf[:, j].contiguous(), u * cdf[:, j, -1:], right=True)  # [N, M]
        slot = torch.minimum(slot, last[:, j:j + 1])  # rounding past the total: the last proposed slot
        r = torch.where(r > 0, (r * torch.gather(step[:, j], -1, slot)).clamp(max=1.0), r)
        means.append(r.mean(-1))
        errors.append(r.std(-1) / math.sqrt(num_samples) if num_samples > 1 else torch.full_like(r[:, 0], math.inf))
    shape = batch_shape + (num_draft,)
    if not means:
        return (torch.zeros(shape, dtype=torch.float64),) * 2
    return torch.stack(means, -1).reshape(shape), torch.stack(errors, -1).reshape(shape)
