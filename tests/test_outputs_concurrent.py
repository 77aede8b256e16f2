"""Runs on one output folder, with real processes: two ``mdboost rank`` at once (tracking off, then
on with a fresh sqlite store) leave one run's consistent outputs, and a run killed while it
writes leaves the previous run's outputs untouched (docs/ranking.md, "Outputs")."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mdboost._io import output_folder
from mdboost.ranking.report import read_csv
from pipelines.rank_pool import OUTPUT_FILES

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--set", "md.divergences=[kl]", "--set", "ranking.frontier_rows=0", "--set", "ranking.resamples=20",
         "--set", "pool.drafters=[early_exit:2, ngram:2]", "--set", "data.limit=2", "--set", "cache.cost_repeats=1"]


def _rank_argv(tmp: Path, out: Path, budgets: str, tracking: str | None = None) -> list[str]:
    track = (["--set", "tracking.enabled=false"] if tracking is None else
             ["--set", f"tracking.tracking_uri={tracking}", "--set", f"tracking.artifact_root={tmp / 'art'}"])
    return [sys.executable, "-m", "mdboost.cli", "rank", "--config", str(REPO / "configs" / "tiny.yaml"),
            "--set", f"output_dir={out}", "--set", f"cache.dir={tmp / 'cache'}", "--set", f"md.budgets={budgets}",
            *SMALL, *track]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO))


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    """The small tiny pool's cache built once, and a first ranking in ``rank``."""
    tmp = tmp_path_factory.mktemp("outputs")
    done = subprocess.run(_rank_argv(tmp, tmp / "rank", "[0,0.1]"), env=_env(), cwd=tmp, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return tmp


def assert_one_runs_outputs(out: Path, budgets_of_runs: list[set[float]]) -> None:
    """``out`` holds one run's outputs: every file of a ranking, summary.json's digest is
    ranking.csv's, its recommendation a row of it, and ranking.csv's budgets those of the config
    written beside it (one of the runs'); no temporary folder is left beside it."""
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUT_FILES[:4] + ("plots", "summary.json"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranking_csv_sha256"] == hashlib.sha256((out / "ranking.csv").read_bytes()).hexdigest()
    rows = read_csv(out / "ranking.csv")
    budgets = {float(r["max_divergence"]) for r in rows if r["rule"] != "alone"}  # the drafter alone: its TV
    config = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert budgets == set(config["md"]["budgets"]) and budgets in budgets_of_runs
    rec = summary["recommendation"]
    assert any((r["drafter"], float(r["max_divergence"]), int(r["gamma"]), float(r["predicted_speedup"]))
               == (rec["drafter"], rec["max_divergence"], rec["gamma"], rec["predicted_speedup"]) for r in rows)
    left = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.") and not p.name.endswith(".lock")]
    assert left == []
    export = subprocess.run([sys.executable, "-m", "mdboost.cli", "export", "--ranking", str(out)], env=_env(),
                            capture_output=True, text=True)
    assert export.returncode == 0, export.stderr


def _two_at_once(cached: Path, out: Path, tracking: str | None = None) -> list[subprocess.CompletedProcess]:
    procs = [subprocess.Popen(_rank_argv(cached, out, budgets, tracking), env=_env(), cwd=cached,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for budgets in ("[0,0.1]", "[0,0.5]")]
    return [subprocess.CompletedProcess(p.args, p.wait(), *p.communicate()) for p in procs]


def test_two_ranks_at_once_leave_one_runs_outputs(cached):
    """Both finish (exit 0); the folder, which held a ranking before, is one of theirs whole."""
    runs = _two_at_once(cached, cached / "rank")
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    assert_one_runs_outputs(cached / "rank", [{0.0, 0.1}, {0.0, 0.5}])


@pytest.mark.slow
def test_two_tracked_ranks_at_once_on_a_fresh_store(cached):
    """Tracking on, a sqlite store neither has seen: both create it without colliding (was:
    sqlite3.OperationalError duplicate column name), each logs its own parent run."""
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{cached / 'fresh' / 'mlflow.db'}"
    runs = _two_at_once(cached, cached / "tracked", store)
    assert [r.returncode for r in runs] == [0, 0], [r.stderr[-2000:] for r in runs]
    assert not any("Traceback" in r.stderr for r in runs)
    assert_one_runs_outputs(cached / "tracked", [{0.0, 0.1}, {0.0, 0.5}])
    experiment = MlflowClient(store).get_experiment_by_name("mdboost-rank-tiny")
    parents = MlflowClient(store).search_runs([experiment.experiment_id], "tags.`mdboost.pipeline` = 'rank_pool'")
    assert len(parents) == 2
    summary = json.loads((cached / "tracked" / "summary.json").read_text())
    assert summary["run_id"] in {r.info.run_id for r in parents}


def test_a_rank_killed_while_writing_leaves_the_old_outputs(cached):
    """SIGKILL after ranking.csv is written into the run's folder (a test hook: its HTML writer
    kills the process): the output folder is the previous run's, byte for byte; the killed run's
    folder is removed by the next run on that folder."""
    out = cached / "rank"
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    hook = ("import os, signal, sys\n"
            "import pipelines.rank_pool as rank_pool\n"
            "def killed(rows, path, **kwargs):\n"
            "    assert (path.parent / 'ranking.csv').is_file()\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "rank_pool.report.write_html = killed\n"
            "from mdboost import cli\n"
            "sys.exit(cli.main(sys.argv[1:]))\n")
    argv = _rank_argv(cached, out, "[0,0.5]")
    done = subprocess.run([sys.executable, "-c", hook, *argv[3:]], env=_env(), cwd=cached, capture_output=True,
                          text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    stale = [p for p in cached.iterdir() if p.name.startswith(".rank.tmp-")]
    assert len(stale) == 1 and (stale[0] / "ranking.csv").is_file()
    with output_folder(out, OUTPUT_FILES) as tmp:  # the next run on the folder (what rank and validate call)
        (tmp / "summary.json").write_text("{}")
    assert not stale[0].exists() and sorted(p.name for p in out.iterdir()) == ["summary.json"]


def test_the_digest_is_of_the_bytes_written_not_of_the_file_on_disk(cached, monkeypatch):
    """ranking_csv_sha256 is the digest of the bytes the run wrote: another writer changing
    ranking.csv afterwards does not change it (it is never read back), and readers refuse the pair."""
    import mdboost.ranking.report as report
    from mdboost.export import load_ranking
    from pipelines import rank_pool
    from pipelines.config import RankConfig
    from pipelines.loader import load_yaml

    argv = _rank_argv(cached, cached / "digest", "[0,0.1]")
    overrides = argv[argv.index("--set"):][1::2]
    real = rank_pool.atomic_write_bytes

    def then_changed(path, data):
        written = real(path, data)
        with open(path, "ab") as fh:  # another writer, right after this run's write
            fh.write(b"another,row\n")
        return written

    monkeypatch.setattr(rank_pool, "atomic_write_bytes", then_changed)
    monkeypatch.setattr(report, "csv_sha256", lambda path: pytest.fail("ranking.csv read back"))
    summary = rank_pool.run(load_yaml(str(REPO / "configs" / "tiny.yaml"), RankConfig, overrides))
    monkeypatch.undo()
    assert summary["ranking_csv_sha256"] == hashlib.sha256(report.csv_bytes(summary["all_rows"])).hexdigest()
    on_disk = (cached / "digest" / "ranking.csv").read_bytes()
    assert hashlib.sha256(on_disk).hexdigest() != summary["ranking_csv_sha256"]
    with pytest.raises(ValueError, match="ranking.csv is not the one its summary.json was written with"):
        load_ranking(str(cached / "digest"))
