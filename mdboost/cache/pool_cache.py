"""Open a pool's member caches, building what is missing first (folders: :mod:`mdboost.cache.keys`).

:func:`open_or_build_cache` takes a :class:`~mdboost.cache.keys.PoolCacheSpec` and

1. samples the shared target continuations that are missing (once per token count,
   :func:`~mdboost.cache.build.sample_sequences`);
2. builds every member folder that is missing, unfinished, or (sampled) built on other
   continuations than the current shared file (its manifest's ``sequences_sha256``); a
   drafter's main folder measures its cost ratio first, in the engine's own steps at one torch
   thread (:func:`measure_member_cost`, :func:`mdboost.engine.costs.measure_engine_cost`): the
   median, the method and the repeat samples go straight into the manifest
   (``build_cache(..., member_costs=...)``), and into the drafter's acceptance folder when that
   is built in the same call;
3. measures the target's *speed profile* (manifest key ``speed_profile`` of its main folder:
   the verification cost table ``v(g)`` and the MD solve overhead ``s`` of
   :mod:`mdboost.models.cost`) when the folder has none, or a table shorter than
   ``spec.gamma_max``;
4. opens every folder (checksums verified) and checks that all cover the target's rows.

Models and records load only when something has to be built. Cost ratios are read back from
the main folders' manifests (:meth:`PoolCache.cost_ratio`, the samples
:meth:`PoolCache.cost_samples`; folders measured before the samples were kept have none).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from mdboost.cache.keys import PoolCacheSpec
from mdboost.cache.manifest import CacheCorruptionError, finished_digest, read_manifest, write_manifest
from mdboost.cache.reader import LogitCache
from mdboost.cache.settings import RunOptions, SequenceSettings, StoreSettings


@dataclass(frozen=True)
class PoolCache:
    """Opened member caches sharing the same rows (same records, tokenizer and positions).

    ``caches``: member name -> :class:`~mdboost.cache.reader.LogitCache`, the target first;
    ``acceptance``: the members' target-sampled caches (``acceptance_source: sampled``) or None.
    """

    caches: dict
    target: str
    acceptance: PoolCache | None = None

    @property
    def vocab_size(self) -> int:
        return self.caches[self.target].vocab_size

    @property
    def names(self) -> list[str]:
        return list(self.caches)

    def kind(self, name: str) -> str:
        return self.caches[name].kind(name)

    def cost_ratio(self, name: str) -> float:
        """The member's measured cost ratio against the pool target (from its manifest)."""
        cost = self.caches[name].cost_ratio(name)
        if cost is None:
            raise ValueError(f"member {name!r} has no measured cost ratio in its cache manifest")
        return float(cost)

    def cost_entries(self) -> dict:
        """``{drafter: (median, method, samples or None)}`` as the manifests hold them (for
        :func:`open_or_build_cache`'s ``known_costs``)."""
        return {name: self.caches[name].cost_entry(name) for name in self.names if name != self.target}

    def cost_samples(self, name: str) -> list[float] | None:
        """The repeated measurements behind :meth:`cost_ratio` (their median), or None.

        None for the target and for manifests written before the samples were kept.
        """
        return self.caches[name].cost_samples(name)

    def true_tokens(self) -> torch.Tensor:  # [R]
        return self.caches[self.target].true_tokens()

    def speed_profile_info(self, target: str) -> dict | None:
        """The manifest's ``speed_profile`` of ``target`` (``verify_cost``, ``md_overhead``), or None."""
        return self.caches[target].manifest.get("speed_profile")


@dataclass(frozen=True)
class BuildInfo:
    """What :func:`open_or_build_cache` did: ``built`` / ``built_acceptance`` member names,
    how many continuation files it sampled, whether it measured the speed profile."""

    dir: str
    built: tuple[str, ...]
    built_acceptance: tuple[str, ...]
    sampled_continuations: int
    measured_speed_profile: bool

    @property
    def reused(self) -> bool:
        """Nothing was built or sampled (the speed profile alone does not count)."""
        return not (self.built or self.built_acceptance or self.sampled_continuations)


def measure_speed_profile(target, gamma_max: int, context_len: int, repeats: int) -> dict:
    """The target's speed profile (manifest key ``speed_profile``): ``v`` table and MD overhead.

    ``v(g)`` for ``g <= max(gamma_max, 8)`` and ``s`` (dense and one-hot drafts), both at
    ``context_len`` / ``repeats`` (:mod:`mdboost.models.cost`).
    """
    from mdboost.models.cost import measure_md_overhead, measure_verify_costs

    table, v_method = measure_verify_costs(target, max(gamma_max, 8), context_len=context_len, repeats=repeats)
    overhead, s_method = measure_md_overhead(target, context_len=context_len, repeats=repeats)
    return {"verify_cost": table, "verify_method": v_method, "md_overhead": overhead, "md_overhead_method": s_method}


def store_settings(spec: PoolCacheSpec, acceptance: bool = False) -> StoreSettings:
    """What a member folder of ``spec`` stores (its :class:`~mdboost.cache.keys.FolderSettings`
    and the spec's temperature)."""
    folder = spec.settings(acceptance)
    return StoreSettings(k=folder.k, dtype=folder.dtype, keep_full=folder.full_logits,
                         temperatures=(spec.temperature,), shard_size=folder.shard_size)


def sequence_settings(spec: PoolCacheSpec, source: str, max_new_tokens: int) -> SequenceSettings:
    """How ``spec``'s sequences are made: its text source's formatting, truncation and seed,
    continuations sampled at the spec's temperature."""
    t = spec.text
    return SequenceSettings(source=source, chat_template=t.chat_template, max_tokens=t.max_tokens,
                            max_new_tokens=max_new_tokens, sample_temperature=spec.temperature, seed=t.seed)


def measure_member_cost(drafter, target, context_len: int, repeats: int) -> tuple[float, str, list[float]]:
    """The manifest's ``member_costs`` entry of a drafter: ``(median, method, samples)``.

    Measured in the engine's own steps at one torch thread, the engine's setting
    (:func:`mdboost.engine.costs.measure_engine_cost`; ``drafter`` and ``target`` are pool members).
    """
    from mdboost.engine.costs import measure_engine_cost

    result = measure_engine_cost(drafter.ngram if drafter.kind == "ngram" else drafter.model, target.model,
                                 context_len=context_len, repeats=repeats, threads=1)
    return result.median, result.method, result.samples


class _Builder:
    """Builds the missing parts of a spec's folders; loads the pool and records on first use.

    Measured cost ratios stay here (``costs``) until they are written to manifests; the pool's
    members are never modified.
    """

    def __init__(self, spec: PoolCacheSpec, drafters: list[str], progress: bool, known_costs: dict | None = None):
        self.spec, self.drafters, self.progress = spec, drafters, progress
        self._pool, self._records, self.costs = None, None, dict(known_costs or {})

    @property
    def pool(self):
        if self._pool is None:
            from mdboost.models.pool import build_pool

            self._pool = build_pool(self.spec.target, self.drafters, device=self.spec.device, home=self.spec.home)
        return self._pool

    @property
    def records(self) -> list[dict]:
        if self._records is None:
            self._records = self.spec.text.load()
        return self._records

    def sample(self, max_new_tokens: int) -> None:
        from mdboost.cache.build import sample_sequences

        sample_sequences(self.pool, self.records, self.spec.continuations_path(max_new_tokens),
                         sequence_settings(self.spec, "sampled", max_new_tokens), progress=self.progress)

    def build(self, name: str, acceptance: bool) -> None:
        """Build one member folder; a drafter's main folder measures its cost ratio first."""
        from mdboost.cache.build import build_cache

        spec, pool = self.spec, self.pool
        if not acceptance and name != spec.target and name not in self.costs:
            self.costs[name] = measure_member_cost(pool[name], pool.target, spec.cost_context, spec.cost_repeats)
        folder = spec.settings(acceptance)
        build_cache(pool, self.records, spec.member_dir(name, acceptance), store_settings(spec, acceptance),
                    sequence_settings(spec, folder.source, folder.max_new_tokens), members=[name],
                    tokens_file=spec.continuations_path(folder.max_new_tokens) if folder.sampled else None,
                    member_costs={name: self.costs[name]} if name in self.costs else None,
                    run=RunOptions(backend=spec.backend, n_jobs=spec.n_jobs, progress=self.progress, overwrite=True))

    def store_speed_profile(self) -> None:
        folder = self.spec.member_dir(self.spec.target)
        manifest = read_manifest(folder)
        manifest["speed_profile"] = measure_speed_profile(self.pool.target, self.spec.gamma_max,
                                                          self.spec.cost_context, self.spec.cost_repeats)
        write_manifest(folder, manifest)


def folder_complete(spec: PoolCacheSpec, member: str, acceptance: bool = False) -> bool:
    """The member's folder is finished and (if sampled) built on the current shared continuations."""
    manifest = spec.member_dir(member, acceptance) / "manifest.json"
    if not manifest.is_file():
        return False
    try:
        info = read_manifest(manifest.parent)
    except CacheCorruptionError:  # damaged or edited: build_cache starts it over
        return False
    settings = spec.settings(acceptance)
    if settings.sampled:
        digest = finished_digest(spec.continuations_path(settings.max_new_tokens))
        if digest is None or info.get("sequences_sha256") != digest:
            return False
    return bool(info.get("complete"))


def _needs_speed_profile(spec: PoolCacheSpec) -> bool:
    info = read_manifest(spec.member_dir(spec.target)).get("speed_profile")
    return info is None or len(info["verify_cost"]) < spec.gamma_max + 1


def _open_checked(spec: PoolCacheSpec, acceptance: bool) -> dict:
    """Open the members' folders; all must cover the same rows and tokenizer as the target's."""
    caches = {m: LogitCache.open(spec.member_dir(m, acceptance)) for m in spec.names}
    ref = caches[spec.target]
    for name, cache in caches.items():
        same = (cache.manifest["tokenizer_fingerprint"] == ref.manifest["tokenizer_fingerprint"]
                and cache.num_rows == ref.num_rows and torch.equal(cache.true_tokens(), ref.true_tokens()))
        if not same:
            kind = "acceptance cache" if acceptance else "cache"
            raise ValueError(f"{kind} of member {name!r} does not cover the same rows/tokenizer as the target's")
    return caches


def open_or_build_cache(spec: PoolCacheSpec, *, progress: bool = False,
                        known_costs: dict | None = None) -> tuple[PoolCache, BuildInfo]:
    """Open every member's cache of ``spec``, building what is missing first (module docstring).

    ``known_costs``: ``{member: (median, method, samples)}`` measured before for the same pool
    (e.g. by another temperature's folders, :meth:`PoolCache.cost_entries`): a folder built now
    records these instead of measuring again. Costs do not depend on the temperature.

    Returns
    -------
    (PoolCache, BuildInfo)
        The opened caches (``acceptance`` set when ``spec.acceptance_source == "sampled"``)
        and what was built.
    """
    names, sets = spec.names, spec.folder_sets()
    counts = {spec.settings(acc).max_new_tokens for acc in sets if spec.settings(acc).sampled}
    to_sample = sorted(n for n in counts if finished_digest(spec.continuations_path(n)) is None)
    maybe = {m for acc in sets for m in names if not folder_complete(spec, m, acc)}
    builder = _Builder(spec, [m for m in names if m in maybe and m != spec.target], progress, known_costs)
    for n in to_sample:
        builder.sample(n)
    built = {}
    for acc in sets:
        built[acc] = tuple(m for m in names if not folder_complete(spec, m, acc))
        for name in built[acc]:
            builder.build(name, acc)
    profiled = _needs_speed_profile(spec)
    if profiled:
        builder.store_speed_profile()
    acc_pc = PoolCache(_open_checked(spec, True), spec.target) if spec.sampled_acceptance else None
    pc = PoolCache(_open_checked(spec, False), spec.target, acc_pc)
    if acc_pc is not None and acc_pc.vocab_size != pc.vocab_size:
        raise ValueError(f"acceptance caches have vocab_size {acc_pc.vocab_size}, the main caches {pc.vocab_size}")
    info = BuildInfo(str(Path(spec.dir)), built[False], built.get(True, ()), len(to_sample), profiled)
    return pc, info
