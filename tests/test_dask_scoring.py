"""Pair scoring on a Dask cluster: with ``cache.backend: dask`` every pair is a task on the run's
cluster, and the ranking is the sequential one, byte for byte (``ranking.csv``; ``summary.json``
but for its timings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")

from mdboost.cluster import dask_client  # noqa: E402
from mdboost.ranking.scaleout import CacheLocation, active_client, score_pairs_on  # noqa: E402
from pipelines.config import RankConfig  # noqa: E402
from pipelines.loader import from_dict, load_yaml, to_dict  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# summary.json keys that are wall-clock timings of this run (all else must be equal).
TIMINGS = ("seconds_cache", "seconds_scoring", "seconds_per_pair", "seconds_total", "seconds_by_stage")


def _config(tmp: Path, name: str, **cache) -> RankConfig:
    """A tiny pool, every ordered pair (three targets, so tasks open a target that is not the
    pool's), acceptance on sampled continuations, a small bootstrap; one shared cache folder."""
    data = to_dict(load_yaml(ROOT / "configs" / "tiny.yaml", RankConfig))
    data["pool"].update(drafters=["early_exit:2", "int8", "ngram:2"], pairs="all")
    data["data"].update(limit=3, max_tokens=32)
    data["cache"].update(dir=str(tmp / "cache"), cost_repeats=1, cost_context=8, acceptance_source="sampled",
                         acceptance_max_new_tokens=8, **cache)
    data["md"].update(divergences=["kl", "tv"], budgets=[0.0, 0.3], temperatures=[1.0], temperature=None)
    data["speed"].update(gamma_max=3)
    data["ranking"].update(resamples=20)
    data["output_dir"] = str(tmp / name)
    data["tracking"]["enabled"] = False
    return from_dict(RankConfig, data)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The pool's caches, built once (both runs reuse them: same folders, same measured costs)."""
    from mdboost.cache import open_or_build_cache

    tmp = tmp_path_factory.mktemp("dask-scoring")
    cfg = _config(tmp, "build", backend="loky", n_jobs=1)
    pc, _ = open_or_build_cache(cfg.cache_spec())
    return tmp, pc


def test_ranking_on_a_local_cluster_is_byte_identical_to_the_sequential_one(built):
    from pipelines import rank_pool

    tmp, _ = built
    here = rank_pool.run(_config(tmp, "here", backend="loky", n_jobs=1))
    spread = rank_pool.run(_config(tmp, "spread", backend="dask", scheduler="local", n_jobs=2))
    assert here["n_pairs"] == 9 and here["cache_reused"] and spread["cache_reused"]
    csv_here, csv_spread = (tmp / "here" / "ranking.csv").read_bytes(), (tmp / "spread" / "ranking.csv").read_bytes()
    assert csv_here == csv_spread and len(csv_here.splitlines()) == here["n_rows"] + 1
    sums = [json.loads((tmp / d / "summary.json").read_text()) for d in ("here", "spread")]
    assert all(set(TIMINGS) <= set(s) for s in sums)
    assert [{k: v for k, v in s.items() if k not in TIMINGS} for s in sums][0] == \
        {k: v for k, v in sums[1].items() if k not in TIMINGS}


def test_with_the_runs_client_every_pair_is_a_task_on_a_worker(built):
    from pipelines import rank_pool
    from mdboost.ranking.rows import select_pairs

    tmp, pc = built
    cfg = _config(tmp, "tasks", backend="dask", scheduler="local", n_jobs=2)
    pairs = select_pairs(pc, "all")
    assert active_client() is None
    with dask_client("local", 2) as client, distributed.get_task_stream(client) as stream:
        assert active_client() is client
        rows, details = rank_pool.score_all(cfg, pc, 1.0)
        workers = set(client.scheduler_info()["workers"])
    tasks = [t for t in stream.data if str(t["key"]).startswith("score_pair_task")]
    assert len(tasks) == len(pairs) == 9 and {t["worker"] for t in tasks} <= workers and len(workers) == 2
    assert [(s.drafter, s.target) for s in details.values()] == pairs  # the pairs' order
    seq_rows, _ = rank_pool.score_all(_config(tmp, "tasks", backend="loky", n_jobs=1), pc, 1.0)
    assert json.dumps(rows, default=str) == json.dumps(seq_rows, default=str)  # every figure, NaNs included


def test_a_tasks_bad_input_is_raised_in_the_driver(built):
    _, pc = built
    location = CacheLocation.of(pc)
    assert location.target == "tiny" and [n for n, _ in location.folders] == pc.names
    assert location.acceptance is not None and location.open(["int8"]).names == ["tiny", "int8"]
    with pytest.raises(ValueError, match=r"members must be members of the pool cache, got \['nope'\]"):
        location.open(["nope"])
    with pytest.raises(TypeError, match="pc must be a PoolCache, got dict"):
        CacheLocation.of({})
    settings = _config(Path("."), "x").score_settings()
    with pytest.raises(ValueError, match=r"pairs must be \(drafter, target\) pairs .*got \('int8', 'nope'\)"):
        score_pairs_on(None, pc, [("int8", "nope")], settings)


def test_a_relative_cache_dir_reaches_workers_with_another_working_directory(built, monkeypatch, tmp_path):
    # cache.dir is relative by default (.mdboost_cache/logits): the location sent to the workers
    # held it as is, so a worker started elsewhere (`dask worker` in its own directory) found
    # "holds no manifest.json: not a logit cache" and the ranking failed after the build.
    import os

    from mdboost.cache import open_or_build_cache

    tmp, _ = built
    monkeypatch.chdir(tmp)
    cfg = _config(tmp, "relative", backend="loky", n_jobs=1)
    cfg.cache.dir = "cache"  # the fixture's folders, named relative to the working directory
    pc, reused = open_or_build_cache(cfg.cache_spec())
    assert reused and not os.path.isabs(str(next(iter(pc.caches.values())).out_dir))
    location = CacheLocation.of(pc)
    paths = [p for _, p in location.folders + location.acceptance] + \
        [p for _, points in location.mentored for *_, p in points]
    assert paths and all(os.path.isabs(p) for p in paths)
    monkeypatch.chdir(tmp_path)  # a worker's working directory
    opened = location.open(["int8"])
    assert opened.names == ["tiny", "int8"] and opened.acceptance is not None
