"""Drafter and target distributions on a common support, rebuilt from a top-k logit cache.

The cache keeps, per position and model, the top-k token ids and log-probabilities plus the
full-vocabulary normalizer, so the kept probabilities are exact and the tail mass
``T = 1 - sum(top-k probs)`` is known, but not how it spreads. The ranking uses the
**uniform-tail approximation**: each model's tail mass is spread evenly over the ``V - k``
tokens outside its top-k (per-token level ``t = T / (V - k)``). Then

- on the union ``U`` of the two top-k sets every coordinate has a value (kept, or the other
  model's tail level);
- the ``V - |U|`` tokens outside ``U`` all have the same pair of values ``(t_p, t_q)``, so they
  form ONE coordinate with multiplicity ``V - |U|``. Coordinates with equal ratios merge exactly
  in ``1 - TV``, in every ``D_f`` and in the clamp solution, so the compressed problem is exact
  for the approximated distributions.

Error: the approximated ``p`` differs from the true one only in how ``T_p`` is spread, so
``TV(p~, p) <= T_p`` (same for ``q``), and any acceptance computed on it is within
``T_p + T_q`` of the true one (reported as ``tail_mass``). With full logits in the cache, or
a deterministic (one-hot) drafter against a full target, nothing is approximated.

A support of ``S = 2k + 1`` slots is returned with per-token values and multiplicities
``count`` (1 on ``U``, ``V - |U|`` on the bucket, 0 on padding slots that held a duplicate id);
the probability mass of a slot is ``value * count``. :func:`align_topk` is the one
implementation of this union (the ranking's :func:`align` and :func:`pair_probs`, a pair of an
opened :class:`~mdboost.cache.reader.LogitCache`'s members, both build on it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from mdboost.md.drafting import draft_confidence


@dataclass
class MemberRows:
    """One pool member's cached view of ``N`` positions at a fixed temperature.

    Attributes
    ----------
    ids : LongTensor [N, k]
        Top-k token ids (for a one-hot drafter: the proposal, ``k = 1``, ``-1`` = none).
    logp : tensor [N, k]
        Their log-probabilities (``0`` for a one-hot proposal).
    tail : tensor [N]
        Probability mass outside the kept ids (``0`` for a one-hot drafter).
    true_logp : tensor [N]
        Log-probability of the true next token (``-inf`` for a one-hot miss).
    valid : bool tensor [N]
        False where the member has no distribution (an ngram drafter that proposes nothing).
    full_logp : tensor [N, V] or None
        Full log-probabilities when the cache kept full logits.
    one_hot : bool
        Deterministic drafter (``ngram``).
    confidence : tensor [N] or None
        llama.cpp's confidence in the greedy draft (:func:`mdboost.md.drafting.draft_confidence`
        of the raw top-k logits, whatever the temperature), what a draft probability floor
        tests; None for a one-hot drafter (its proposal is certain).
    """

    ids: torch.Tensor
    logp: torch.Tensor
    tail: torch.Tensor
    true_logp: torch.Tensor
    valid: torch.Tensor
    full_logp: torch.Tensor | None = None
    one_hot: bool = False
    confidence: torch.Tensor | None = None

    @property
    def k(self) -> int:
        return self.ids.shape[-1]


@dataclass
class Aligned:
    """Per-token values of ``p`` and ``q`` on a shared support with multiplicities.

    ``p``, ``q``, ``count`` are ``[N, S]``; masses are ``p * count``, renormalized to sum to 1
    (absorbing the rounding of fp16-stored logits). ``log_p``/``log_q`` hold the per-token
    log-values as cached, before that renormalization (``-inf`` where zero), consistent with
    the cached true-token log-probabilities; the boosted distribution uses them.
    """

    p: torch.Tensor
    q: torch.Tensor
    count: torch.Tensor
    log_p: torch.Tensor
    log_q: torch.Tensor
    bucket: bool = False  # the last slot is the tail bucket (top-k path)
    ids: torch.Tensor | None = None  # [N, S] token id of each slot (top-k path; -1 on padding and the bucket)
    true_log_p: torch.Tensor | None = None  # [N] per-token log-value of the true token on this support
    true_log_q: torch.Tensor | None = None  # (kept value, else the tail level: consistent with the slots)

    @property
    def kept(self) -> torch.Tensor:  # [N, S] bool
        """Slots holding one real token of the top-k union (the bucket and padding excluded)."""
        mask = self.count > 0
        if self.bucket:
            mask = mask.clone()
            mask[:, -1] = False
        return mask

    @property
    def p_mass(self) -> torch.Tensor:
        return self.p * self.count

    @property
    def q_mass(self) -> torch.Tensor:
        return self.q * self.count

    @property
    def p_probs(self) -> torch.Tensor:  # [N, S]
        """``p_mass`` renormalized to sum to 1 per row."""
        mass = self.p_mass
        return mass / mass.sum(-1, keepdim=True)

    @property
    def q_probs(self) -> torch.Tensor:  # [N, S]
        """``q_mass`` renormalized to sum to 1 per row."""
        mass = self.q_mass
        return mass / mass.sum(-1, keepdim=True)


def _tail_log_level(tail: torch.Tensor, others: int) -> torch.Tensor:  # [N]
    level = tail.clamp_min(0) / max(others, 1)
    return torch.where(level > 0, level.log(), torch.full_like(level, float("-inf")))


def _full(draft: MemberRows, target: MemberRows, vocab: int) -> Aligned:
    log_q = target.full_logp.double()
    if draft.one_hot:
        ids = draft.ids[:, :1].clamp_min(0)
        hit = torch.where(draft.ids[:, :1] >= 0, 0.0, float("-inf")).to(log_q.dtype)
        log_p = torch.full_like(log_q, float("-inf")).scatter_(1, ids, hit)
    else:
        log_p = draft.full_logp.double()
    count = torch.ones_like(log_q)
    return Aligned(log_p.exp(), log_q.exp(), count, log_p, log_q)


def align(draft: MemberRows, target: MemberRows, vocab_size: int, true_ids: torch.Tensor | None = None) -> Aligned:
    """Put drafter ``p`` and target ``q`` on the union of their kept ids plus one tail bucket.

    Parameters
    ----------
    draft, target : MemberRows
        Same ``N`` positions. Full logits are used when both have them (or the drafter is
        one-hot and the target has them).
    vocab_size : int
        ``V``, the shared vocabulary size.
    true_ids : LongTensor [N], optional
        True next tokens: fills ``true_log_p``/``true_log_q``, the true token's values under
        the same approximation as the slots (its kept value, else the model's tail level), so
        that a distribution built on the support and its value at the true token agree.

    Returns
    -------
    Aligned
        ``[N, S]`` tensors in float64 (``S = V`` on the full path, else ``k_q + k_p + 1``).
    """
    if draft.ids.shape[0] != target.ids.shape[0]:
        raise ValueError(f"draft and target rows differ: {draft.ids.shape[0]} vs {target.ids.shape[0]}")
    if target.full_logp is not None and (draft.one_hot or draft.full_logp is not None):
        return _full(draft, target, vocab_size)
    aligned = align_topk(draft.ids, draft.logp, draft.tail, target.ids, target.logp, target.tail, vocab_size)
    if true_ids is None:
        return aligned
    tq = _tail_log_level(target.tail.double(), vocab_size - target.k)  # [N]
    tp = _tail_log_level(draft.tail.double(), vocab_size - draft.k)  # [N]
    t = torch.as_tensor(true_ids, dtype=torch.long)[:, None]
    return replace(aligned, true_log_q=torch.where((target.ids == t).any(-1), target.true_logp.double(), tq),
                   true_log_p=torch.where((draft.ids == t).any(-1), draft.true_logp.double(), tp))


def align_topk(draft_ids, draft_logp, draft_tail, target_ids, target_logp, target_tail, vocab_size: int) -> Aligned:
    """Two top-k distributions on the union of their kept ids plus one tail bucket.

    Parameters
    ----------
    draft_ids, target_ids : LongTensor [N, k_p], [N, k_q]
        Kept token ids of ``p`` and ``q`` (``-1``: no id, e.g. a one-hot drafter without a
        proposal; such a slot holds nothing).
    draft_logp, target_logp : tensor [N, k_p], [N, k_q]
        Their log-probabilities (``-inf`` allowed).
    draft_tail, target_tail : tensor [N]
        Mass outside the kept ids, spread uniformly over the other ``V - k`` tokens (0: none).
    vocab_size : int
        ``V``.

    Returns
    -------
    Aligned
        ``[N, S]`` float64 tensors, ``S = k_q + k_p + 1``: the target's ids, the drafter's ids
        not among them (a duplicate becomes an empty slot), the bucket; ``ids`` names the slots.
    """
    if draft_ids.shape[0] != target_ids.shape[0]:
        raise ValueError(f"draft and target rows differ: {draft_ids.shape[0]} vs {target_ids.shape[0]}")
    kq, kp = target_ids.shape[-1], draft_ids.shape[-1]
    q_lp, p_lp = target_logp.double(), draft_logp.double()  # [N, kq], [N, kp]
    tq = _tail_log_level(target_tail.double(), vocab_size - kq)  # [N]
    tp = _tail_log_level(draft_tail.double(), vocab_size - kp)  # [N]
    match = target_ids[:, :, None] == draft_ids[:, None, :]  # [N, kq, kp]
    in_p = match.any(-1)  # [N, kq]: target id kept by the drafter too
    dup = match.any(1) | (draft_ids < 0)  # [N, kp]: already among the target's, or no id
    p_on_q = torch.where(match, p_lp[:, None, :], torch.tensor(float("-inf"), dtype=p_lp.dtype)).amax(-1)
    p_on_q = torch.where(in_p, p_on_q, tp[:, None].expand_as(p_on_q))
    neg_inf = torch.full_like(p_lp, float("-inf"))
    q_on_p = torch.where(dup, neg_inf, tq[:, None].expand_as(p_lp))
    p_only = torch.where(dup, neg_inf, p_lp)
    union = kq + (~dup).sum(-1)  # [N]
    bucket = (vocab_size - union).to(q_lp.dtype)  # [N]
    log_q = torch.cat([q_lp, q_on_p, tq[:, None]], dim=1)
    log_p = torch.cat([p_on_q, p_only, tp[:, None]], dim=1)
    count = torch.cat([torch.ones_like(q_lp), (~dup).to(q_lp.dtype), bucket[:, None]], dim=1)
    log_q = torch.where(count > 0, log_q, torch.full_like(log_q, float("-inf")))
    log_p = torch.where(count > 0, log_p, torch.full_like(log_p, float("-inf")))
    p, q = _renormalize(log_p, count).exp(), _renormalize(log_q, count).exp()
    no_id = torch.full_like(bucket, -1, dtype=torch.long)[:, None]  # the bucket slot
    ids = torch.cat([target_ids.long(), draft_ids.long().masked_fill(dup, -1), no_id], dim=1)  # [N, S]
    return Aligned(p, q, count, log_p, log_q, bucket=True, ids=ids)


def _renormalize(log_v: torch.Tensor, count: torch.Tensor) -> torch.Tensor:  # [N, S]
    """Make ``sum(exp(log_v) * count) = 1`` per row (absorbs rounding of fp16-stored logits,
    which can make the kept probabilities sum slightly above 1); all-zero rows stay zero."""
    total = torch.logsumexp(log_v + count.log(), dim=-1, keepdim=True)
    return torch.where(torch.isfinite(total), log_v - total, log_v)


def rows_from_logits(logits: torch.Tensor, true_ids: torch.Tensor, k: int, temperature: float = 1.0,
                     keep_full: bool = False) -> MemberRows:
    """A member's :class:`MemberRows` straight from logits ``[N, V]`` (reference / tests).

    Mirrors what the cache keeps: top-``k`` ids and log-probabilities at ``temperature``, the
    tail mass, the true token's log-probability, and optionally the full log-probabilities.
    """
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)  # [N, V]
    top = torch.topk(logp, k, dim=-1)
    tail = (1 - top.values.exp().sum(-1)).clamp_min(0)
    true_logp = logp.gather(-1, true_ids.long()[:, None]).squeeze(-1)
    valid = torch.ones(logits.shape[0], dtype=torch.bool)
    return MemberRows(top.indices, top.values, tail, true_logp, valid, logp if keep_full else None,
                      confidence=draft_confidence(logits.double()))


def rows_from_proposals(proposals: torch.Tensor, true_ids: torch.Tensor) -> MemberRows:
    """:class:`MemberRows` of a one-hot drafter from its proposals ``[N]`` (``-1`` = none)."""
    proposals = proposals.long()
    n = proposals.shape[0]
    hit = proposals == true_ids.long()
    true_logp = torch.where(hit, torch.zeros(n, dtype=torch.float64), torch.full((n,), float("-inf"), dtype=torch.float64))
    return MemberRows(proposals[:, None], torch.zeros(n, 1, dtype=torch.float64), torch.zeros(n, dtype=torch.float64),
                      true_logp, proposals >= 0, None, one_hot=True)


@dataclass
class PairProbs:
    """Sparse (drafter, target) distributions on the union of their cached supports.

    ``support`` [R, U] token ids (``-1`` = padding, probability 0; the target's kept ids first,
    then the drafter's others); ``draft_probs`` and ``target_probs`` [R, U + 1] (float32), the
    last column being the mass of every other token; ``valid`` [R] is False where the drafter
    has no draft (an ``ngram`` without a match). Built by :func:`align_topk`.
    """

    support: torch.Tensor
    draft_probs: torch.Tensor
    target_probs: torch.Tensor
    valid: torch.Tensor

    def acceptance(self) -> torch.Tensor:  # [R]
        """Standard SD acceptance ``1 - TV(p, q) = sum_i min(p_i, q_i)`` per row."""
        return torch.minimum(self.draft_probs, self.target_probs).sum(-1)


def pair_probs(cache, drafter: str, target: str, rows=None, temperature: float = 1.0,
               tail: str = "drop") -> PairProbs:
    """Sparse union-of-supports distributions of a (drafter, target) pair of a logit cache.

    ``cache``: an opened :class:`~mdboost.cache.reader.LogitCache` (its members' kept entries,
    :meth:`~mdboost.cache.reader.LogitCache.sparse`). ``tail="drop"``: each member's top-k
    renormalized, nothing outside it; ``"uniform"``: the exact kept probabilities and the tail
    mass spread over the other tokens. The union is :func:`align_topk`, its masses in float32.
    """
    if tail not in ("drop", "uniform"):
        raise ValueError(f"tail must be 'drop' or 'uniform' for pair_probs, got {tail!r}")
    (d_ids, d_logp, d_tail, d_valid), (t_ids, t_logp, t_tail, t_valid) = (
        cache.sparse(member, rows, temperature, tail) for member in (drafter, target))
    aligned = align_topk(d_ids, d_logp, d_tail, t_ids, t_logp, t_tail, cache.vocab_size)
    return PairProbs(aligned.ids[:, :-1], aligned.p_mass.float(), aligned.q_mass.float(), d_valid & t_valid)
