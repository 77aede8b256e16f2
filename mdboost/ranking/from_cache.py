"""The ranking's view of the logit cache: one cache folder per pool member, read as MemberRows.

Each member is cached in its own folder ``<cache.dir>/<fingerprint>`` (see
:func:`member_cache_dir`): the fingerprint covers the data section, the target spec, the
member spec, the cache settings that change stored values (``k``, ``dtype``, ``full_logits``,
``source``, ``max_new_tokens``, ``shard_size``) and the temperature. So an unchanged config
opens every folder without loading a model; adding a drafter builds only that drafter's folder;
changing ``k`` or the data rebuilds all; budgets, gamma, boosting and the ranking rule never
touch the cache. Cost ratios are measured once, when a drafter's folder is built, and read back
from its manifest afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from mdboost.config import RankConfig, fingerprint
from mdboost.ranking.boosting import CachedLogitsHypothesis, ProposalHypothesis
from mdboost.ranking.rank import Member
from mdboost.ranking.support import MemberRows, rows_from_proposals

_VALUE_KEYS = ("k", "dtype", "full_logits", "source", "max_new_tokens", "shard_size")


def member_cache_dir(cfg: RankConfig, member: str) -> Path:
    """The cache folder of one pool member under ``cfg.cache.dir``."""
    settings = {k: getattr(cfg.cache, k) for k in _VALUE_KEYS}
    fp = fingerprint(cfg.data, settings, cfg.pool.target, member, cfg.md.temperature)
    slug = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in member)
    return Path(cfg.cache.dir) / f"{slug}-{fp}"


def cache_fingerprint(cfg: RankConfig) -> str:
    """One fingerprint over all member folders of the config (for reports)."""
    return fingerprint(*[str(member_cache_dir(cfg, m)) for m in [cfg.pool.target, *cfg.pool.drafters]])


@dataclass
class PoolCache:
    """Opened member caches sharing the same rows (same records, tokenizer and positions)."""

    caches: dict
    target: str

    @property
    def vocab_size(self) -> int:
        return self.caches[self.target].vocab_size

    @property
    def names(self) -> list[str]:
        return list(self.caches)

    def kind(self, name: str) -> str:
        return self.caches[name].kind(name)

    def cost_ratio(self, name: str) -> float:
        cost = self.caches[name].cost_ratio(name)
        if cost is None:
            raise ValueError(f"member {name!r} has no measured cost ratio in its cache manifest")
        return float(cost)

    def true_tokens(self) -> torch.Tensor:  # [R]
        return self.caches[self.target].true_tokens()


def _complete(path: Path) -> bool:
    import json

    manifest = path / "manifest.json"
    return manifest.is_file() and bool(json.loads(manifest.read_text()).get("complete"))


def _build_missing(cfg: RankConfig, missing: list[str]) -> None:
    from mdboost.cache import build_cache
    from mdboost.data import load_texts
    from mdboost.models.cost import measure_cost_ratio
    from mdboost.models.pool import build_pool

    drafters = [m for m in missing if m != cfg.pool.target]
    pool = build_pool(cfg.pool.target, drafters, device=cfg.pool.device, home=cfg.pool.home)
    for name in drafters:
        pool[name].cost_ratio, pool[name].cost_method = measure_cost_ratio(
            pool[name], pool.target, context_len=cfg.cache.cost_context, repeats=cfg.cache.cost_repeats)
    d = cfg.data
    records = load_texts(d.source, d.split, d.limit, prompt_field=d.prompt_field, reference_field=d.reference_field,
                         heldout_fraction=d.heldout_fraction, seed=d.seed)
    for name in missing:
        build_cache(pool, records, member_cache_dir(cfg, name), members=[name], k=cfg.cache.k, dtype=cfg.cache.dtype,
                    source=cfg.cache.source, keep_full=cfg.cache.full_logits, temperatures=(cfg.md.temperature,),
                    shard_size=cfg.cache.shard_size, backend=cfg.cache.backend, n_jobs=cfg.cache.n_jobs,
                    chat_template=d.chat_template, max_tokens=d.max_tokens, max_new_tokens=cfg.cache.max_new_tokens,
                    seed=d.seed, progress=cfg.progress, overwrite=True)


def open_or_build_cache(cfg: RankConfig) -> tuple[PoolCache, dict]:
    """Open every member's cache, building the missing ones first; returns (cache, info)."""
    from mdboost.cache import LogitCache

    names = [cfg.pool.target, *cfg.pool.drafters]
    missing = [m for m in names if not _complete(member_cache_dir(cfg, m))]
    if missing:
        _build_missing(cfg, missing)
    caches = {m: LogitCache.open(member_cache_dir(cfg, m)) for m in names}
    ref = caches[cfg.pool.target]
    for name, cache in caches.items():
        same = (cache.manifest["tokenizer_fingerprint"] == ref.manifest["tokenizer_fingerprint"]
                and cache.num_rows == ref.num_rows and torch.equal(cache.true_tokens(), ref.true_tokens()))
        if not same:
            raise ValueError(f"cache of member {name!r} does not cover the same rows/tokenizer as the target's")
    info = {"dir": str(Path(cfg.cache.dir)), "reused": not missing, "built": missing}
    return PoolCache(caches, cfg.pool.target), info


def select_pairs(pc: PoolCache, mode: str = "target") -> list[tuple[str, str]]:
    """Ordered (drafter, target) pairs: every drafter against the target, or all ordered pairs.

    With ``mode="all"`` any non-``ngram`` member can be the target; vocabularies are checked
    through the members' fingerprints in the cache manifests.
    """
    if mode not in ("target", "all"):
        raise ValueError(f"mode must be 'target' or 'all', got {mode!r}")
    targets = [pc.target] if mode == "target" else [n for n in pc.names if pc.kind(n) != "ngram"]
    fp = {n: pc.caches[n].manifest["tokenizer_fingerprint"] for n in pc.names}
    return [(d, t) for t in targets for d in pc.names if d != t and fp[d] == fp[t]]


def member_rows(cache, name: str, temperature: float) -> tuple[MemberRows, object]:
    """``(MemberRows, boosting hypothesis)`` of one member over all cache rows."""
    true = cache.true_tokens()
    vocab = cache.vocab_size
    if cache.kind(name) == "ngram":
        props = cache.ngram_proposals(name)[:, 0]
        return rows_from_proposals(props, true), ProposalHypothesis(props.numpy(), vocab, name=name)
    ids, logits = cache.topk(name)
    lse = cache.logsumexp(name, temperature=temperature).double()
    logp = logits.double() / temperature - lse[:, None]
    tail = (1 - logp.exp().sum(-1)).clamp_min(0.0)
    true_logit = cache.true_logit(name).double()
    full = cache.full_logits(name).double() if cache.manifest["keep_full"] else None
    full_logp = torch.log_softmax(full / temperature, dim=-1) if full is not None else None
    rows = MemberRows(ids, logp, tail, true_logit / temperature - lse, torch.ones(len(true), dtype=torch.bool), full_logp)
    hyp = CachedLogitsHypothesis(true.numpy(), true_logit.numpy(), cache.logit_sum(name).double().numpy(), vocab,
                                 topk_ids=ids.numpy(), topk_logits=logits.double().numpy(),
                                 full_logits=None if full is None else full.numpy(), name=name)
    return rows, hyp


class MemberLoader:
    """Memoized :func:`member_rows` over a :class:`PoolCache` (each member is read once)."""

    def __init__(self, pc: PoolCache, temperature: float):
        self.pc, self.temperature, self._memo = pc, temperature, {}

    def __call__(self, name: str) -> tuple[MemberRows, object]:
        if name not in self._memo:
            self._memo[name] = member_rows(self.pc.caches[name], name, self.temperature)
        return self._memo[name]


def pair_members(loader: MemberLoader, drafter: str, target: str):
    """``(draft Member, target Member, labels [R], row_ids [R])`` for one ordered pair.

    The pair's cost ratio is ``c_drafter / c_target`` (both measured against the pool target).
    """
    pc = loader.pc
    d_rows, d_hyp = loader(drafter)
    t_rows, t_hyp = loader(target)
    cost = pc.cost_ratio(drafter) / pc.cost_ratio(target)
    labels = pc.true_tokens().numpy()
    return (Member(drafter, d_rows, d_hyp, cost), Member(target, t_rows, t_hyp, 1.0), labels,
            torch.arange(len(labels)).numpy())
