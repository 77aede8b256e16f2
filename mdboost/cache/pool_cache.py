"""Open a pool's member caches, building what is missing first (folders: :mod:`mdboost.cache.keys`).

:func:`open_or_build_cache` takes a :class:`~mdboost.cache.keys.PoolCacheSpec` and

1. samples the shared target continuations that are missing (once per token count,
   :func:`~mdboost.cache.build.sample_sequences`);
2. builds every member folder that is missing, unfinished, or (sampled) built on other
   continuations than the current shared file (its manifest's ``sequences_sha256``);
3. measures what the pool's speed file (:mod:`mdboost.cache.speed`) lacks, in the engine's own
   steps at one torch thread (:mod:`mdboost.engine.costs`): the target's profile (``v(K)``,
   the MD solve overhead ``s``, its prefill cost) and each drafter's cost ratio ``c`` with its
   repeat samples and prefill cost; the file then names the pool and this machine's hardware
   (a cost profile, :mod:`mdboost.cache.profile`);
4. opens every folder (checksums verified) and checks that all cover the target's rows. A
   finished folder whose files turn out damaged or missing when opened (its manifest intact:
   a damaged manifest already counts as unfinished in step 2) is rebuilt in place before it is
   opened again: :func:`~mdboost.cache.build.build_cache` resumes it, keeping every file that
   matches its manifest entry and computing the rest (``BuildInfo.repaired``).

:func:`measure_pool_costs` is step 3 alone (``mdboost profile``); :func:`open_cached` is step 4
alone with a cost profile's costs instead of the speed file's (``mdboost rank --costs``: nothing
is built or measured, a missing folder is an error). Models and records load only when something
has to be built or measured. The costs are read
from the speed file (:meth:`PoolCache.cost_ratio`, :meth:`PoolCache.cost_samples`,
:meth:`PoolCache.prefill_per_token`, :meth:`PoolCache.speed_profile_info`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from mdboost._io import file_lock, lock_path
from mdboost._stages import ticking, timed
from mdboost.cache.build import build_cache, sample_sequences
from mdboost.cache.keys import PoolCacheSpec
from mdboost.cache.manifest import CacheCorruptionError, finished_digest, read_manifest
from mdboost.cache.reader import LogitCache
from mdboost.cache.settings import RunOptions, SequenceSettings, StoreSettings
from mdboost.cache.profile import check_profile, hardware_fingerprint, pool_identity
from mdboost.cache.speed import SpeedStore, entry_key, speed_path


@dataclass(frozen=True)
class PoolCache:
    """Opened member caches sharing the same rows (same records, tokenizer and positions).

    ``caches``: member name -> :class:`~mdboost.cache.reader.LogitCache`, the target first;
    ``acceptance``: the members' target-sampled caches (``acceptance_source: sampled``) or None;
    ``mentored``: prompt-lookup drafter -> ``{(rule, divergence, budget): rows file}`` of continuations
    sampled by a lossy rule itself (:func:`mdboost.cache.mentored.attach_mentored`; empty: none);
    ``spec``: the :meth:`~mdboost.cache.keys.PoolCacheSpec.keyed` spec it was opened from, whose
    folder keys it carries (reuse it, not a new spec, so a run keys its folders once).
    """

    caches: dict
    target: str
    acceptance: PoolCache | None = None
    speed: SpeedStore | None = None
    mentored: dict = field(default_factory=dict)
    spec: PoolCacheSpec | None = None

    @property
    def vocab_size(self) -> int:
        return self.caches[self.target].vocab_size

    @property
    def names(self) -> list[str]:
        return list(self.caches)

    def kind(self, name: str) -> str:
        return self.caches[name].kind(name)

    def _cost(self, name: str, batch_size: int = 1) -> dict | None:
        if name == self.target:
            return None
        entry = None if self.speed is None else self.speed.drafter(name, batch_size)
        if entry is None:
            raise ValueError(f"member {name!r} has no measured cost ratio at batch size {batch_size} in the pool's "
                             f"speed file")
        return entry

    def cost_ratio(self, name: str, batch_size: int = 1) -> float:
        """The member's cost ratio ``c`` against the pool target (1 for the target itself), at
        ``batch_size`` rows per step."""
        entry = self._cost(name, batch_size)
        return 1.0 if entry is None else float(entry["median"])

    def cost_samples(self, name: str, batch_size: int = 1) -> list[float] | None:
        """The repeated measurements behind :meth:`cost_ratio` (their median); None for the target."""
        entry = self._cost(name, batch_size)
        return None if entry is None else [float(x) for x in entry["samples"]]

    def prefill_per_token(self, name: str, batch_size: int = 1) -> float:
        """A drafter's own prefill cost per prompt token (0 for prompt lookup), or the
        target's (from its profile; 0 when not measured)."""
        if name == self.target:
            profile = self.speed_profile_info(name, batch_size)
            return 0.0 if profile is None else float(profile["prefill_per_token"])
        return float(self._cost(name, batch_size)["prefill_per_token"])

    def true_tokens(self) -> torch.Tensor:  # [R]
        return self.caches[self.target].true_tokens()

    def speed_profile_info(self, target: str, batch_size: int = 1) -> dict | None:
        """The pool target's measured profile at ``batch_size`` rows per step (``verify_cost``,
        ``md_overhead``, ``prefill_per_token``, ...; :class:`~mdboost.engine.costs.EngineProfile`),
        or None (not measured, or ``target`` is another member)."""
        if target != self.target or self.speed is None:
            return None
        return self.speed.profile_at(batch_size)


@dataclass(frozen=True)
class BuildInfo:
    """What :func:`open_or_build_cache` did: ``built`` / ``built_acceptance`` member names,
    how many continuation files it sampled, whether it measured the target's speed profile, the
    drafters whose cost it measured, and the seconds each of its :data:`STEPS` took (those that
    ran)."""

    dir: str
    built: tuple[str, ...]
    built_acceptance: tuple[str, ...]
    sampled_continuations: int
    measured_speed_profile: bool
    measured_costs: tuple[str, ...] = ()
    repaired: tuple[str, ...] = ()  # "member" or "member (acceptance)": finished folders found damaged, rebuilt
    seconds: dict = field(default_factory=dict)  # wall-clock seconds per step that ran (STEPS), in their order

    @property
    def reused(self) -> bool:
        """Nothing was built, repaired or sampled (the speed profile alone does not count)."""
        return not (self.built or self.built_acceptance or self.sampled_continuations or self.repaired)


STEPS = ("models", "continuations", "logit caches", "costs", "opening")
"""The steps of :func:`open_or_build_cache` whose seconds :class:`BuildInfo` reports: loading the
pool's models (converting the target on a first run), sampling continuations, building logit
caches, measuring costs, opening (and checking) the folders."""


def _cost_settings(temperature: float):
    """The steps costs are measured with: greedy at temperature 0 (the engine's greedy path),
    else the engine's defaults (sampling at temperature 1; the step cost does not depend on it)."""
    # deferred: mdboost.engine imports transformers (seconds); a cache opens without it
    from mdboost.engine.settings import GenerationSettings

    return GenerationSettings(temperature=0.0) if temperature == 0 else GenerationSettings()


def speed_profile_repeats(target, gamma_max: int, context_len: int, repeats: int, temperature: float = 1.0,
                          batch_size: int = 1):
    """The target's profile for the speed file, as a measurement to run
    (:func:`mdboost.engine.costs.profile_repeats`: a generator, one repeat per step) for ``K <=
    max(gamma_max, 8)`` at ``context_len`` / ``repeats`` (at most: the repeats stop when the costs
    are tight) and ``batch_size`` rows per step, one torch thread."""
    # deferred: mdboost.engine imports transformers (seconds); a cache opens without it
    from mdboost.engine.costs import profile_repeats

    return profile_repeats(target, max(gamma_max, 8), context_len=context_len, repeats=repeats,
                           settings=_cost_settings(temperature), batch_size=batch_size)


def store_settings(spec: PoolCacheSpec, acceptance: bool = False) -> StoreSettings:
    """What a member folder of ``spec`` stores (its :class:`~mdboost.cache.keys.FolderSettings`
    and the spec's temperature)."""
    folder = spec.settings(acceptance)
    return StoreSettings(k=folder.k, dtype=folder.dtype, keep_full=folder.full_logits,
                         temperatures=(spec.temperature,) if spec.temperature > 0 else (), shard_size=folder.shard_size)


def sequence_settings(spec: PoolCacheSpec, source: str, max_new_tokens: int) -> SequenceSettings:
    """How ``spec``'s sequences are made: its text source's formatting, truncation and seed,
    continuations sampled at the spec's temperature."""
    t = spec.text
    return SequenceSettings(source=source, chat_template=t.chat_template, max_tokens=t.max_tokens,
                            max_new_tokens=max_new_tokens, sample_temperature=spec.temperature, seed=t.seed)


def member_cost_repeats(drafter, target, context_len: int, repeats: int, temperature: float = 1.0,
                        batch_size: int = 1):
    """A drafter's cost as a measurement to run (:func:`mdboost.engine.costs.cost_repeats`: a
    generator whose result is a :class:`~mdboost.engine.costs.CostMeasurement`) in the engine's own
    steps at one torch thread and ``batch_size`` rows per step (pool members)."""
    # deferred: mdboost.engine imports transformers (seconds); a cache opens without it
    from mdboost.engine.costs import cost_repeats

    return cost_repeats(drafter.ngram if drafter.kind == "ngram" else drafter.model, target.model,
                        context_len=context_len, repeats=repeats, threads=1, settings=_cost_settings(temperature),
                        batch_size=batch_size)


class _Builder:
    """Builds the missing parts of a spec's folders; loads the pool and records on first use.

    The pool's members are never modified.
    """

    def __init__(self, spec: PoolCacheSpec, drafters: list[str], progress: bool):
        self.spec, self.drafters, self.progress = spec, list(drafters), progress
        self._pool, self._records = None, None

    def include(self, name: str) -> None:
        """Make ``name`` one of the pool's members (a pool loaded without it is loaded again)."""
        if name != self.spec.target and name not in self.drafters:
            self.drafters.append(name)
            self._pool = None

    @property
    def pool(self):
        if self._pool is None:
            # deferred: mdboost.models imports transformers (seconds); a cache opens without it
            from mdboost.models.pool import build_pool

            with ticking(f"loading the pool's models ({self.spec.target} and {len(self.drafters)} drafters; a first "
                         f"run converts the target and fits tuned lenses)", self.progress):
                self._pool = build_pool(self.spec.target, self.drafters, device=self.spec.device, home=self.spec.home)
        return self._pool

    @property
    def records(self) -> list[dict]:
        if self._records is None:
            self._records = self.spec.text.load()
        return self._records

    def sample(self, max_new_tokens: int) -> None:
        sample_sequences(self.pool, self.records, self.spec.continuations_path(max_new_tokens),
                         sequence_settings(self.spec, "sampled", max_new_tokens), progress=self.progress)

    def build(self, name: str, acceptance: bool) -> None:
        """Build one member folder."""
        spec, pool = self.spec, self.pool
        folder = spec.settings(acceptance)
        build_cache(pool, self.records, spec.member_dir(name, acceptance), store_settings(spec, acceptance),
                    sequence_settings(spec, folder.source, folder.max_new_tokens), members=[name],
                    tokens_file=spec.continuations_path(folder.max_new_tokens) if folder.sampled else None,
                    run=RunOptions(backend=spec.backend, n_jobs=spec.n_jobs, progress=self.progress, overwrite=True))

    def measure_costs(self, store: SpeedStore, drafters: list[str]) -> tuple[bool, tuple[str, ...]]:
        """Measure what ``store`` lacks at each of the spec's batch sizes: the target's profile and
        each drafter's cost, in turn (one repeat of each per round, :func:`mdboost.engine.costs.run_in_turn`,
        so every figure's repeats span the whole stage), each stored as soon as it stops; the file
        then names the pool and this machine (:mod:`mdboost.cache.profile`).

        Returns whether a profile was measured and the drafters whose cost was."""
        spec = self.spec
        todo = [(b, None) for b in spec.batch_sizes if store.profile_at(b) is None]
        todo += [(b, name) for b in spec.batch_sizes for name in store.missing(drafters, b)]
        if not todo:
            return False, ()
        store.identify(pool_identity(spec, self.vocabulary()), hardware_fingerprint(spec.device, spec.engine),
                       spec.engine)
        measured = tuple(dict.fromkeys(n for _, n in todo if n is not None))  # drafters, once each
        runs = self.engine_pool(list(measured))
        # deferred: mdboost.engine imports transformers (seconds); a cache opens without it
        from mdboost.engine.costs import run_in_turn

        figures = [speed_profile_repeats(runs.target.model, spec.gamma_max, spec.cost_context, spec.cost_repeats,
                                         spec.temperature, b) if name is None else
                   member_cost_repeats(runs[name], runs.target, spec.cost_context, spec.cost_repeats, spec.temperature,
                                       b) for b, name in todo]
        bar = tqdm(total=len(todo), desc=f"measuring costs ({spec.target}, engine {spec.engine}; in turn)", unit="cost",
                   disable=not self.progress)

        def repeat(i: int, r: int, n: int, width: float) -> None:  # the stopping rule's state
            b, name = todo[i]
            bar.set_postfix_str(f"{name or 'target profile'} at B={b}: repeat {r}/{n}, interval +-{100 * width:.1f}%")

        def done(i: int, result) -> None:  # stored at once: an interrupted run keeps what finished
            b, name = todo[i]
            if name is None:
                store.set_profile(result.to_dict(), b)
            else:
                store.set_drafter(name, result.to_dict(), b)
            bar.update(1)

        run_in_turn(figures, repeat, done)
        bar.close()
        return any(name is None for _, name in todo), measured

    def engine_pool(self, drafters: list[str]):
        """The members whose steps the costs time: the pool's (engine ``mdboost``), or the same
        specs run by llama.cpp (:class:`mdboost.engine.llamacpp.LlamaCppPool`, engine ``llamacpp``)."""
        if self.spec.engine == "mdboost":
            return self.pool
        # deferred: mdboost.engine imports transformers (seconds); a cache opens without it
        from mdboost.engine.costs import ENGINE_THREADS
        from mdboost.engine.llamacpp import LlamaCppPool

        return LlamaCppPool(self.spec.target, drafters, home=self.spec.home, n_threads=ENGINE_THREADS)

    def vocabulary(self) -> str:
        """The pool's vocabulary fingerprint: the target folder's manifest when built, else the loaded pool's."""
        if folder_complete(self.spec, self.spec.target):
            return read_manifest(self.spec.member_dir(self.spec.target))["tokenizer_fingerprint"]
        return self.pool.target.vocab_fingerprint


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


def _open_checked(spec: PoolCacheSpec, acceptance: bool, builder: _Builder | None, repaired: list) -> dict:
    """Open the members' folders; all must cover the same rows and tokenizer as the target's.

    A folder found damaged (a shard changed or missing, a bad header: ``CacheCorruptionError``) is
    rebuilt in place (:meth:`_Builder.build` resumes it: the files matching the manifest are kept),
    then opened again, and recorded in ``repaired``; every damaged member is included in the
    builder's pool before the first build (one load of the pool). A folder found unfinished while
    finished a moment earlier is being rebuilt by another run: its lock is waited for, then it is
    opened again. Damage a rebuild leaves is raised as it is.
    """
    caches, damaged = {}, []
    for name in spec.names:
        folder = spec.member_dir(name, acceptance)
        try:
            caches[name] = LogitCache.open(folder)
        except CacheCorruptionError:
            damaged.append(name)
        except ValueError:
            if folder_complete(spec, name, acceptance):
                raise
            with file_lock(lock_path(folder)):  # another run is writing it: wait for it, then open again
                pass
            caches[name] = LogitCache.open(folder)
    if damaged and builder is None:
        raise ValueError(f"the cache folders of {damaged} in {spec.dir!r} are damaged; {_RANK_FIRST}")
    for name in damaged:
        builder.include(name)
    for name in damaged:
        builder.build(name, acceptance)
        caches[name] = LogitCache.open(spec.member_dir(name, acceptance))
        repaired.append(f"{name} (acceptance)" if acceptance else name)
    caches = {name: caches[name] for name in spec.names}
    ref = caches[spec.target]
    for name, cache in caches.items():
        same = (cache.manifest["tokenizer_fingerprint"] == ref.manifest["tokenizer_fingerprint"]
                and cache.num_rows == ref.num_rows and torch.equal(cache.true_tokens(), ref.true_tokens()))
        if not same:
            kind = "acceptance cache" if acceptance else "cache"
            raise ValueError(f"{kind} of member {name!r} does not cover the same rows/tokenizer as the target's")
    return caches


_RANK_FIRST = "re-scoring with a cost profile reads finished caches only: run `mdboost rank` on this config first"


def open_cached(spec: PoolCacheSpec, costs: SpeedStore) -> tuple[PoolCache, BuildInfo]:
    """Open the finished caches of ``spec`` with the costs of a cost profile, building and measuring
    nothing (no model loads): a missing, unfinished or damaged folder is a ``ValueError``, and so
    is a profile that is not for this pool (:func:`mdboost.cache.profile.check_profile`)."""
    spec = spec.keyed()
    for acc in spec.folder_sets():
        unfinished = [m for m in spec.names if not folder_complete(spec, m, acc)]
        if unfinished:
            kind = "acceptance cache" if acc else "cache"
            raise ValueError(f"the {kind} folders of {unfinished} in {spec.dir!r} are missing or unfinished "
                             f"(T={spec.temperature:g}); {_RANK_FIRST}")
    acc_pc = PoolCache(_open_checked(spec, True, None, []), spec.target) if spec.sampled_acceptance else None
    caches = _open_checked(spec, False, None, [])
    costs = costs.keyed({m: entry_key(spec, m) for m in spec.drafters})
    check_profile(costs, spec, caches[spec.target].manifest["tokenizer_fingerprint"], spec.gamma_max)
    pc = PoolCache(caches, spec.target, acc_pc, costs, spec=spec)
    return pc, BuildInfo(str(Path(spec.dir)), (), (), 0, False)


def _identify_format1(store: SpeedStore, spec: PoolCacheSpec, vocabulary: str) -> None:
    """Name the pool and hardware of a format-1 speed file, in memory: it was measured on this
    machine (its name keys the device, the thread count and the torch version), at a load
    average it did not record."""
    store.identify(pool_identity(spec, vocabulary), {**hardware_fingerprint(spec.device), "load_average": None})


def measure_pool_costs(spec: PoolCacheSpec, *, progress: bool = False) -> tuple[SpeedStore, BuildInfo]:
    """Measure what the pool's speed file lacks (the costs step of :func:`open_or_build_cache`,
    alone: no logit cache is built) and name its pool in it (in memory when nothing was measured).

    Returns the speed file and what was measured (``measured_speed_profile``, ``measured_costs``)."""
    spec = spec.keyed()
    store = SpeedStore(speed_path(spec), {m: entry_key(spec, m) for m in spec.drafters})
    builder = _Builder(spec, sorted({m for b in spec.batch_sizes for m in store.missing(spec.drafters, b)}), progress)
    profiled, costed = builder.measure_costs(store, list(spec.drafters))
    if store.pool is None:
        _identify_format1(store, spec, builder.vocabulary())
    return store, BuildInfo(str(Path(spec.dir)), (), (), 0, profiled, costed)


def open_or_build_cache(spec: PoolCacheSpec, *, progress: bool = False) -> tuple[PoolCache, BuildInfo]:
    """Open every member's cache of ``spec``, building what is missing first (module docstring).

    Costs are measured once per pool target and machine setting (:func:`~mdboost.cache.speed.speed_path`),
    so another temperature's spec of the same pool reuses them. (Another machine's costs on the
    same caches: :func:`open_cached`.)

    Returns
    -------
    (PoolCache, BuildInfo)
        The opened caches (``acceptance`` set when ``spec.acceptance_source == "sampled"``)
        and what was built.
    """
    spec = spec.keyed()  # every folder keyed once, here (content ids hash the models' bytes)
    names, sets = spec.names, spec.folder_sets()
    counts = {spec.settings(acc).max_new_tokens for acc in sets if spec.settings(acc).sampled}
    to_sample = sorted(n for n in counts if finished_digest(spec.continuations_path(n)) is None)
    maybe = {m for acc in sets for m in names if not folder_complete(spec, m, acc)}
    store = SpeedStore(speed_path(spec), {m: entry_key(spec, m) for m in names if m != spec.target})
    drafters = [m for m in names if m != spec.target]
    needed = (maybe | {m for b in spec.batch_sizes for m in store.missing(drafters, b)}) - {spec.target}  # to load
    builder = _Builder(spec, [m for m in names if m in needed], progress)
    seconds = {}  # the STEPS that run
    if to_sample or maybe:  # the models the steps below run (a first run converts the target here)
        with timed(seconds, "models"):
            builder.pool  # noqa: B018 -- loads it
    if to_sample:
        with timed(seconds, "continuations"):
            for n in to_sample:
                builder.sample(n)
    # a main folder's build never completes an acceptance folder: what to build is known up front
    built = {acc: tuple(m for m in names if not folder_complete(spec, m, acc)) for acc in sets}
    if any(built.values()):
        with timed(seconds, "logit caches"):
            for acc in sets:
                for name in built[acc]:
                    builder.build(name, acc)
    with timed(seconds, "costs"):
        profiled, costed = builder.measure_costs(store, drafters)
    if not (profiled or costed):
        del seconds["costs"]  # every cost was in the speed file: the step did not run
    repaired = []
    with timed(seconds, "opening"):
        acc_pc = (PoolCache(_open_checked(spec, True, builder, repaired), spec.target) if spec.sampled_acceptance
                  else None)
        pc = PoolCache(_open_checked(spec, False, builder, repaired), spec.target, acc_pc, store, spec=spec)
    if acc_pc is not None and acc_pc.vocab_size != pc.vocab_size:
        raise ValueError(f"acceptance caches have vocab_size {acc_pc.vocab_size}, the main caches {pc.vocab_size}")
    if store.pool is None:
        _identify_format1(store, spec, pc.caches[spec.target].manifest["tokenizer_fingerprint"])
    info = BuildInfo(str(Path(spec.dir)), built[False], built.get(True, ()), len(to_sample), profiled, costed,
                     tuple(repaired), seconds)
    return pc, info
