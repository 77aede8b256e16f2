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
``data.seed``, at ``md.temperature``). The continuations are sampled ONCE
(:func:`continuations_path`, keyed by data, target, temperature, token count and the sampler)
and every member's folder is teacher-forced on them; the folder fingerprint includes that key
and its manifest the token file's SHA-256, checked on every open (a folder built on other
sequences is rebuilt). The ranking reads acceptance from
these folders and quality/boosting from the main folders; cost ratios always come from the main
folders. (The same holds for the main folders when ``cache.source: sampled``.)

The pool target's main folder also holds its *speed profile* (manifest key ``speed_profile``):
the verification cost table ``v(g)`` and the MD solve overhead ``s`` of
:mod:`mdboost.models.cost`, measured once (also added to an existing folder that lacks it, or
whose table is shorter than ``speed.gamma_max``) and read by :meth:`PoolCache.speed_profile`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from mdboost.config import RankConfig, fingerprint
from mdboost.ranking.boosting import CachedLogitsHypothesis, ProposalHypothesis
from mdboost.ranking.rank import Member
from mdboost.ranking.speed import SpeedProfile
from mdboost.ranking.support import MemberRows, rows_from_proposals

_VALUE_KEYS = ("k", "dtype", "full_logits", "source", "max_new_tokens", "shard_size")
# how continuations are sampled (part of their key): change it when the sampling code changes
SAMPLER = "build_sequences/v1: per-record torch.Generator seeded by sha256(seed:id), KV-cached multinomial"


def _settings(cfg: RankConfig, acceptance: bool) -> dict:
    settings = {k: getattr(cfg.cache, k) for k in _VALUE_KEYS}
    if acceptance:
        settings.update(source="sampled", max_new_tokens=cfg.cache.acceptance_max_new_tokens)
    return settings


def _continuations_key(cfg: RankConfig, max_new_tokens: int) -> str:
    return fingerprint(cfg.data, cfg.pool.target, cfg.md.temperature, max_new_tokens, SAMPLER)


def continuations_path(cfg: RankConfig, max_new_tokens: int) -> Path:
    """The token file of the target's sampled continuations shared by every member's folder.

    Keyed by the data section (records, truncation, seed), the target, ``md.temperature``,
    ``max_new_tokens`` and :data:`SAMPLER`.
    """
    return Path(cfg.cache.dir) / f"continuations-{_continuations_key(cfg, max_new_tokens)}" / "tokens.safetensors"


def member_cache_dir(cfg: RankConfig, member: str, *, acceptance: bool = False) -> Path:
    """The cache folder of one pool member under ``cfg.cache.dir``.

    ``acceptance=True``: the member's folder of target-sampled continuations (used with
    ``cache.acceptance_source: sampled``); it coincides with the main folder when the main cache
    is itself sampled with the same number of new tokens. A sampled folder's fingerprint
    includes the key of the shared continuations, and its manifest their SHA-256
    (``sequences_sha256``): a folder built on other token sequences counts as missing.
    """
    settings = _settings(cfg, acceptance)
    parts = (cfg.data, settings, cfg.pool.target, member, cfg.md.temperature)
    if settings["source"] == "sampled":
        parts += (_continuations_key(cfg, settings["max_new_tokens"]),)
    slug = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in member)
    return Path(cfg.cache.dir) / f"{slug}-{fingerprint(*parts)}"


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

    def speed_profile(self, drafter: str, target: str) -> SpeedProfile:
        """The speed model's ``v`` table and MD overhead for the pair (defaults when ``target``
        has no measured profile: ``v = 1``, ``s = 0``). One-hot (``ngram``) drafts use their own
        overhead."""
        info = self.caches[target].manifest.get("speed_profile")
        if info is None:
            return SpeedProfile()
        kind = "onehot" if self.kind(drafter) == "ngram" else "dense"
        return SpeedProfile(tuple(info["verify_cost"]), float(info["md_overhead"][kind]))


def _complete(cfg: RankConfig, member: str, acceptance: bool) -> bool:
    """The member's folder is finished and (if sampled) built on the current shared continuations."""
    import json

    from mdboost.cache.manifest import finished_digest

    manifest = member_cache_dir(cfg, member, acceptance=acceptance) / "manifest.json"
    if not manifest.is_file():
        return False
    info = json.loads(manifest.read_text())
    settings = _settings(cfg, acceptance)
    if settings["source"] == "sampled":
        digest = finished_digest(continuations_path(cfg, settings["max_new_tokens"]))
        if digest is None or info.get("sequences_sha256") != digest:
            return False
    return bool(info.get("complete"))


class _LazyPool:
    """The pool (target + ``drafters``) and the cache records, loaded on first use only."""

    def __init__(self, cfg: RankConfig, drafters: list[str]):
        self.cfg, self.drafters, self._pool, self._records = cfg, drafters, None, None

    @property
    def pool(self):
        if self._pool is None:
            from mdboost.models.pool import build_pool

            p = self.cfg.pool
            self._pool = build_pool(p.target, self.drafters, device=p.device, home=p.home)
        return self._pool

    @property
    def records(self) -> list[dict]:
        if self._records is None:
            from mdboost.data import load_texts

            d = self.cfg.data
            self._records = load_texts(d.source, d.split, d.limit, prompt_field=d.prompt_field,
                                       reference_field=d.reference_field, heldout_fraction=d.heldout_fraction,
                                       seed=d.seed)
        return self._records


def _source_sets(cfg: RankConfig) -> list[tuple[bool, dict]]:
    """``(acceptance, settings)`` of the folder sets the config uses: main, then acceptance."""
    sets = [(False, _settings(cfg, False))]
    if cfg.cache.acceptance_source == "sampled":
        sets.append((True, _settings(cfg, True)))
    return sets


def _sample_continuations(cfg: RankConfig, lazy: _LazyPool, max_new_tokens: int) -> None:
    from mdboost.cache.build import sample_sequences

    d = cfg.data
    sample_sequences(lazy.pool, lazy.records, continuations_path(cfg, max_new_tokens), chat_template=d.chat_template,
                     max_tokens=d.max_tokens, max_new_tokens=max_new_tokens, sample_temperature=cfg.md.temperature,
                     seed=d.seed, progress=cfg.progress)


def _build_folder(cfg: RankConfig, lazy: _LazyPool, name: str, acceptance: bool) -> None:
    """Build one member folder; a main folder of a drafter measures its cost ratio first."""
    from mdboost.cache.build import build_cache
    from mdboost.models.cost import measure_cost_ratio

    pool, settings, d = lazy.pool, _settings(cfg, acceptance), cfg.data
    if not acceptance and name != cfg.pool.target:
        pool[name].cost_ratio, pool[name].cost_method = measure_cost_ratio(
            pool[name], pool.target, context_len=cfg.cache.cost_context, repeats=cfg.cache.cost_repeats)
    sampled = settings["source"] == "sampled"
    build_cache(pool, lazy.records, member_cache_dir(cfg, name, acceptance=acceptance), members=[name],
                k=cfg.cache.k, dtype=cfg.cache.dtype, source=settings["source"], keep_full=cfg.cache.full_logits,
                temperatures=(cfg.md.temperature,), shard_size=cfg.cache.shard_size,
                backend=cfg.cache.backend, n_jobs=cfg.cache.n_jobs, chat_template=d.chat_template,
                max_tokens=d.max_tokens, max_new_tokens=settings["max_new_tokens"],
                sample_temperature=cfg.md.temperature, seed=d.seed, progress=cfg.progress, overwrite=True,
                sequences=continuations_path(cfg, settings["max_new_tokens"]) if sampled else None)


def _needs_speed_profile(cfg: RankConfig) -> bool:
    from mdboost.cache.manifest import read_manifest

    info = read_manifest(member_cache_dir(cfg, cfg.pool.target)).get("speed_profile")
    return info is None or len(info["verify_cost"]) < cfg.speed.gamma_max + 1


def measure_speed_profile(cfg: RankConfig, target) -> dict:
    """The target's speed profile (manifest key ``speed_profile``): ``v`` table and MD overhead.

    ``v(g)`` for ``g <= max(speed.gamma_max, 8)`` and ``s`` (dense and one-hot drafts, KL budget
    0.05), both at ``cache.cost_context`` / ``cache.cost_repeats`` (:mod:`mdboost.models.cost`).
    """
    from mdboost.models.cost import measure_md_overhead, measure_verify_costs

    c = cfg.cache
    table, v_method = measure_verify_costs(target, max(cfg.speed.gamma_max, 8), context_len=c.cost_context,
                                           repeats=c.cost_repeats)
    overhead, s_method = measure_md_overhead(target, context_len=c.cost_context, repeats=c.cost_repeats)
    return {"verify_cost": table, "verify_method": v_method, "md_overhead": overhead, "md_overhead_method": s_method}


def _store_speed_profile(cfg: RankConfig, lazy: _LazyPool) -> None:
    from mdboost.cache.manifest import read_manifest, write_manifest

    folder = member_cache_dir(cfg, cfg.pool.target)
    manifest = read_manifest(folder)
    manifest["speed_profile"] = measure_speed_profile(cfg, lazy.pool.target)
    write_manifest(folder, manifest)


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
    """Open every member's cache, building what is missing first; returns (cache, info).

    Missing shared continuations are sampled (once), then missing member folders are built
    (teacher-forced on those continuations when sampled), then the target's speed profile is
    measured if its main folder lacks one. With ``cache.acceptance_source: sampled`` the
    returned cache's ``acceptance`` holds the members' target-sampled caches; otherwise ``None``.
    """
    from mdboost.cache.manifest import finished_digest

    names = [cfg.pool.target, *cfg.pool.drafters]
    sets = _source_sets(cfg)
    to_sample = sorted({st["max_new_tokens"] for _, st in sets if st["source"] == "sampled"
                        and finished_digest(continuations_path(cfg, st["max_new_tokens"])) is None})
    maybe = {m for acc, _ in sets for m in names if not _complete(cfg, m, acc)}  # folders to build
    lazy = _LazyPool(cfg, [m for m in names if m in maybe and m != cfg.pool.target])
    for n in to_sample:
        _sample_continuations(cfg, lazy, n)
    built = {}
    for acc, _ in sets:
        built[acc] = [m for m in names if not _complete(cfg, m, acc)]
        for name in built[acc]:
            _build_folder(cfg, lazy, name, acc)
    profiled = _needs_speed_profile(cfg)
    if profiled:
        _store_speed_profile(cfg, lazy)
    sampled = cfg.cache.acceptance_source == "sampled"
    acc_pc = PoolCache(_open_checked(cfg, names, True), cfg.pool.target) if sampled else None
    pc = PoolCache(_open_checked(cfg, names, False), cfg.pool.target, acc_pc)
    if acc_pc is not None and acc_pc.vocab_size != pc.vocab_size:
        raise ValueError(f"acceptance caches have vocab_size {acc_pc.vocab_size}, the main caches {pc.vocab_size}")
    built_acc = built.get(True, [])
    info = {"dir": str(Path(cfg.cache.dir)), "reused": not (built[False] or built_acc or to_sample),
            "built": built[False], "built_acceptance": built_acc, "sampled_continuations": len(to_sample),
            "measured_speed_profile": profiled}
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
    """``(draft Member, target Member, labels [R'], layout)`` of one pair on ``loader``'s (acceptance) cache.

    ``loader`` reads the target-sampled caches (``pc.acceptance``); cost ratios come from ``pc``,
    the main caches, where they were measured. ``layout`` groups the rows by sequence for the
    engine's draft-start process (:func:`mdboost.ranking.layout.sequence_layout`).
    """
    from mdboost.ranking.layout import sequence_layout

    d_rows, d_hyp = loader(drafter)
    t_rows, t_hyp = loader(target)
    cost = pc.cost_ratio(drafter) / pc.cost_ratio(target)
    labels = loader.pc.true_tokens().numpy()
    layout = sequence_layout(loader.pc.caches[drafter], drafter)
    return Member(drafter, d_rows, d_hyp, cost), Member(target, t_rows, t_hyp, 1.0), labels, layout
