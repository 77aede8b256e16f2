"""Pair scoring on a Dask cluster: one task per ordered pair, gathered in the pairs' order.

:func:`score_cached_pair` is one pair's :func:`~mdboost.ranking.rank.score_pair` from an
opened :class:`~mdboost.cache.pool_cache.PoolCache` (the rows of :func:`~mdboost.ranking.rows.pair_rows`,
:func:`~mdboost.ranking.rows.acceptance_rows` with ``acceptance_source: sampled``, and the
target's :func:`~mdboost.ranking.rows.speed_profile`): the ranking calls it in the driver,
pair after pair, when it has no cluster. :func:`score_pairs_on` runs the same call on a
cluster's workers, one task per pair, each in :func:`score_pair_task`:

- a task gets a :class:`CacheLocation` (the member folders, the acceptance folders, the
  pool's speed file as read by the driver) instead of the opened caches, and opens the
  folders of its pair and of the pool target itself (the workers share the driver's
  filesystem, ``docs/scale_out.md``);
- it scores at one torch thread, the driver's setting (scoring works on small ``[rows, 2k+1]``
  tensors), with the same :class:`~mdboost.ranking.rank.ScoreSettings`, so every figure of a
  :class:`~mdboost.ranking.scores.PairScore` is the one the driver computes;
- the scores come back in the order of ``pairs``, whatever the order the tasks finish in, so
  ``ranking.csv`` is byte-identical to the sequential run's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from mdboost.cache.mentored import load_mentored
from mdboost.cache.pool_cache import PoolCache
from mdboost.cache.reader import LogitCache
from mdboost.cache.scores import WorkStore, folder_names, work_key
from mdboost.cache.speed import SpeedStore
from mdboost.engine.costs import torch_threads
from mdboost.ranking.rank import PairCosts, ScoreSettings, pair_work, price_pair
from mdboost.ranking.mentored import mentored_pair_rows
from mdboost.ranking.rows import MemberLoader, acceptance_rows, pair_rows, pair_side_costs, speed_profile
from mdboost.ranking.scores import PairScore


def score_cached_pair(pc: PoolCache, drafter: str, target: str, settings: ScoreSettings, *,
                      acceptance_source: str | None = None, loader: MemberLoader | None = None,
                      acceptance_loader: MemberLoader | None = None) -> PairScore:
    """One ordered pair's :func:`~mdboost.ranking.rank.score_pair` from an opened pool cache, at
    ``settings.batch_size`` (:func:`score_cached_batches`, whose parameters it takes)."""
    return score_cached_batches(pc, drafter, target, settings, (settings.batch_size,),
                                acceptance_source=acceptance_source, loader=loader,
                                acceptance_loader=acceptance_loader)[settings.batch_size]


def pair_costs(pc: PoolCache, drafter: str, target: str, batch_size: int) -> PairCosts:
    """The pair's costs at ``batch_size`` from the pool's speed file (:func:`~mdboost.ranking.rows.pair_side_costs`
    and the target's :func:`~mdboost.ranking.rows.speed_profile`)."""
    return PairCosts(speed_profile(pc, drafter, target, batch_size), *pair_side_costs(pc, drafter, target, batch_size))


def score_cached_batches(pc: PoolCache, drafter: str, target: str, settings: ScoreSettings, batch_sizes, *,
                         acceptance_source: str | None = None, loader: MemberLoader | None = None,
                         acceptance_loader: MemberLoader | None = None) -> dict:
    """One ordered pair's :func:`~mdboost.ranking.rank.score_pair_batches` from an opened pool cache.

    Parameters
    ----------
    pc : PoolCache
        The pool's caches (``pc.acceptance`` set: the acceptance side is scored on them).
    drafter, target : str
        Members of ``pc``.
    settings : ScoreSettings
        The operating points, gammas, boosting and bootstrap.
    batch_sizes : sequence of int
        The batch sizes to predict for, each with its costs from the pool's speed file.
    acceptance_source : str, optional
        The rows' ``acceptance_source`` column (:func:`~mdboost.ranking.rank.score_pair`).
    loader, acceptance_loader : MemberLoader, optional
        Memoized member rows to share across pairs: ``loader`` on ``pc`` at
        ``settings.quality_temperature``, ``acceptance_loader`` on ``pc.acceptance`` at
        ``settings.temperature`` (default: new ones, each member read once for this pair).

    Returns
    -------
    dict
        ``{batch_size: PairScore}``.

    Notes
    -----
    The pair's cost-free work (:func:`~mdboost.ranking.rank.pair_work`) is read from the cache's
    :class:`~mdboost.cache.scores.WorkStore` when a run with the same folders, settings and code
    kept it (:func:`pair_work_key`), else computed and kept; either way it is priced here with the
    pool's costs (:func:`~mdboost.ranking.rank.price_pair`).
    """
    costs = {b: pair_costs(pc, drafter, target, b) for b in batch_sizes}
    step_law = max(costs) > 1

    def make():
        return _pair_work(pc, drafter, target, settings, acceptance_source, step_law, loader, acceptance_loader)

    store = WorkStore.beside(pc.caches[target].out_dir)
    return price_pair(store.get(pair_work_key(pc, drafter, target, settings, acceptance_source, step_law), make), costs)


def _pair_work(pc: PoolCache, drafter: str, target: str, settings: ScoreSettings, acceptance_source, step_law: bool,
               loader: MemberLoader | None, acceptance_loader: MemberLoader | None):
    loader = MemberLoader(pc, settings.quality_temperature) if loader is None else loader
    acceptance, mentored = None, {}
    if pc.acceptance is not None:
        acc_loader = MemberLoader(pc.acceptance, settings.temperature) if acceptance_loader is None else acceptance_loader
        acceptance = acceptance_rows(acc_loader, pc, drafter, target)
        if target == pc.target:  # the mentored texts were sampled from the pool target
            mentored = {point: mentored_pair_rows(load_mentored(path), acceptance, settings.temperature)
                        for point, path in pc.mentored.get(drafter, {}).items()}
    return pair_work(pair_rows(loader, drafter, target), pc.vocab_size, settings=settings, acceptance=acceptance,
                     acceptance_source=acceptance_source, mentored=mentored,
                     on_reference=None if acceptance is None else target != pc.target, step_law=step_law)


def pair_work_key(pc: PoolCache, drafter: str, target: str, settings: ScoreSettings, acceptance_source,
                  step_law: bool) -> str:
    """The :func:`~mdboost.cache.scores.work_key` of a pair's :func:`~mdboost.ranking.rank.pair_work`:
    the names of the folders its rows come from (the pair's, the pool target's, each side's
    target-sampled folder, the drafter's mentored texts), the settings but their batch size, and
    whether it keeps step laws."""
    mentored = sorted(os.path.basename(os.path.dirname(os.path.abspath(path)))
                      for path in pc.mentored.get(drafter, {}).values()) if target == pc.target else []
    members = (drafter, target, pc.target)
    return work_key("pair", folders=folder_names(pc, members), acceptance=folder_names(pc.acceptance, members),
                    mentored=mentored, settings=repr(replace(settings, batch_size=1)), acceptance_source=acceptance_source,
                    vocab_size=pc.vocab_size, step_law=bool(step_law), pool_target=pc.target,
                    members=[drafter, target])


@dataclass(frozen=True)
class CacheLocation:
    """Where an opened :class:`~mdboost.cache.pool_cache.PoolCache` lives: what a worker opens it from.

    ``folders``: ``(member, folder)`` per member, the pool target first; ``acceptance``: the
    same for the target-sampled folders, or None; ``speed``: the pool's speed file as the
    driver read it (a few numbers, sent along rather than read again). Small and picklable.
    """

    target: str
    folders: tuple[tuple[str, str], ...]
    acceptance: tuple[tuple[str, str], ...] | None = None
    speed: SpeedStore | None = None
    mentored: tuple = ()  # (drafter, ((rule, divergence, budget, rows file), ...)) per prompt-lookup drafter

    @classmethod
    def of(cls, pc: PoolCache) -> CacheLocation:
        """The location of an opened pool cache."""
        if not isinstance(pc, PoolCache):
            raise TypeError(f"pc must be a PoolCache, got {type(pc).__name__}")

        def folders(p: PoolCache) -> tuple[tuple[str, str], ...]:
            return tuple((name, os.path.abspath(cache.out_dir)) for name, cache in p.caches.items())

        # absolute: a worker resolves a relative path against its own working directory
        mentored = tuple((d, tuple((*point, os.path.abspath(path)) for point, path in points.items()))
                         for d, points in pc.mentored.items())
        return cls(pc.target, folders(pc), None if pc.acceptance is None else folders(pc.acceptance), pc.speed,
                   mentored)

    def open(self, members) -> PoolCache:
        """The pool cache of ``members`` and the pool target (which every pair's costs and rows
        refer to), in the pool's order.

        Shards are not hashed again (``LogitCache.open(verify=False)``): the driver verified
        every one when it opened the pool, just before; manifests and layouts are checked, and
        each shard's rows and widths when it is read.
        """
        wanted = set(members) | {self.target}
        unknown = wanted - {name for name, _ in self.folders}
        if unknown:
            raise ValueError(f"members must be members of the pool cache, got {sorted(unknown)!r}")

        def opened(folders) -> dict:
            return {name: LogitCache.open(folder, verify=False) for name, folder in folders if name in wanted}

        acc = None if self.acceptance is None else PoolCache(opened(self.acceptance), self.target)
        mentored = {d: {(r, f, b): path for r, f, b, path in points} for d, points in self.mentored if d in wanted}
        return PoolCache(opened(self.folders), self.target, acc, self.speed, mentored)


def score_pair_task(location: CacheLocation, drafter: str, target: str, settings: ScoreSettings,
                    acceptance_source: str | None = None, threads: int | None = 1, batch_sizes=None) -> dict:
    """One pair's scores on a worker: open the pair's folders from ``location``, then
    :func:`score_cached_batches` at ``threads`` torch threads (``None``: the worker's as is) and
    ``batch_sizes`` (default: ``settings.batch_size``)."""
    with torch_threads(threads):
        pc = location.open((drafter, target))
        return score_cached_batches(pc, drafter, target, settings, batch_sizes or (settings.batch_size,),
                                    acceptance_source=acceptance_source)


def score_pairs_on(client, pc: PoolCache, pairs, settings: ScoreSettings, *, acceptance_source: str | None = None,
                   threads: int | None = 1, progress=None, batch_sizes=None) -> list[dict]:
    """:func:`score_cached_batches` of every pair on ``client``'s workers, one task per pair.

    Parameters
    ----------
    client : distributed.Client
        The cluster (:func:`mdboost.cluster.dask_client`); its workers must see ``pc``'s
        folders at the same paths.
    pc : PoolCache
        The opened pool cache (opened, hence verified, by the driver).
    pairs : list of (drafter, target)
        Ordered pairs of ``pc``'s members (:func:`~mdboost.ranking.rows.select_pairs`).
    settings : ScoreSettings
    acceptance_source : str, optional
        As for :func:`score_cached_pair`.
    threads : int or None, default=1
        torch threads in each task (the driver scores at 1).
    progress : callable, optional
        Wraps the iterable of finished tasks (a progress bar: ``lambda it: tqdm(it, total=...)``).
    batch_sizes : sequence of int, optional
        The batch sizes scored (default: ``settings.batch_size``).

    Returns
    -------
    list of dict
        One ``{batch_size: PairScore}`` per pair, in the order of ``pairs``. A task's error is raised here.
    """
    location = CacheLocation.of(pc)
    pairs = [tuple(p) for p in pairs]
    names = set(pc.names)
    for pair in pairs:
        if len(pair) != 2 or not set(pair) <= names:
            raise ValueError(f"pairs must be (drafter, target) pairs of the cache's members {pc.names!r}, got {pair!r}")
    if not pairs:
        return []
    futures = [client.submit(score_pair_task, location, d, t, settings, acceptance_source, threads,
                             tuple(batch_sizes or (settings.batch_size,)), pure=False) for d, t in pairs]
    if progress is not None:
        from distributed import as_completed  # deferred: distributed is the optional extra mdboost[dask]

        for _ in progress(as_completed(futures)):
            pass
    return client.gather(futures)


def active_client():
    """The default :class:`distributed.Client` of this process (:func:`mdboost.cluster.dask_client`
    sets it for its block), or None: none, or ``distributed`` is not installed."""
    try:
        from distributed import default_client  # deferred: distributed is the optional extra mdboost[dask]
    except ImportError:
        return None
    try:
        return default_client()
    except ValueError:  # "No clients found"
        return None
