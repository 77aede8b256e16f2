"""What a tiny ranking and its validation leave in the MLflow store, read back with MlflowClient:
the parent runs' descriptions, the table and summary artifacts, the nested runs' names and order,
the dataset inputs and their digests."""

from __future__ import annotations

import json
import math

import pytest

from mdboost.data import TextSource, humaneval_path
from mdboost.ranking.report import read_csv
from mdboost.tracking.datasets import DIGEST_CHARS, FINGERPRINT_TAG, SPLIT_TAG
from mdboost.tracking.runs import KEY_METRICS
from tests.test_validation_pipeline import RANK as VALIDATION_RANK

RANK = {**VALIDATION_RANK, "name": "tracking", "ranking": {"top": 3}}  # the validation e2e's tiny ranking
CELLS, PROMPTS = 3, 2


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Rank, then validate from the ranking's MLflow run id (so the run's artifacts are what validation reads)."""
    from mlflow.tracking import MlflowClient

    from pipelines import rank_pool, validate_pairs
    from pipelines.config import RankConfig
    from pipelines.validate_config import ValidateConfig
    from pipelines.loader import from_dict

    tmp = tmp_path_factory.mktemp("tracking")
    tracking = {"tracking_uri": f"sqlite:///{tmp}/mlflow.db", "artifact_root": str(tmp / "art")}
    rank_cfg = from_dict(RankConfig, {**RANK, "output_dir": str(tmp / "rank"),
                                      "cache": {**RANK["cache"], "dir": str(tmp / "cache")},
                                      "tracking": {**tracking, "experiment": "rank"}})
    ranked = rank_pool.run(rank_cfg)
    val_cfg = from_dict(ValidateConfig, {
        "name": "tracking", "output_dir": str(tmp / "val"),
        "ranking": {"ranking_run_id": ranked["run_id"], "cells": CELLS},
        "generation": {"prompts": PROMPTS, "max_new_tokens": 8}, "humaneval": {"tasks": 0},
        "tracking": {**tracking, "experiment": "validate"}, "progress": False})
    validated = validate_pairs.run(val_cfg)
    return MlflowClient(tracking["tracking_uri"]), tmp, rank_cfg, ranked, validated


def _children(client, run_id):
    """Nested runs of ``run_id`` in MLflow's default order (start time, newest first), as the UI lists them."""
    parent = client.get_run(run_id)
    return client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'", max_results=1000)


def _table(client, run_id, name, tmp_path):
    path = client.download_artifacts(run_id, name, str(tmp_path))
    return json.loads(open(path).read())


def test_ranking_description_holds_the_recommendation_and_the_top_points(store):
    client, tmp, cfg, ranked, _ = store
    note = client.get_run(ranked["run_id"]).data.tags["mlflow.note.content"]
    lines = note.splitlines()
    assert lines[0] == f"**{ranked['verdict']}**"
    assert ranked["engine_snippet"].splitlines()[0] in lines
    summary_line = next(ln for ln in lines if ln.endswith("Nested runs: one per point, best first."))
    assert summary_line.startswith(f"{ranked['n_pairs']} pairs, {ranked['n_points']} operating points")
    table = [ln for ln in lines[lines.index("### Ranking"):] if ln.startswith("| ")]
    names = [r.info.run_name for r in _children(client, ranked["run_id"])]
    assert len(table) == 1 + cfg.ranking.top
    for line, name in zip(table[1:], names):  # the note's points are the first nested runs, same order
        assert line.split(" | ")[1] == name


def test_ranking_table_and_summary_are_artifacts(store, tmp_path):
    client, tmp, _, ranked, _ = store
    csv_rows = read_csv(tmp / "rank" / "ranking.csv")
    table = _table(client, ranked["run_id"], "ranking_table.json", tmp_path)
    assert len(table["data"]) == len(csv_rows) == ranked["n_rows"]
    assert table["columns"] == list(csv_rows[0])
    col = table["columns"].index
    for got, want in zip(table["data"], csv_rows):
        assert got[col("rank")] == int(want["rank"]) and got[col("drafter")] == want["drafter"]
        # pandas' JSON writer keeps 10 decimals (ranking.csv has every digit)
        assert got[col("predicted_speedup")] == pytest.approx(float(want["predicted_speedup"]), rel=0, abs=1e-10)
    logged = json.loads(open(client.download_artifacts(ranked["run_id"], "summary.json", str(tmp_path))).read())
    assert logged == json.loads((tmp / "rank" / "summary.json").read_text())
    assert logged["run_id"] == ranked["run_id"] and logged["recommendation"] == ranked["recommendation"]


def test_ranking_table_reads_back_with_load_table_as_documented(store):
    # docs/ranking.md said mlflow.load_table("ranking_table.json", run_ids=[...]) reads the table
    # back; it searches the active experiment only (Default: "No runs found"): the doc now says so.
    import re
    import subprocess
    import sys
    from pathlib import Path

    client, tmp, cfg, ranked, _ = store
    doc = " ".join((Path(__file__).resolve().parents[1] / "docs" / "ranking.md").read_text().split())
    assert re.search(r"`MlflowClient\(uri\)\.load_table\(experiment_id, \"ranking_table\.json\", run_ids=\[run_id\]\)`", doc)
    assert "searches the active experiment only: after `mlflow.set_experiment(<tracking.experiment>)`" in doc
    uri, run_id = cfg.tracking.tracking_uri, ranked["run_id"]
    experiment_id = client.get_run(run_id).info.experiment_id
    n_rows = len(read_csv(tmp / "rank" / "ranking.csv"))
    script = (f"import mlflow\nfrom mlflow import MlflowClient\n"  # a fresh process: MLflow's active experiment is global
              f"t = MlflowClient({uri!r}).load_table({experiment_id!r}, 'ranking_table.json', run_ids=[{run_id!r}])\n"
              f"mlflow.set_tracking_uri({uri!r}); mlflow.set_experiment({cfg.tracking.experiment!r})\n"
              f"u = mlflow.load_table('ranking_table.json', run_ids=[{run_id!r}])\n"
              f"print(len(t), len(u), list(t.columns) == list(u.columns))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(n_rows), str(n_rows), "True"]


def test_ranking_children_are_named_and_ordered_by_rank(store):
    client, tmp, _, ranked, _ = store
    # rank order; nested runs are the first batch size's points (the default ranks batch sizes 1 and 4)
    points = [r for r in read_csv(tmp / "rank" / "ranking.csv") if r["is_best_gamma"] == "True" and r["batch_size"] == "1"]
    children = _children(client, ranked["run_id"])
    assert len(children) == len(points) == ranked["n_points"]
    for child, row in zip(children, points):
        budget = float(row["max_divergence"])
        point = "SD" if budget == 0 else f"{row['divergence']} {budget:g}"
        name = (f"{row['drafter']} alone" if row["rule"] == "alone" else f"{row['drafter']} {point} g{row['gamma']}")
        assert child.info.run_name == f"{name} T{float(row['temperature']):g}"
        assert child.data.tags["rank"] == row["rank"]
        assert child.data.params["gamma"] == row["gamma"]
        logged = [k for k in KEY_METRICS if math.isfinite(float(row.get(k) or "nan"))]  # MLflow logs no NaN
        assert list(child.data.metrics)[:len(logged)] == logged
    starts = [c.info.start_time for c in children]
    assert all(a > b for a, b in zip(starts, starts[1:]))  # created worst first: newest first reads best first
    assert any(float(r["max_divergence"]) == 0 for r in points) and any(float(r["max_divergence"]) > 0 for r in points)


def test_ranking_dataset_is_the_cached_records_with_the_manifest_fingerprint(store):
    client, tmp, cfg, ranked, _ = store
    inputs = client.get_run(ranked["run_id"]).inputs.dataset_inputs
    assert len(inputs) == 1
    dataset, tags = inputs[0].dataset, {t.key: t.value for t in inputs[0].tags}
    manifest = json.loads((cfg.cache_spec(0.5).member_dir("tiny") / "manifest.json").read_text())
    assert tags[FINGERPRINT_TAG] == manifest["dataset_fingerprint"]
    assert dataset.digest == manifest["dataset_fingerprint"][:DIGEST_CHARS]
    assert dataset.name == "humaneval:cache" and tags[SPLIT_TAG] == "cache"
    assert dataset.source_type == "local" and json.loads(dataset.source)["uri"] == humaneval_path().resolve().as_uri()
    assert tags["mlflow.data.context"] == "ranking"
    assert json.loads(dataset.profile)["num_rows"] == len(manifest["record_ids"]) == RANK["data"]["limit"]
    assert [c["name"] for c in json.loads(dataset.schema)["mlflow_colspec"]] == ["id", "prompt", "reference"]


def test_validation_description_children_table_and_dataset(store, tmp_path):
    import hashlib

    client, tmp, _, ranked, validated = store
    run = client.get_run(validated["run_id"])
    cells = validated["cells"]
    lines = run.data.tags["mlflow.note.content"].splitlines()
    assert lines[0] == f"**{validated['verdict']}**"
    table = [ln for ln in lines if ln.startswith("| ")]
    assert len(table) == 1 + len(cells)
    children = _children(client, validated["run_id"])
    assert [c.data.tags["mdboost.cell"] for c in children] == [str(c["cell"]) for c in cells] == [str(i) for i in range(len(cells))]
    for child, line in zip(children, table[1:]):
        number, name = child.info.run_name.split(": ", 1)
        assert line.split(" | ")[:2] == [f"| {number}", name]
        assert list(child.data.metrics)[0] == "realized_speedup"
    logged = _table(client, validated["run_id"], "validation_table.json", tmp_path)
    with open(tmp / "val" / "validation.csv") as fh:
        header = fh.readline().strip().split(",")
    assert len(logged["data"]) == len(cells) and logged["columns"] == header
    col = header.index
    assert [row[col("realized_speedup")] for row in logged["data"]] == pytest.approx(
        [c["realized_speedup"] for c in cells], rel=0, abs=1e-10)
    (inp,) = run.inputs.dataset_inputs
    held = TextSource(**RANK["data"]).load("heldout", PROMPTS)  # the validation's held-out sample
    payload = json.dumps([[r["id"], r["prompt"], r["reference"]] for r in held], ensure_ascii=False)
    assert inp.dataset.digest == hashlib.sha256(payload.encode()).hexdigest()[:DIGEST_CHARS]
    assert inp.dataset.name == "humaneval:heldout"
    assert {t.key: t.value for t in inp.tags}["mlflow.data.context"] == "validation"
    ranking_digest = client.get_run(ranked["run_id"]).inputs.dataset_inputs[0].dataset.digest
    assert inp.dataset.digest != ranking_digest


def test_validation_from_a_run_id_reads_the_logged_recommendation(store):
    """``summary.json`` is on the ranking run, so validating from the run id starts at its recommendation."""
    _, _, _, ranked, validated = store
    rec, first = ranked["recommendation"], validated["cells"][0]
    assert first["role"] == "recommendation"
    for key in ("drafter", "target", "gamma"):
        assert first[key] == rec[key]
    assert first["max_divergence"] == pytest.approx(rec["max_divergence"])
    assert first["temperature"] == pytest.approx(rec["temperature"])
    assert validated["intervals"]["ranking_prompts"] == ranked["bootstrap"]["prompts"]
