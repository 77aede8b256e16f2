"""Scale-out from the config: ``cache.backend: dask`` with ``cache.scheduler: local`` builds, from
the command line, the same cache as loky; validation cells on a cluster give the same
non-timing figures as without; bad scheduler values are config errors; the cluster closes."""

from __future__ import annotations

import hashlib
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

distributed = pytest.importorskip("distributed")

from mdboost.cache.scores import FOLDER  # noqa: E402
from mdboost.cluster import dask_client  # noqa: E402
from pipelines.config import RankConfig  # noqa: E402
from pipelines.validate_config import ValidateConfig  # noqa: E402
from pipelines.loader import from_dict, load_yaml, to_dict  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Figures of a validated cell that are not timings: equal with and without a cluster.
NON_TIMING = ("realized_acceptance", "expected_acceptance", "realized_mean_accepted_length",
              "acceptance_rate_all_positions", "realized_divergence", "max_realized_divergence", "num_new_tokens",
              "num_budget_accepted", "nll_target_outputs", "nll_target_ar_outputs",
              "model_speedup_at_realized_acceptance")


def _rank_config(tmp: Path, name: str, **cache) -> dict:
    data = to_dict(load_yaml(ROOT / "configs" / "tiny.yaml", RankConfig))
    data["pool"]["drafters"] = ["early_exit:2", "int8", "ngram:2"]
    data["data"].update(limit=3, max_tokens=32)
    data["cache"].update(dir=str(tmp / name / "cache"), cost_repeats=1, cost_context=8, shard_size=1, **cache)
    data["md"].update(divergences=["kl"], budgets=[0.0, 0.3], temperatures=[1.0], temperature=None)
    data["speed"].update(gamma_max=3)
    data["ranking"].update(resamples=0)
    data["output_dir"] = str(tmp / name / "rank")
    data["tracking"]["enabled"] = False
    return data


def _files(cache_dir: Path) -> dict[str, str]:
    """SHA-256 of every file of every member folder (the speed file holds timings, the kept scoring
    work is no member folder: both left out)."""
    return {str(p.relative_to(cache_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(cache_dir.glob("*/*")) if p.is_file() and not p.name.startswith(".")
            and p.parent.name != FOLDER}


@pytest.fixture(scope="module")
def dask_rank(tmp_path_factory):
    """``mdboost rank`` from the command line on a two-worker local cluster."""
    tmp = tmp_path_factory.mktemp("dask")
    data = _rank_config(tmp, "dask", backend="dask", scheduler="local", n_jobs=2)
    (tmp / "dask.yaml").write_text(yaml.safe_dump(data))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "mdboost.cli", "rank", "--config", str(tmp / "dask.yaml")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp, data


def test_rank_cli_on_a_local_cluster_builds_the_loky_cache(dask_rank):
    from mdboost.cache import open_or_build_cache

    tmp, _ = dask_rank
    loky = from_dict(RankConfig, _rank_config(tmp, "loky", backend="loky", n_jobs=2))
    open_or_build_cache(loky.cache_spec())
    dask_files, loky_files = _files(tmp / "dask" / "cache"), _files(tmp / "loky" / "cache")
    folders = {Path(f).parts[0] for f in loky_files}
    assert len(folders) == 4 and {Path(f).parts[0] for f in dask_files} == folders  # same folder names
    assert sum(f.endswith(".safetensors") for f in loky_files) == 4 * (1 + 3)  # tokens + one shard per record
    assert dask_files == loky_files  # every shard and manifest byte-identical


def test_validation_cells_on_a_local_cluster_match_the_sequential_figures(dask_rank):
    from pipelines import validate_pairs

    tmp, _ = dask_rank
    base = {"ranking": {"ranking_dir": str(tmp / "dask" / "rank"), "cells": 2},
            "generation": {"prompts": 2, "max_new_tokens": 8}, "humaneval": {"tasks": 0},
            "tracking": {"enabled": False}, "progress": False}
    here = validate_pairs.run(from_dict(ValidateConfig, {**base, "output_dir": str(tmp / "val-here")}))
    cluster_cfg = {**base, "output_dir": str(tmp / "val-cluster"),
                   "generation": {**base["generation"], "scheduler": "local", "n_workers": 2}}
    spread = validate_pairs.run(from_dict(ValidateConfig, cluster_cfg))
    assert spread["generation"]["scheduler"] == "local" and here["generation"]["scheduler"] is None
    # at each of the ranking's batch sizes (1 and 4) the recommendation and 2 more
    assert len(here["cells"]) == len(spread["cells"]) == 6
    for a, b in zip(here["cells"], spread["cells"]):
        assert (a["drafter"], a["gamma"], a["max_divergence"]) == (b["drafter"], b["gamma"], b["max_divergence"])
        for key in NON_TIMING:
            assert a[key] == b[key] or (math.isnan(a[key]) and math.isnan(b[key])), key
        # timings are the worker's own: the ratio as measured, and the figure at equal work
        assert b["tokens_per_second_ratio"] == pytest.approx(b["tokens_per_second"] / b["ar_tokens_per_second"])
        assert math.isfinite(b["realized_speedup"]) and b["realized_speedup"] > 0


@pytest.mark.parametrize("cache, message", [
    ({"backend": "dask", "scheduler": "tcp://10.0.0.5", "n_jobs": 2}, "cache.scheduler .*'tcp://10.0.0.5'"),
    ({"backend": "dask", "scheduler": "cluster-please", "n_jobs": 2}, "cache.scheduler .*'cluster-please'"),
    ({"backend": "loky", "scheduler": "local", "n_jobs": 2}, "cache.scheduler .*backend 'loky'.*'local'"),
    ({"backend": "dask", "scheduler": "local", "n_jobs": 1}, r"cache.n_jobs .*: 1 \(--debug shows the traceback\)$"),
])
def test_bad_scheduler_settings_are_one_line_config_errors(tmp_path, capsys, cache, message):
    from mdboost.cli import main

    data = _rank_config(tmp_path, "bad", **cache)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    assert main(["rank", "--config", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'cache'" in err
    assert re.search(message, err), err
    assert not (tmp_path / "bad").exists()  # nothing built


def test_generation_scheduler_is_checked_like_the_cache_one():
    with pytest.raises(ValueError, match="generation.scheduler .*'tcp://host:99999'"):
        from_dict(ValidateConfig, {"ranking": {"ranking_dir": "x"}, "generation": {"scheduler": "tcp://host:99999"}})
    cfg = from_dict(ValidateConfig, {"ranking": {"ranking_dir": "x"}, "generation": {"scheduler": "host:8786"}})
    assert cfg.generation.scheduler == "host:8786"


@pytest.mark.parametrize("scheduler", [None, "host:8786"])
def test_generation_n_workers_without_a_local_cluster_is_refused_not_ignored(scheduler):
    # n_workers sizes a local cluster only: without one (the cells run here, or an address's
    # cluster has its own workers) the value used to be dropped silently
    generation = {"n_workers": 4} if scheduler is None else {"n_workers": 4, "scheduler": scheduler}
    with pytest.raises(ValueError, match=f"generation.n_workers .*scheduler: local, got scheduler {scheduler!r}.*4"):
        from_dict(ValidateConfig, {"ranking": {"ranking_dir": "x"}, "generation": generation})


def test_generation_n_workers_sizes_the_local_cluster(monkeypatch):
    from pipelines import validate_config

    seen = []
    monkeypatch.setattr(validate_config, "_cluster", lambda scheduler, n: seen.append((scheduler, n)))
    for generation in ({"scheduler": "local"}, {"scheduler": "local", "n_workers": 3}, {}):
        from_dict(ValidateConfig, {"ranking": {"ranking_dir": "x"}, "generation": generation}).generation.cluster()
    assert seen == [("local", validate_config.LOCAL_WORKERS), ("local", 3), (None, validate_config.LOCAL_WORKERS)]
    with pytest.raises(ValueError, match="generation.n_workers .*>= 1"):
        from_dict(ValidateConfig, {"ranking": {"ranking_dir": "x"}, "generation": {"scheduler": "local", "n_workers": 0}})


def test_an_address_without_a_scheduler_is_an_oserror_naming_it():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    with pytest.raises(OSError, match=f"scheduler '{address}': no Dask scheduler answered within 1 s"):
        with dask_client(address, timeout=1):
            pass


@pytest.fixture
def not_a_scheduler():
    """A TCP server that is not a Dask scheduler: ``reply`` bytes (None: nothing) to each connection, held open."""
    import threading

    servers, held = [], []

    def start(reply: bytes | None) -> str:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        servers.append(server)

        def serve():
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:  # closed at teardown
                    return
                held.append(conn)
                if reply is not None:
                    conn.sendall(reply)

        threading.Thread(target=serve, daemon=True).start()
        return f"tcp://127.0.0.1:{server.getsockname()[1]}"

    yield start
    for sock in servers + held:
        sock.close()


@pytest.mark.parametrize("reply", [None, b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"],
                         ids=["silent", "http"])
def test_an_address_where_something_else_answers_is_an_oserror_within_the_timeout(not_a_scheduler, reply):
    # distributed's handshake read has no deadline: a silent service hung the Client for ever,
    # an HTTP one's "HTTP/1.1" was read as a 3.5e18-byte frame (MemoryError, a traceback).
    import time

    address = not_a_scheduler(reply)
    start = time.monotonic()
    with pytest.raises(OSError, match=f"scheduler '{address}': no Dask scheduler answered within 1 s"):
        with dask_client(address, timeout=1):
            pass
    assert time.monotonic() - start < 10


def test_an_address_of_a_running_scheduler_connects():
    with distributed.LocalCluster(n_workers=0, processes=False, protocol="tcp://", dashboard_address=None) as cluster:
        with dask_client(cluster.scheduler_address, timeout=5) as client:
            assert distributed.get_client() is client and client.status == "running"


def test_an_in_process_scheduler_address_connects():
    """``inproc://`` is among the protocols check_scheduler names; an in-process cluster's address
    (``inproc://<ip>/<pid>/<n>``, no port) was refused as not an address."""
    from mdboost.cluster import check_scheduler

    with distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster:
        assert cluster.scheduler_address.startswith("inproc://")
        assert check_scheduler(cluster.scheduler_address) == cluster.scheduler_address
        with dask_client(cluster.scheduler_address, timeout=5) as client:
            assert client.submit(abs, -3).result() == 3
    for bad in ("inproc://", "inproc://host", "inproc://host/12"):
        with pytest.raises(ValueError, match="scheduler must be 'local' or a scheduler address"):
            check_scheduler(bad)


def test_the_python_example_runs_as_a_script(tmp_path):
    # docs/scale_out.md's example had no __main__ guard: saved as a script, the local cluster's
    # spawned workers re-ran it on import and none started ("Nanny failed to start").
    doc = (ROOT / "docs" / "scale_out.md").read_text()
    block = re.search(r"From Python.*?```python\n(.*?)```", doc, re.S).group(1)
    guard = 'if __name__ == "__main__":\n'
    assert guard in block
    prelude = ("    from mdboost.models.pool import build_pool\n"
               "    pool = build_pool('tiny', ['ngram:2'], device='cpu')\n"
               "    records = [{'id': str(i), 'prompt': f'def f{i}():', 'reference': f' return {i}'} for i in range(2)]\n")
    script = (block.replace(guard, guard + prelude).replace("n_workers=4", "n_workers=2")
              .replace("n_jobs=4", "n_jobs=2").replace('"cache/x"', repr(str(tmp_path / "x"))))
    (tmp_path / "example.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(tmp_path / "example.py")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "x").is_dir() and any((tmp_path / "x").iterdir())


def test_a_local_cluster_is_the_default_client_and_closes_on_error():
    with pytest.raises(RuntimeError, match="boom"):
        with dask_client("local", 1) as client:
            assert distributed.get_client() is client
            assert len(client.scheduler_info()["workers"]) == 1
            assert client.submit(os.getpid).result() != os.getpid()  # a worker process
            cluster = client.cluster
            raise RuntimeError("boom")
    assert client.status == "closed" and cluster.status.name == "closed"
    with pytest.raises(ValueError):
        distributed.get_client()


def test_build_cache_with_dask_and_no_client_says_what_to_do(tmp_path):
    from mdboost.cache import build_cache
    from mdboost.cache.settings import RunOptions
    from mdboost.models.pool import build_pool

    pool = build_pool("tiny", ["ngram:2"], device="cpu")
    records = [{"id": "a", "prompt": "def f():", "reference": " return 1"}]
    with pytest.raises(ValueError, match="backend 'dask' needs a running distributed.Client"):
        build_cache(pool, records, tmp_path / "c", run=RunOptions(backend="dask", n_jobs=2))
    assert not (tmp_path / "c").exists()
