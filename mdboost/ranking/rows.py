"""The ranking's view of an opened pool cache: members' rows, the pairs and their speed profiles.

The cache folders themselves (keys, building, opening) belong to :mod:`mdboost.cache`
(:func:`~mdboost.cache.pool_cache.open_or_build_cache`); this module only reads the opened
:class:`~mdboost.cache.pool_cache.PoolCache`: :func:`member_rows` turns one member's cached
logits into :class:`~mdboost.ranking.support.MemberRows` and a boosting hypothesis,
:func:`pair_rows` / :func:`acceptance_rows` assemble one ordered pair's
:class:`~mdboost.ranking.pair.PairRows`, :func:`speed_profile` reads the target's measured
speed profile.
"""

from __future__ import annotations

import torch

from mdboost.cache.pool_cache import PoolCache
from mdboost.ranking.boosting import CachedLogitsHypothesis, ProposalHypothesis
from mdboost.ranking.layout import sequence_layout
from mdboost.ranking.options import PAIR_MODES  # torch-free (a config checks it before torch loads)
from mdboost.ranking.pair import PairRows, PairSide
from mdboost.ranking.speed import SpeedProfile
from mdboost.md.drafting import draft_confidence
from mdboost.ranking.support import MemberRows, rows_from_proposals


def select_pairs(pc: PoolCache, mode: str = "target") -> list[tuple[str, str]]:
    """Ordered (drafter, target) pairs: every drafter against the target, or all ordered pairs.

    With ``mode="all"`` any non-``ngram`` member can be the target; vocabularies are checked
    through the members' fingerprints in the cache manifests.
    """
    if mode not in PAIR_MODES:
        raise ValueError(f"mode must be 'target' or 'all', got {mode!r}")
    targets = [pc.target] if mode == "target" else [n for n in pc.names if pc.kind(n) != "ngram"]
    fp = {n: pc.caches[n].manifest["tokenizer_fingerprint"] for n in pc.names}
    return [(d, t) for t in targets for d in pc.names if d != t and fp[d] == fp[t]]


def speed_profile(pc: PoolCache, drafter: str, target: str, batch_size: int = 1) -> SpeedProfile:
    """The speed model's ``v`` table and MD overhead for the pair at ``batch_size`` rows per step
    (defaults when ``target`` has no measured profile: ``v = 1``, ``s = 0``). One-hot (``ngram``)
    drafts use their own overhead."""
    info = pc.speed_profile_info(target, batch_size)
    if info is None:
        return SpeedProfile()
    kind = "onehot" if pc.kind(drafter) == "ngram" else "dense"
    overhead = 0.0 if info["md_overhead"] is None else float(info["md_overhead"][kind])  # None: greedy, no MD
    samples = info.get("verify_samples")
    return SpeedProfile(tuple(info["verify_cost"]), overhead, float(info["prefill_per_token"]),
                        None if samples is None else tuple(tuple(float(x) for x in row) for row in samples))


def member_rows(cache, name: str, temperature: float) -> tuple[MemberRows, object]:
    """``(MemberRows, boosting hypothesis)`` of one member over all cache rows.

    ``temperature`` 0 is greedy decoding: each row is one-hot on the member's argmax (the first
    of its stored top-k, computed from the float32 logits), so ``log p`` is 0 there and
    ``-inf`` elsewhere, and ``true_logp`` is 0 where the text token is the argmax.
    """
    true = cache.true_tokens()
    vocab = cache.vocab_size
    if cache.kind(name) == "ngram":
        props = cache.ngram_proposals(name)[:, 0]
        return rows_from_proposals(props, true), ProposalHypothesis(props.numpy(), vocab, name=name)
    ids, logits = cache.topk(name)
    true_logit = cache.true_logit(name).double()
    full = cache.full_logits(name).double() if cache.manifest["keep_full"] else None
    valid = torch.ones(len(true), dtype=torch.bool)
    if temperature == 0:
        logp = torch.full(ids.shape, -torch.inf, dtype=torch.float64)
        logp[:, 0] = 0.0
        true_logp = torch.where(ids[:, 0] == true, 0.0, -torch.inf).double()
        full_logp = None if full is None else torch.log(torch.nn.functional.one_hot(ids[:, 0], full.shape[-1]).double())
        rows = MemberRows(ids, logp, torch.zeros(len(true), dtype=torch.float64), true_logp, valid, full_logp)
    else:
        lse = cache.logsumexp(name, temperature=temperature).double()
        logp = logits.double() / temperature - lse[:, None]
        tail = (1 - logp.exp().sum(-1)).clamp_min(0.0)
        full_logp = torch.log_softmax(full / temperature, dim=-1) if full is not None else None
        rows = MemberRows(ids, logp, tail, true_logit / temperature - lse, valid, full_logp)
    rows.confidence = draft_confidence(logits.double())  # the top-k is enough (k >= 10: the ranking checks)
    hyp = CachedLogitsHypothesis(true.numpy(), true_logit.numpy(), cache.logit_sum(name).double().numpy(), vocab,
                                 topk_ids=ids.numpy(), topk_logits=logits.double().numpy(),
                                 full_logits=None if full is None else full.numpy(), name=name)
    return rows, hyp


class MemberLoader:
    """Memoized :func:`member_rows` over a :class:`~mdboost.cache.pool_cache.PoolCache` (each
    member is read once)."""

    def __init__(self, pc: PoolCache, temperature: float):
        self.pc, self.temperature, self._memo = pc, temperature, {}

    def __call__(self, name: str) -> tuple[MemberRows, object]:
        if name not in self._memo:
            self._memo[name] = member_rows(self.pc.caches[name], name, self.temperature)
        return self._memo[name]


def pair_side_costs(costs: PoolCache, drafter: str, target: str, batch_size: int = 1) -> tuple:
    """The drafter side's ``(cost_ratio, cost_samples, prefill_per_token)`` at ``batch_size``:
    ``c_drafter / c_target``, both measured against the pool target and read from ``costs`` (the
    pool's speed file), with its repeated measurements and its prefill cost on the same scale
    (the speedup intervals carry their spread)."""
    scale = costs.cost_ratio(target, batch_size)
    samples = costs.cost_samples(drafter, batch_size)
    samples = None if samples is None else tuple(x / scale for x in samples)
    return costs.cost_ratio(drafter, batch_size) / scale, samples, costs.prefill_per_token(drafter, batch_size) / scale


def _sides(loader: MemberLoader, costs: PoolCache, drafter: str, target: str,
           batch_size: int = 1) -> tuple[PairSide, PairSide]:
    """The pair's two sides, the drafter's costs at ``batch_size`` (:func:`pair_side_costs`)."""
    d_rows, d_hyp = loader(drafter)
    t_rows, t_hyp = loader(target)
    return PairSide(drafter, d_rows, d_hyp, *pair_side_costs(costs, drafter, target, batch_size)), \
        PairSide(target, t_rows, t_hyp, 1.0)


def pair_rows(loader: MemberLoader, drafter: str, target: str, batch_size: int = 1) -> PairRows:
    """One ordered pair over all rows of ``loader``'s cache (``row_ids``: the cache rows), with
    their sequence layout (the draft-start process then predicts on this text too), its costs at
    ``batch_size``."""
    draft, tgt = _sides(loader, loader.pc, drafter, target, batch_size)
    labels = loader.pc.true_tokens().numpy()
    return PairRows(draft, tgt, labels, torch.arange(len(labels)).numpy(),
                    layout=sequence_layout(loader.pc.caches[drafter], drafter))


def acceptance_rows(loader: MemberLoader, pc: PoolCache, drafter: str, target: str, batch_size: int = 1) -> PairRows:
    """One ordered pair on ``loader``'s (acceptance) cache, with its sequence layout.

    ``loader`` reads the target-sampled caches (``pc.acceptance``); cost ratios come from ``pc``,
    the main caches, where they were measured. The layout groups the rows by sequence for the
    engine's draft-start process (:func:`mdboost.ranking.layout.sequence_layout`).
    """
    draft, tgt = _sides(loader, pc, drafter, target, batch_size)
    labels = loader.pc.true_tokens().numpy()
    return PairRows(draft, tgt, labels, layout=sequence_layout(loader.pc.caches[drafter], drafter))
