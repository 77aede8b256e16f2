"""The tiny pipeline through the command line: ``--set`` overrides reach the outputs and the
resolved config, ``MLFLOW_TRACKING_URI`` is the store when the config sets none (and is printed),
``mdboost validate`` shows a bar over generations with tokens/s, and ``progress: false``
silences the libraries' bars and MLflow's store INFO lines."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mdboost import cli
from mdboost.ranking.report import read_csv

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ranked(tmp_path_factory):
    """``mdboost rank`` on configs/tiny.yaml (no tracking_uri in it) with overrides, the store from the env."""
    tmp = tmp_path_factory.mktemp("cli-rank")
    store = f"sqlite:///{tmp}/env.db"
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = store
    try:
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli.main(["rank", "--config", str(REPO / "configs/tiny.yaml"), "--set", f"output_dir={tmp}/rank",
                             "--set", f"cache.dir={tmp}/cache", "--set", "md.budgets=[0,0.1]",
                             "--set", "md.divergences=[kl]", "--set", f"tracking.artifact_root={tmp}/art",
                             "--set", "ranking.resamples=20"])
    finally:
        if old is None:
            os.environ.pop("MLFLOW_TRACKING_URI")
        else:
            os.environ["MLFLOW_TRACKING_URI"] = old
    assert code == 0
    return tmp, store, out.getvalue()


def test_overrides_reach_the_ranking_and_its_resolved_config(ranked):
    tmp, store, _ = ranked
    rows = read_csv(tmp / "rank" / "ranking.csv")
    assert {float(r["max_divergence"]) for r in rows if r["rule"] != "alone"} == {0.0, 0.1}
    assert {r["divergence"] for r in rows if float(r["max_divergence"]) > 0 and r["rule"] != "alone"} == {"kl"}
    resolved = yaml.safe_load((tmp / "rank" / "config.resolved.yaml").read_text())
    assert resolved["md"]["budgets"] == [0.0, 0.1] and resolved["output_dir"] == f"{tmp}/rank"
    assert resolved["tracking"]["tracking_uri"] == store  # the env's store, resolved and saved


def test_the_run_went_to_the_env_store_and_the_store_is_printed(ranked):
    from mlflow.tracking import MlflowClient

    tmp, store, out = ranked
    line = next(x for x in out.splitlines() if "mlflow run:" in x)
    run_id = line.split("mlflow run: ")[1].split()[0]
    assert line.endswith(f"mlflow run: {run_id} in {store}")
    assert MlflowClient(store).get_run(run_id).info.run_name == "rank:tiny"


def test_an_explicit_tracking_uri_beats_the_env(monkeypatch, tmp_path):
    from pipelines.config import TrackingConfig

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///env.db")
    assert TrackingConfig().tracking_uri == "sqlite:///env.db"
    assert TrackingConfig(tracking_uri="sqlite:///mine.db").tracking_uri == "sqlite:///mine.db"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert TrackingConfig().tracking_uri == "sqlite:///mlruns/mlflow.db"


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_shipped_configs_leave_the_store_to_the_env(name):
    tracking = yaml.safe_load((REPO / "configs" / name).read_text()).get("tracking") or {}
    assert "tracking_uri" not in tracking  # else MLFLOW_TRACKING_URI could never apply


def test_validate_shows_a_bar_over_generations_with_tokens_per_second(ranked, monkeypatch, capsys):
    tmp, _, _ = ranked
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    code = cli.main(["validate", "--config", str(REPO / "configs/validate_tiny.yaml"),
                     "--set", f"ranking.ranking_dir={tmp}/rank", "--set", f"output_dir={tmp}/validate",
                     "--set", "progress=true", "--set", "humaneval.tasks=0", "--set", "tracking.enabled=false",
                     "--set", "ranking.cells=2"])
    assert code == 0
    err = capsys.readouterr().err
    summary = yaml.safe_load((tmp / "validate" / "summary.json").read_text())
    cells, prompts = summary["cells"], summary["generation"]["prompts"]
    groups = {}
    for c in cells:  # one AR run per (target, temperature, batch size), on batches of batch_size prompts
        groups.setdefault((c["target"], c["temperature"], c["batch_size"]), []).append(c)
    assert {b for _, _, b in groups} == {1, 4}
    passes = summary["generation"]["passes"]  # the whole interleaved sequence, once per pass
    total = passes * sum(-(-prompts // b) * (len(members) + 1) for (_, _, b), members in groups.items())
    assert "validation runs" in err and f"{total}/{total}" in err and "tok/s" in err, err[-2000:]


_NOISE = """
import sys, torch
torch.set_num_threads(1)
folder, quiet = sys.argv[1], sys.argv[2] == "1"
if quiet:
    from pipelines.noise import quiet_libraries
    quiet_libraries()
from mdboost.models.loading import load_model
from mdboost.tracking.store import setup
load_model(folder, device="cpu")
setup("noise", f"sqlite:///{folder}/new.db", f"{folder}/art")
"""


@pytest.mark.parametrize("quiet", [False, True])
def test_progress_false_silences_weight_bars_and_store_creation(tmp_path, quiet):
    from mdboost.models.tiny import tiny_llama, tiny_tokenizer

    tiny_llama().save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", _NOISE, str(tmp_path), "1" if quiet else "0"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    noise = ["Loading weights", "Creating initial MLflow database tables", "Updating database tables"]
    shown = [n for n in noise if n in done.stderr + done.stdout]
    assert shown == ([] if quiet else noise), done.stderr[-2000:]


_READ_NOISE = """
import json, sys
folder, quiet = sys.argv[1], sys.argv[2] == "1"
if quiet:
    from pipelines.noise import quiet_libraries
    quiet_libraries()
import mlflow
from mdboost.data import load_texts
data = f"{folder}/prompts.jsonl"
with open(data, "w") as fh:
    fh.write(json.dumps({"id": "a", "prompt": "x", "reference": "y"}) + "\\n")
load_texts(data, "all", 1)
mlflow.set_tracking_uri(f"sqlite:///{folder}/store.db")
with mlflow.start_run() as run:
    mlflow.log_artifact(data)
mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="prompts.jsonl", dst_path=f"{folder}/dl")
"""


@pytest.mark.parametrize("quiet", [False, True])
def test_progress_false_silences_data_and_artifact_download_bars(tmp_path, quiet):
    """What `mdboost validate` reads (a local data file, a ranking run's artifacts) drew datasets' and
    MLflow's bars with progress: false."""
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE" and not k.startswith("MLFLOW_")}
    env.update(PYTHONPATH=str(REPO), HF_DATASETS_CACHE=str(tmp_path / "datasets"))
    done = subprocess.run([sys.executable, "-c", _READ_NOISE, str(tmp_path), "1" if quiet else "0"], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    noise = ["Generating train split", "Downloading artifacts"]
    shown = [n for n in noise if n in done.stderr + done.stdout]
    assert shown == ([] if quiet else noise), done.stderr[-2000:]


def test_rank_rebuilds_a_damaged_cache_shard_and_ranks_the_same(ranked, capsys):
    """A shard of a finished member folder damaged after the run: the next ``mdboost rank`` on that
    cache says in one line that it rebuilt the member's damaged files, records it in
    ``summary.json``, and ranks exactly as before (the same ``ranking.csv``)."""
    import json

    tmp, _, _ = ranked
    shard = next(p for p in sorted((tmp / "cache").rglob("early_exit_2-*.safetensors")))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    code = cli.main(["rank", "--config", str(REPO / "configs/tiny.yaml"), "--set", f"output_dir={tmp}/rank-again",
                     "--set", f"cache.dir={tmp}/cache", "--set", "md.budgets=[0,0.1]", "--set", "md.divergences=[kl]",
                     "--set", "tracking.enabled=false", "--set", "ranking.resamples=20"])
    assert code == 0
    err = capsys.readouterr().err
    assert "mdboost rank: cache: damaged files of early_exit:2 were rebuilt (the intact ones kept)" in err
    summary = json.loads((tmp / "rank-again" / "summary.json").read_text())
    assert summary["cache_repaired"] == ["early_exit:2"] and not summary["cache_reused"]
    assert (tmp / "rank-again" / "ranking.csv").read_bytes() == (tmp / "rank" / "ranking.csv").read_bytes()
