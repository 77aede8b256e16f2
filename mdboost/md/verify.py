"""Batched speculative verification towards the mentored distribution (MD sampling).

Per draft position the optimal clamp ``(a, b)`` (optimal among distributions supported on the
target's support, ``docs/theory.md`` section 3) is solved on (``p`` = drafter, ``q`` = target)
with that position's budget; draft token ``x`` is accepted with probability
``min(1, (1+a) q_x / p_x)``; at the first rejection a token is drawn from
``((1-b) q - p)_+`` normalised; if all K drafts are accepted, a bonus token is drawn from the
target at position K. Emitted tokens then follow ``pi(a, b)`` exactly
(``docs/theory.md``, "Sampling at (a, b)").
``max_divergence = 0`` gives ``a = b = 0`` exactly, i.e. standard speculative decoding with
the same random draws. ``top_k`` solves on the target's k most likely tokens only
(paper, Lemma 6.1): ``O(k log k)`` per position instead of ``O(V log V)``.

Fast paths. A deterministic drafter (every ``p`` one-hot: n-gram / prompt lookup, greedy
drafting) is solved in closed form (:mod:`mdboost.md.onehot`, no sort). ``solve="reached"``
solves a position only for rows that reached it (all earlier drafts accepted);
``solve="needed"`` only where the outcome depends on the clamp: a reached position whose draft
SD would reject (``u >= q_x / p_x``; otherwise it is accepted for every ``a >= 0``), about one
solve per row and step. Both emit exactly the tokens of ``solve="all"`` for the same uniforms.
The realized divergence is read off the breakpoints' prefix sums at the solution.

Randomness. Each row consumes exactly ``K + 1`` uniforms, in this order: columns ``0..K-1``
are the acceptance tests of positions ``0..K-1``, column ``K`` is the single categorical draw
(the residual resample at the first rejection, or the bonus token), sampled by inverse CDF.
``generator`` may be one :class:`torch.Generator` (one ``torch.rand((B, K+1))`` call) or a list
of B generators (row ``i`` draws ``torch.rand(K+1)`` from ``generator[i]``, like vLLM's
per-request generators): with a list, a batched call equals row-by-row calls exactly.

Fallback. If the residual ``((1-b) q - p)_+`` is all zero (``p`` already equals ``pi``, so a
rejection has probability 0 and can only come from rounding), the token is drawn from
``pi(a, b)`` itself.
"""

from __future__ import annotations

import torch

from mdboost.md import _buckets, _router
from mdboost.md._checks import (_as_real_tensor, check_budget, check_positive_int, check_verify_inputs, compute_dtype,
                                is_number)
from mdboost.md.breakpoints import Breakpoints
from mdboost.md.divergences import resolve
from mdboost.md.onehot import one_hot_dual, one_hot_primal
from mdboost.md.options import SOLVE  # torch-free (a config checks it before torch loads)
from mdboost.md.sampling import (PLACEHOLDER_TOKEN_ID, VerifyResult, accept_ratio, accepted_prefix, draw_uniforms,
                                 emitted_tokens, inverse_cdf, overlap)
from mdboost.md.solve import mentored_distribution, point_to_dtype
from mdboost.md.towards import verify_towards

__all__ = ["PLACEHOLDER_TOKEN_ID", "VerifyResult", "verify", "draw_uniforms"]


def _position_budget(name, value, batch, num_draft, device, upper, validate):
    """A budget as documented: a number, or of shape (), (B,) (per row) or (B, K); a sequence or
    array reads as the tensor of its values (so ``[d_0, d_1]`` is per row, as a tensor is)."""
    if not torch.is_tensor(value) and not is_number(value):
        value = _as_real_tensor(name, value, device)
    if torch.is_tensor(value) and value.ndim == 1:
        if value.shape[0] != batch:
            raise ValueError(f"{name} given per row must have shape ({batch},), got {tuple(value.shape)}")
        value = value.unsqueeze(-1)
    return check_budget(name, value, (batch, num_draft), device, upper=upper, validate=validate)


def _restrict_top_k(p, q_all, tokens, k):
    """Lemma 6.1: keep the target's top-k tokens; the drafter's outside mass is one extra slot."""
    q_vals, q_idx = torch.topk(q_all, k, dim=-1)  # [B, K+1, k]
    q_vals = q_vals / q_vals.sum(dim=-1, keepdim=True)
    num_draft = p.shape[1]
    p_sel = torch.gather(p, -1, q_idx[:, :num_draft])  # [B, K, k]
    p_out = (1 - p_sel.sum(dim=-1, keepdim=True)).clamp(min=0)
    p_r = torch.cat([p_sel, p_out], dim=-1)  # [B, K, k+1]
    q_r = torch.cat([q_vals[:, :num_draft], torch.zeros_like(p_out)], dim=-1)
    match = q_idx[:, :num_draft] == tokens.unsqueeze(-1)  # [B, K, k]
    pos = torch.where(match.any(-1), match.long().argmax(-1), torch.full_like(tokens, k))
    pad = torch.full_like(q_idx[..., :1], PLACEHOLDER_TOKEN_ID)
    ids = torch.cat([q_idx, pad], dim=-1)  # [B, K+1, k+1] token id of each restricted slot
    bonus = torch.cat([q_vals[:, num_draft], torch.zeros_like(q_vals[:, num_draft, :1])], dim=-1)
    return p_r, q_r, pos, ids, bonus


def verify(
    draft_tokens: torch.Tensor,  # [B, K]
    draft_probs: torch.Tensor,  # [B, K, V]
    target_probs: torch.Tensor,  # [B, K+1, V]
    *,
    max_divergence=0.0,
    divergence="kl",
    min_acceptance=None,
    top_k: int | None = None,
    generator=None,
    solve: str = "all",
    validate: bool = True,
    mentored_probs: torch.Tensor | None = None,  # [B, K, V]
) -> VerifyResult:
    """Verify K draft tokens per row with mentored decoding.

    Parameters
    ----------
    draft_tokens : torch.LongTensor of shape (B, K)
        Tokens proposed by the drafter (``draft_tokens[:, k] ~ draft_probs[:, k]``).
    draft_probs : torch.Tensor of shape (B, K, V)
        Drafter distributions ``p`` (one-hot rows, a deterministic drafter, are valid).
    target_probs : torch.Tensor of shape (B, K+1, V)
        Target distributions ``q``; position K gives the bonus token.
    max_divergence : float or tensor of shape (), (B,) or (B, K), default=0.0
        Per-position budget on ``D_f(pi || q)``. 0 is standard speculative decoding.
    divergence : str, Divergence or callable, default="kl"
    min_acceptance : float or tensor of shape (), (B,) or (B, K), optional
        Use the dual instead: minimal divergence with ``P_acc >= min_acceptance``
        (then ``max_divergence`` must stay 0).
    top_k : int, optional
        Replace the target by its top-k tokens, renormalised (a no-op on the distribution
        when ``target_probs`` already came from ``logits_to_probs(top_k=k)``), and solve on
        those only (Lemma 6.1).
    generator : torch.Generator or list of B generators, optional
        Source of the ``K + 1`` uniforms per row (see the module docstring).
    solve : {"all", "reached", "needed"}, default="all"
        Where the clamp is computed (see the module docstring): every position; positions a
        row reached; or only reached positions that SD would reject. The same tokens and
        ``num_accepted`` for the same uniforms; the per-position stats (``a``, ``b``,
        ``acceptance_probability``, ``divergence``) of unsolved positions are NaN. Where every
        position costs no solve (budget 0: SD; every draft one-hot: the closed form) all
        positions have their stats whatever ``solve`` says.
    validate : bool, default=True
        Check inputs (raises ValueError naming the argument).
    mentored_probs : torch.Tensor of shape (B, K, V), optional
        Emit these distributions instead of solving a clamp: accept ``x`` with
        ``min(1, pi_x / p_x)``, resample from ``(pi - p)_+`` (:mod:`mdboost.md.towards`), e.g. a
        member of the TV optimal set (:func:`mdboost.md.tv_set.project_tv_optimal`). The
        budget must stay unset and ``top_k`` None; ``divergence`` names the reported
        ``D_f(pi || q)``; ``a``, ``b`` are NaN.

    Returns
    -------
    VerifyResult
    """
    tokens, p, q_all = check_verify_inputs(draft_tokens, draft_probs, target_probs, validate=validate)
    batch, num_draft, vocab = p.shape
    if not isinstance(solve, str) or solve not in SOLVE:
        raise ValueError(f"solve must be one of {SOLVE}, got {solve!r}")
    if mentored_probs is not None:  # an explicit pi per position (docs/theory.md, section 2)
        return _verify_towards(tokens, p, q_all, mentored_probs, max_divergence, min_acceptance, top_k, divergence,
                               generator, validate)
    top_k = check_positive_int("top_k", top_k)
    dtype = compute_dtype(torch.promote_types(p.dtype, q_all.dtype))
    p, q_all, device = p.to(dtype), q_all.to(dtype), p.device
    div = resolve(divergence)
    sd_only = min_acceptance is None and isinstance(max_divergence, (int, float)) and max_divergence == 0
    if min_acceptance is not None and not (isinstance(max_divergence, (int, float)) and max_divergence == 0):
        raise ValueError(f"give max_divergence or min_acceptance, not both (max_divergence={max_divergence!r})")
    dual = min_acceptance is not None
    name, value = ("min_acceptance", min_acceptance) if dual else ("max_divergence", max_divergence)
    # checked even when there is nothing to solve (K = 0 or B = 0): a bad budget is always reported
    if validate or not sd_only:
        budget = _position_budget(name, value, batch, num_draft, device, 1.0 if dual else None, validate)

    p_x = torch.gather(p, -1, tokens.unsqueeze(-1)).squeeze(-1)  # [B, K]
    if validate and num_draft and (p_x <= 0).any():
        raise ValueError("draft_tokens contains a token to which draft_probs gives probability 0")
    if top_k is not None and top_k < vocab:
        p_r, q_r, pos, ids, bonus = _restrict_top_k(p, q_all, tokens, top_k)
    else:
        p_r, q_r, pos, ids, bonus = p, q_all[:, :num_draft], tokens, None, q_all[:, num_draft]
    q_x = torch.gather(q_r, -1, pos.unsqueeze(-1)).squeeze(-1)  # [B, K]

    u = draw_uniforms(batch, num_draft, dtype=dtype, device=device, generator=generator)
    u_acc = u[:, :num_draft]
    sd_acc = overlap(p_r, q_r, rescale=validate)  # [B, K]: of the rows as solved
    if sd_only or num_draft == 0:
        a = b = torch.zeros((batch, num_draft), dtype=dtype, device=device)
        acc_prob, div_val = sd_acc, torch.zeros_like(sd_acc)
    else:
        if bool((p_x == 1).all()):  # deterministic drafter: closed form, no sort
            q_x64 = q_x.to(torch.float64)
            if validate:  # validated rows are solved as rescaled to sum to 1 (docs/theory.md, section 9)
                q_x64 = (q_x64 / q_r.sum(-1, dtype=torch.float64)).clamp(max=1.0)
            point = (one_hot_dual if dual else one_hot_primal)(q_x64, budget, div)
            a, b = point_to_dtype(point[0], point[1], dtype)  # towards pi = q: the budget holds
            acc_prob, div_val = (x.to(dtype) for x in point[2:])
        elif solve != "all":
            a, b, acc_prob, div_val = _solve_lazily(p_r, q_r, budget, dual, div, u_acc, p_x, q_x, solve == "needed",
                                                    validate)
        else:
            a, b, acc_prob, div_val = _solve(p_r, q_r, budget, dual, div, validate)

    # the contract (docs/theory.md, section 9): rounding never leaves [0, 1] or goes below 0
    acc_prob, div_val = acc_prob.clamp(0.0, 1.0), div_val.clamp(min=0.0)
    # unsolved entries (NaN) are positions after a rejection or ones SD accepts: a = 0 there
    a0, b0 = torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0)
    num_accepted, by_budget = accepted_prefix(u_acc, _accept_ratio(a0, q_x, p_x),
                                              _accept_ratio(torch.zeros_like(a), q_x, p_x))
    sampled = _final_token(p_r, q_r, a0, b0, bonus, ids, num_accepted, u[:, num_draft])
    return VerifyResult(
        tokens=emitted_tokens(tokens, num_accepted, sampled),
        num_accepted=num_accepted,
        acceptance_probability=acc_prob,
        sd_acceptance=sd_acc,
        divergence=div_val,
        accepted_by_budget=by_budget,
        a=a,
        b=b,
    )


def _verify_towards(tokens, p, q_all, mentored_probs, max_divergence, min_acceptance, top_k, divergence,
                    generator, validate):
    """``verify(mentored_probs=...)``: the budget arguments must stay unset."""
    if min_acceptance is not None or not (isinstance(max_divergence, (int, float)) and max_divergence == 0):
        raise ValueError(f"mentored_probs fixes the emitted distribution: give no budget (max_divergence="
                         f"{max_divergence!r}, min_acceptance={min_acceptance!r})")
    if top_k is not None:
        raise ValueError(f"mentored_probs cannot be combined with top_k (got top_k={top_k!r})")
    resolve(divergence)
    return verify_towards(tokens, p, q_all, mentored_probs, divergence=divergence, generator=generator,
                          validate=validate)


def _accept_ratio(a, q_x, p_x):  # [...] x3 -> [...]
    """``min(1, (1+a) q_x / p_x)``; a draft with ``p_x = 0`` is accepted iff ``q_x > 0``."""
    return accept_ratio((1 + a) * q_x, p_x)


def _solve(p, q, budget, dual, div, normalize=False):  # [N, W], [N, W], [N] -> 4 x [N]
    """Exact f-MD on every row: ``(a, b, P_acc, D_f(pi || q))`` through the breakpoints.

    The divergence comes from the breakpoints' prefix sums at the solution (no second pass
    over the vocabulary). Large rows take the expected linear-time path (:mod:`mdboost.md._buckets`),
    by :func:`mdboost.md._router.pick_rows`.
    """
    if _router.pick_rows(p) == _router.BUCKETED_BATCH:
        return _buckets.solve_batch(p, q, budget, div, dual, normalize)[:4]
    bp = Breakpoints.from_checked(p, q, normalize)  # verify checked the pair; dtypes already match
    if dual:
        point = bp.for_acceptance(budget, validate=False)
        return point.a, point.b, point.acceptance, bp.divergence_at(point.acceptance, div, validate=False)
    point, value = bp.for_divergence_with_value(budget, div, validate=False)
    return point.a, point.b, point.acceptance, value


def _solve_lazily(p, q, budget, dual, div, u_acc, p_x, q_x, needed_only, normalize=False):  # [B, K, W] ... -> 4 x [B, K]
    """:func:`_solve` only on the positions each row reaches (in a few batched calls).

    Row ``i`` reaches position ``j`` iff ``u_acc[i, :j]`` accepted drafts ``0..j-1`` (the tests
    :func:`verify` makes afterwards). With ``needed_only`` a reached position is solved only
    if SD rejects its draft (``u >= q_x / p_x``): for ``a >= 0`` the draft is accepted anyway.
    Unsolved entries are NaN.
    """
    batch, num_draft = u_acc.shape
    out = [torch.full((batch, num_draft), float("nan"), dtype=u_acc.dtype, device=u_acc.device) for _ in range(4)]
    zero = torch.zeros_like(u_acc)
    if _router.pick_rows(p) == _router.SORTED:
        # small rows: a call's fixed cost outweighs its rows, so solve every candidate position in
        # one call, then keep the reached ones (the same values: each row is solved on its own)
        todo = u_acc >= _accept_ratio(zero, q_x, p_x) if needed_only else torch.ones_like(u_acc, dtype=torch.bool)
        _solve_reached(out, todo, p, q, budget, dual, div, normalize, u_acc, q_x, p_x)
        return tuple(out)
    # large rows, round 1: every row solves, in one call, the positions it surely reaches: up to
    # its first draft SD rejects (drafts SD accepts are accepted for every a >= 0; "needed"
    # solves the rejected one only). Round 2: the rows whose draft the budget accepted solve all
    # their remaining candidates in one call, kept where reached (two calls instead of K).
    sd_reject = u_acc >= _accept_ratio(zero, q_x, p_x)  # [B, K]
    pos = torch.arange(num_draft, device=u_acc.device)
    first = sd_reject.long().argmax(-1)  # [B]
    has_reject = sd_reject.any(-1)
    j_stop = torch.where(has_reject, first, num_draft)  # [B] (K: none)
    todo = sd_reject & (pos == j_stop.unsqueeze(-1)) if needed_only else pos <= j_stop.unsqueeze(-1)
    _solve_into(out, todo, p, q, budget, dual, div, normalize)
    j = j_stop.clamp(max=num_draft - 1).unsqueeze(-1)  # [B, 1]
    a_j = torch.nan_to_num(out[0].gather(1, j), nan=0.0)
    accepted = (u_acc.gather(1, j) < _accept_ratio(a_j, q_x.gather(1, j), p_x.gather(1, j))).squeeze(-1)
    active = has_reject & accepted & (j_stop + 1 < num_draft)  # [B]
    ahead = (pos > j_stop.unsqueeze(-1)) & active.unsqueeze(-1)  # [B, K]
    _solve_reached(out, ahead & sd_reject if needed_only else ahead, p, q, budget, dual, div, normalize, u_acc, q_x, p_x)
    return tuple(out)


def _solve_reached(out, todo, p, q, budget, dual, div, normalize, u_acc, q_x, p_x):  # 4 x [B, K], todo [B, K]
    """Solve the candidate positions ``todo`` in one call and keep those reached: every earlier
    draft accepted, at the clamps of ``out`` (earlier solves) and of this call (unsolved: ``a = 0``)."""
    if not bool(todo.any()):
        return
    solved = [torch.full_like(out[0], float("nan")) for _ in range(4)]
    _solve_into(solved, todo, p, q, budget, dual, div, normalize)
    a = torch.nan_to_num(torch.where(todo, solved[0], out[0]), nan=0.0)
    accepted = u_acc < _accept_ratio(a, q_x, p_x)  # [B, K]
    reached = torch.cat([torch.ones_like(accepted[:, :1]), accepted[:, :-1].cumprod(-1).bool()], dim=1)
    keep = todo & reached
    for dst, src in zip(out, solved):
        torch.where(keep, src, dst, out=dst)


def _solve_into(out, todo, p, q, budget, dual, div, normalize):  # 4 x [B, K] filled where todo [B, K]
    """Solve the positions ``todo`` in one call, on their rows gathered by index."""
    idx = todo.reshape(-1).nonzero().squeeze(-1)  # [n] flat positions b * K + k, row-major (the mask's order)
    if idx.numel():
        got = _solve(_take_rows(p, idx), _take_rows(q, idx), _take_rows(budget, idx), dual, div, normalize)
        for dst, src in zip(out, got):
            dst.view(-1).index_copy_(0, idx, src.to(dst.dtype))


def _take_rows(x, idx):  # [B, K, ...], [n] flat positions b * K + k -> [n, ...]
    """The positions ``idx`` of ``x``, copying only those rows: ``q[:, :K]`` is a view of the
    target's ``[B, K + 1, V]`` rows, whose ``reshape(-1, V)`` would copy every row first."""
    if x.is_contiguous():
        return x.view((-1,) + x.shape[2:]).index_select(0, idx)
    num = x.shape[1]
    return x[idx // num, idx % num]


def _final_token(p_r, q_r, a, b, bonus, ids, num_accepted, u):  # -> [B] token ids
    """The one categorical draw per row: residual at the first rejection, else the bonus."""
    batch, num_draft = a.shape
    all_acc = num_accepted == num_draft  # [B]
    if num_draft == 0:
        weights = bonus
        rpos = torch.zeros_like(num_accepted)
    else:
        rpos = num_accepted.clamp(max=num_draft - 1)  # [B]
        rows = torch.arange(batch, device=a.device)
        p_rej, q_rej = p_r[rows, rpos], q_r[rows, rpos]  # [B, W]: the first rejection's position only
        a_rej, b_rej = a[rows, rpos], b[rows, rpos]  # [B]
        resid = ((1 - b_rej).unsqueeze(-1) * q_rej - p_rej).clamp_(min=0)
        empty = (resid.sum(-1) <= 0) & ~all_acc  # [B]: p already equals pi there (the fallback)
        if bool(empty.any()):
            fallback = mentored_distribution(p_rej[empty], q_rej[empty], a_rej[empty], b_rej[empty], validate=False)
            resid[empty] = fallback.to(resid.dtype)
        weights = torch.where(all_acc.unsqueeze(-1), bonus, resid)
    idx = inverse_cdf(weights, u)  # [B]
    if ids is None:
        return idx
    row_pos = torch.where(all_acc, torch.full_like(rpos, num_draft), rpos)
    table = torch.gather(ids, 1, row_pos.view(batch, 1, 1).expand(batch, 1, ids.shape[-1])).squeeze(1)
    return torch.gather(table, -1, idx.unsqueeze(-1)).squeeze(-1)
