"""The ranking's view of the logit cache: one cache folder per pool member, read as MemberRows.

Each member is cached in its own folder ``<cache.dir>/<fingerprint>`` (see
:func:`member_cache_dir`): the fingerprint covers the data section, the target spec, the
member spec, the cache settings that change stored values (``k``, ``dtype``, ``full_logits``,
``source``, ``max_new_tokens``, ``shard_size``) and the temperature. So an unchanged config
opens every folder without loading a model; adding a drafter builds only that drafter's folder;
changing ``k`` or the data rebuilds all; budgets, gamma, boosting and the ranking rule never
touch the cache. Cost ratios are measured once, when a drafter's folder is built, and read back
from its manifest afterwards.

With ``cache.acceptance_source: sampled`` every member also gets an *acceptance* folder
(:func:`member_cache_dir` with ``acceptance=True``): the same prompts with continuations sampled
from the target (``source="sampled"``, ``cache.acceptance_max_new_tokens`` tokens, seeded by
``data.seed``, at ``md.temperature``), keyed the same way. The ranking reads acceptance from it
and quality/boosting from the main folders; cost ratios always come from the main folders.
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


def _settings(cfg: RankConfig, acceptance: bool) -> dict:
    settings = {k: getattr(cfg.cache, k) for k in _VALUE_KEYS}
    if acceptance:
        settings.update(source="sampled", max_new_tokens=cfg.cache.acceptance_max_new_tokens)
    return settings


def member_cache_dir(cfg: RankConfig, member: str, *, acceptance: bool = False) -> Path:
    """The cache folder of one pool member under ``cfg.cache.dir``.

    ``acceptance=True``: the member's folder of target-sampled continuations (used with
    ``cache.acceptance_source: sampled``); it coincides with the main folder when the main cache
    is itself sampled with the same number of new tokens.
    """
    settings = _settings(cfg, acceptance)
    fp = fingerprint(cfg.data, settings, cfg.pool.target, member, cfg.md.temperature)
    slug = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in member)
    return Path(cfg.cache.dir) / f"{slug}-{fp}"


def cache_fingerprint(cfg: RankConfig) -> str:
    """One fingerprint over all member folders of the config (for reports)."""
    names = [cfg.pool.target, *cfg.pool.drafters]
    dirs = [str(member_cache_dir(cfg, m)) for m in names]
    if cfg.cache.acceptance_source == "sampled":
        dirs += [str(member_cache_dir(cfg, m, acceptance=True)) for m in names]
    return fingerprint(*dirs)


@dataclass
class PoolCache:
    """Opened member caches sharing the same rows (same records, tokenizer and positions)."""

    caches: dict
    target: str
    acceptance: PoolCache | None = None  # target-sampled caches (``acceptance_source: sampled``)

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


def _build_missing(cfg: RankConfig, missing: list[str], missing_acceptance: list[str]) -> None:
    """Build the missing main folders (measuring drafter cost ratios) and acceptance folders."""
    from mdboost.cache import build_cache
    from mdboost.data import load_texts
    from mdboost.models.cost import measure_cost_ratio
    from mdboost.models.pool import build_pool

    drafters = [m for m in dict.fromkeys(missing + missing_acceptance) if m != cfg.pool.target]
    pool = build_pool(cfg.pool.target, drafters, device=cfg.pool.device, home=cfg.pool.home)
    for name in (m for m in missing if m != cfg.pool.target):
        pool[name].cost_ratio, pool[name].cost_method = measure_cost_ratio(
            pool[name], pool.target, context_len=cfg.cache.cost_context, repeats=cfg.cache.cost_repeats)
    d = cfg.data
    records = load_texts(d.source, d.split, d.limit, prompt_field=d.prompt_field, reference_field=d.reference_field,
                         heldout_fraction=d.heldout_fraction, seed=d.seed)
    for acceptance, names in ((False, missing), (True, missing_acceptance)):
        settings = _settings(cfg, acceptance)
        for name in names:
            build_cache(pool, records, member_cache_dir(cfg, name, acceptance=acceptance), members=[name],
                        k=cfg.cache.k, dtype=cfg.cache.dtype, source=settings["source"], keep_full=cfg.cache.full_logits,
                        temperatures=(cfg.md.temperature,), shard_size=cfg.cache.shard_size,
                        backend=cfg.cache.backend, n_jobs=cfg.cache.n_jobs, chat_template=d.chat_template,
                        max_tokens=d.max_tokens, max_new_tokens=settings["max_new_tokens"],
                        sample_temperature=cfg.md.temperature, seed=d.seed, progress=cfg.progress, overwrite=True)


def _open_checked(cfg: RankConfig, names: list[str], acceptance: bool) -> dict:
    """Open the folders of ``names``; all must cover the same rows and tokenizer as the target's."""
    from mdboost.cache import LogitCache

    caches = {m: LogitCache.open(member_cache_dir(cfg, m, acceptance=acceptance)) for m in names}
    ref = caches[cfg.pool.target]
    for name, cache in caches.items():
        same = (cache.manifest["tokenizer_fingerprint"] == ref.manifest["tokenizer_fingerprint"]
                and cache.num_rows == ref.num_rows and torch.equal(cache.true_tokens(), ref.true_tokens()))
        if not same:
            kind = "acceptance cache" if acceptance else "cache"
            raise ValueError(f"{kind} of member {name!r} does not cover the same rows/tokenizer as the target's")
    return caches


def open_or_build_cache(cfg: RankConfig) -> tuple[PoolCache, dict]:
    """Open every member's cache, building the missing ones first; returns (cache, info).

    With ``cache.acceptance_source: sampled`` the returned cache's ``acceptance`` holds the
    members' target-sampled caches (built too when missing); otherwise it is ``None``.
    """
    names = [cfg.pool.target, *cfg.pool.drafters]
    sampled = cfg.cache.acceptance_source == "sampled"
    missing = [m for m in names if not _complete(member_cache_dir(cfg, m))]
    missing_acc = [m for m in names if sampled and not _complete(member_cache_dir(cfg, m, acceptance=True))]
    if missing or missing_acc:
        _build_missing(cfg, missing, missing_acc)
    acc = PoolCache(_open_checked(cfg, names, True), cfg.pool.target) if sampled else None
    pc = PoolCache(_open_checked(cfg, names, False), cfg.pool.target, acc)
    if acc is not None and acc.vocab_size != pc.vocab_size:
        raise ValueError(f"acceptance caches have vocab_size {acc.vocab_size}, the main caches {pc.vocab_size}")
    info = {"dir": str(Path(cfg.cache.dir)), "reused": not (missing or missing_acc), "built": missing,
            "built_acceptance": missing_acc}
    return pc, info


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


def acceptance_members(loader: MemberLoader, pc: PoolCache, drafter: str, target: str):
    """``(draft Member, target Member, labels [R'])`` of one pair on ``loader``'s (acceptance) cache.

    ``loader`` reads the target-sampled caches (``pc.acceptance``); cost ratios come from ``pc``,
    the main caches, where they were measured.
    """
    d_rows, d_hyp = loader(drafter)
    t_rows, t_hyp = loader(target)
    cost = pc.cost_ratio(drafter) / pc.cost_ratio(target)
    labels = loader.pc.true_tokens().numpy()
    return Member(drafter, d_rows, d_hyp, cost), Member(target, t_rows, t_hyp, 1.0), labels
