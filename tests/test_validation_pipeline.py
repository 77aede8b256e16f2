"""Tiny pool end to end: rank, then validate its cells; files, table, verdict, MLflow links."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import yaml

RANK = {
    "name": "tiny-e2e", "pool": {"target": "tiny", "drafters": ["int8", "ngram:2"], "pairs": "target", "device": "cpu"},
    "data": {"source": "humaneval", "split": "cache", "limit": 2, "max_tokens": 32},
    "cache": {"k": 16, "full_logits": True, "shard_size": 2, "cost_repeats": 1, "cost_context": 8},
    "md": {"divergences": ["kl"], "budgets": [0.0, 0.2], "temperatures": [0.5, 1.0],
           "rules": [{"rule": "mentored", "drafting": "sampled"}]},  # what the validation decodes with
    "speed": {"gamma_min": 1, "gamma_max": 3}, "boosting": {"n_estimators": 2, "orders": ["target_first"]},
    "progress": False,
}
CELLS = 3


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    from pipelines import rank_pool, validate_pairs

    tmp = tmp_path_factory.mktemp("e2e")
    tracking = {"tracking_uri": f"sqlite:///{tmp}/mlflow.db", "artifact_root": str(tmp / "art")}
    rank = {**RANK, "output_dir": str(tmp / "rank"), "cache": {**RANK["cache"], "dir": str(tmp / "cache")},
            "tracking": {**tracking, "experiment": "rank-e2e"}}
    (tmp / "rank.yaml").write_text(yaml.safe_dump(rank))
    assert rank_pool.main(str(tmp / "rank.yaml")) == 0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking["tracking_uri"])
    rank_exp = client.get_experiment_by_name("rank-e2e").experiment_id
    rank_parent = client.search_runs([rank_exp], "tags.`mdboost.pipeline` = 'rank_pool'")[0].info.run_id
    val = {"name": "e2e", "output_dir": str(tmp / "val"), "ranking": {"ranking_run_id": rank_parent, "cells": CELLS},
           "generation": {"prompts": 2, "max_new_tokens": 8}, "humaneval": {"tasks": 1, "max_new_tokens": 8},
           "tracking": {**tracking, "experiment": "val-e2e"}, "progress": False}
    (tmp / "val.yaml").write_text(yaml.safe_dump(val))
    return client, rank_parent, tmp, val


@pytest.fixture(scope="module")
def ran(validated):
    from pipelines import validate_pairs

    client, rank_parent, tmp, _ = validated
    assert validate_pairs.main(str(tmp / "val.yaml")) == 0
    return client, rank_parent, tmp


def test_files_next_to_the_plot(ran):
    _, _, tmp = ran
    out = tmp / "val"
    assert {"validation.csv", "summary.json", "predicted_vs_realized.png"} <= {p.name for p in out.iterdir()}
    with open(out / "validation.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    summary = json.loads((out / "summary.json").read_text())
    assert len(rows) == len(summary["cells"]) >= 2 and rows[0]["role"] == "recommendation"
    # the cells ran at the ranking's temperatures, both of them
    assert {float(r["temperature"]) for r in rows} == {0.5, 1.0}
    assert summary["sampling"] == {"temperatures": [0.5, 1.0], "top_k": None, "top_p": None}
    assert {r["md_solve"] for r in rows} == {"needed"}  # the ranking's (the engine default)
    assert {float(r["max_divergence"]) > 0 for r in rows} == {True, False}
    # the tiny ranking predicts batch sizes 1 and 4: the verdict's figures are batch size 1's
    assert summary["verdict"].startswith(("B=1: intervals cover", "B=1: no predicted intervals"))
    for r in rows:
        assert float(r["tokens_per_second_ratio"]) == pytest.approx(float(r["tokens_per_second"])
                                                                    / float(r["ar_tokens_per_second"]))
        assert math.isfinite(float(r["realized_speedup"])) and float(r["realized_speedup"]) > 0  # at equal work
        if r["rule"] == "alone":  # the drafter decoding alone: no drafts, its tokens judged by the target's NLL
            assert math.isnan(float(r["realized_acceptance"])) and math.isnan(float(r["predicted_acceptance"]))
            assert math.isfinite(float(r["nll_target_outputs"])) and int(r["gamma"]) == 0
            continue
        assert 0.0 <= float(r["realized_acceptance"]) <= 1.0 and float(r["realized_mean_accepted_length"]) >= 1.0
    first = [r for r in rows if r["batch_size"] == "1"]  # the headline figures are batch size 1's
    realized = np.array([float(r["realized_speedup"]) for r in first])
    predicted = np.array([float(r["predicted_speedup"]) for r in first])
    s = summary["metrics"]["speedup"]
    assert s["mae"] == pytest.approx(np.mean(np.abs(predicted - realized)))
    assert s["regret"] == pytest.approx(1 - realized[np.argmax(predicted)] / realized.max())
    by_batch = summary["metrics"]["by_batch_size"]
    assert set(by_batch) == {"1", "4"} and sum(m["cells"] for m in by_batch.values()) == len(rows)
    four = [r for r in rows if r["batch_size"] == "4"]
    assert by_batch["4"]["best_realized_speedup"] == pytest.approx(max(float(r["realized_speedup"]) for r in four))
    assert set(summary["metrics"]["crossover"]) == {"predicted", "realized", "within_one"}
    assert 0.0 <= summary["humaneval"]["humaneval_pass_at_1_ar"] <= 1.0
    # two passes (the default) of the same generations: a cell's figure over both is the mediant of
    # its passes' (same tokens, so tokens/s ratios combine as summed times), and their pooled
    # spread is the timing noise added to every speedup interval
    timing = summary["intervals"]["timing"]
    assert summary["generation"]["passes"] == timing["passes"] == 2 and timing["cells"] == len(rows)
    per_pass = [c["realized_speedup_passes"] for c in summary["cells"]]
    for cell, passes in zip(summary["cells"], per_pass):
        assert len(passes) == 2 and min(passes) * (1 - 1e-9) <= cell["realized_speedup"] <= max(passes) * (1 + 1e-9)
    logs = np.log(np.array(per_pass))
    pooled = np.sqrt(((logs - logs.mean(axis=1, keepdims=True)) ** 2).sum() / len(rows))
    assert timing["sd_log"] == pytest.approx(pooled) and timing["df"] == len(rows)


def test_mlflow_runs_link_to_the_ranking(ran):
    client, rank_parent, tmp = ran
    exp = client.get_experiment_by_name("val-e2e").experiment_id
    parent = client.search_runs([exp], "tags.`mdboost.pipeline` = 'validate_pairs'")[0]
    assert parent.data.tags["mdboost.ranking_run_id"] == rank_parent
    summary = json.loads((tmp / "val" / "summary.json").read_text())
    assert parent.data.tags["mlflow.note.content"].splitlines()[0] == f"**{summary['verdict']}**"
    assert parent.data.metrics["speedup_mae"] == pytest.approx(summary["metrics"]["speedup"]["mae"])
    children = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == len(summary["cells"])
    for child in children:
        linked = client.get_run(child.data.tags["mdboost.ranking_run_id"])
        assert linked.data.tags["mlflow.parentRunId"] == rank_parent
        for key in ("drafter", "target"):
            assert linked.data.params[key] == child.data.params[key]
        assert float(linked.data.params["max_divergence"]) == float(child.data.params["max_divergence"])
        assert math.isfinite(child.data.metrics["realized_speedup"])
    artifacts = {f.path for f in client.list_artifacts(parent.info.run_id)}
    assert {"predicted_vs_realized.png", "validation.csv", "summary.json"} <= artifacts
    assert summary["run_id"] == parent.info.run_id  # as rank's summary.json names its run
    (tmp / "logged").mkdir(exist_ok=True)
    with open(client.download_artifacts(parent.info.run_id, "summary.json", str(tmp / "logged"))) as fh:
        logged = json.load(fh)
    assert logged["run_id"] == parent.info.run_id and logged["verdict"] == summary["verdict"]


def test_a_failed_rerun_leaves_the_run_before_whole(validated, monkeypatch):
    """Every file goes into a fresh folder that replaces output_dir at the end: a rerun that fails
    after the plan leaves the previous validation's files, byte for byte, never a mix."""
    from pipelines import validate_pairs
    from pipelines.loader import load_yaml
    from pipelines.validate_config import ValidateConfig

    _, _, tmp, val = validated
    cfg = {**val, "output_dir": str(tmp / "val3"), "humaneval": {"tasks": 0}, "tracking": {"enabled": False},
           "ranking": {"ranking_dir": str(tmp / "rank"), "cells": 1}}
    (tmp / "val3.yaml").write_text(yaml.safe_dump(cfg))
    assert validate_pairs.main(str(tmp / "val3.yaml")) == 0
    assert "run_id" not in json.loads((tmp / "val3" / "summary.json").read_text())  # tracking off: no run

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    before = {p.name: p.read_bytes() for p in (tmp / "val3").iterdir()}
    assert sorted(before) == sorted(validate_pairs.OUTPUT_FILES)
    monkeypatch.setattr(validate_pairs, "realize_cells", interrupted)
    with pytest.raises(KeyboardInterrupt):
        validate_pairs.run(load_yaml(str(tmp / "val3.yaml"), ValidateConfig))
    assert {p.name: p.read_bytes() for p in (tmp / "val3").iterdir()} == before
    monkeypatch.setattr(validate_pairs, "write_validation_csv", interrupted)  # fails while writing its files
    with pytest.raises(KeyboardInterrupt):
        validate_pairs.main(str(tmp / "val3.yaml"))
    assert {p.name: p.read_bytes() for p in (tmp / "val3").iterdir()} == before
    assert not [p for p in tmp.iterdir() if p.name.startswith(".val3.tmp")]


def test_terminal_shows_a_table_and_the_verdict(validated, capsys):
    from pipelines import validate_pairs

    _, _, tmp, val = validated
    quiet = {**val, "output_dir": str(tmp / "val2"), "humaneval": {"tasks": 0}, "tracking": {"enabled": False},
             "ranking": {"ranking_dir": str(tmp / "rank"), "cells": 1}}
    (tmp / "quiet.yaml").write_text(yaml.safe_dump(quiet))
    assert validate_pairs.main(str(tmp / "quiet.yaml")) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "speedup pred [90%]" in lines[0] and lines[-1] == json.loads((tmp / "val2" / "summary.json").read_text())["verdict"]
    assert not any(line.startswith("{") for line in lines)
    (tmp / "bad.yaml").write_text(yaml.safe_dump({**quiet, "generation": {"temperature": 0.7}}))
    with pytest.raises(ValueError, match=r"generation.temperature is 0.7 but the ranking predicts at temperatures \[0.5, 1.0\]"):
        validate_pairs.main(str(tmp / "bad.yaml"))


def test_fewer_held_out_prompts_than_asked_are_named(validated, tmp_path):
    """The tiny ranking's held-out split of HumanEval has 36 prompts: asking for 5 from the 34th on
    runs on the 2 there are, and says so before generating (it was silent)."""
    from pipelines.config import TrackingConfig
    from pipelines.validate_config import GenerationConfig, SourceConfig
    from pipelines.validate_pairs import fetch_ranking, prompt_count_note

    _, _, tmp, _ = validated
    ranking = fetch_ranking(SourceConfig(ranking_dir=str(tmp / "rank")), TrackingConfig(enabled=False), tmp_path)
    assert prompt_count_note(ranking, GenerationConfig(prompts=36)) is None
    assert prompt_count_note(ranking, GenerationConfig(prompts=5, first_prompt=34)) == (
        "warning: generation.prompts is 5 but the held-out split has 2 prompts from the 34-th on "
        "(data.heldout_fraction=0.25 of the ranking's data): every cell runs on those 2")


def test_a_ranking_folder_links_to_its_mlflow_run(validated, tmp_path):
    """From a folder, the ranking run is the one its summary.json names (in the same store), so
    the cells link to the nested ranking runs as from a run id."""
    from pipelines.config import TrackingConfig
    from pipelines.validate_config import SourceConfig
    from pipelines.validate_pairs import fetch_ranking, ranking_children

    client, rank_parent, tmp, val = validated
    tracking = TrackingConfig(tracking_uri=val["tracking"]["tracking_uri"])
    ranking = fetch_ranking(SourceConfig(ranking_dir=str(tmp / "rank")), tracking, tmp_path)
    assert ranking.run_id == rank_parent
    children = ranking_children(ranking.run_id, tracking)
    assert children and all(client.get_run(r).data.tags["mlflow.parentRunId"] == rank_parent
                            for r in children.values())
    other = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'other.db'}")  # another store: nothing to link
    assert ranking_children(ranking.run_id, other) == {}


@pytest.mark.parametrize("name, text, message", [
    ("summary.json", "{", "summary.json is not valid JSON"),
    ("summary.json", "[1, 2]", "summary.json must hold a JSON object, got list"),
    ("config.resolved.yaml", "pool: [unclosed", "config.resolved.yaml is not valid YAML"),
    ("config.resolved.yaml", "- a list", "config.resolved.yaml must hold a YAML mapping, got list"),
])
def test_a_damaged_ranking_folder_names_the_file(validated, tmp_path, name, text, message):
    import shutil

    from pipelines.config import TrackingConfig
    from pipelines.validate_config import SourceConfig
    from pipelines.validate_pairs import fetch_ranking

    _, _, tmp, val = validated
    folder = tmp_path / "rank"
    shutil.copytree(tmp / "rank", folder)
    (folder / name).write_text(text)
    with pytest.raises(ValueError, match=message):
        fetch_ranking(SourceConfig(ranking_dir=str(folder)), TrackingConfig(tracking_uri=val["tracking"]["tracking_uri"]),
                      tmp_path / "work")


def test_a_ranking_run_id_names_a_missing_run_or_store_and_creates_none(tmp_path):
    """ranking.ranking_run_id on a store that does not exist says so and leaves no store behind; a run
    id the store does not hold is named as such (was: an empty store created, "holds no ranking.csv")."""
    import mlflow

    from pipelines.config import TrackingConfig
    from pipelines.validate_config import SourceConfig
    from pipelines.validate_pairs import fetch_ranking

    db = tmp_path / "none.db"
    with pytest.raises(ValueError, match=r"no MLflow run '0{32}' \(ranking.ranking_run_id\): the store .* does not exist"):
        fetch_ranking(SourceConfig(ranking_run_id="0" * 32), TrackingConfig(tracking_uri=f"sqlite:///{db}"), tmp_path)
    assert not db.exists()
    store = f"sqlite:///{tmp_path / 'store.db'}"
    mlflow.MlflowClient(store).create_experiment("e")
    with pytest.raises(ValueError, match=r"no MLflow run '0{32}' \(ranking.ranking_run_id\) in"):
        fetch_ranking(SourceConfig(ranking_run_id="0" * 32), TrackingConfig(tracking_uri=store), tmp_path)


def test_a_ranking_from_before_data_sample_is_read_as_the_head(validated, tmp_path):
    """Its config has no data.sample: it ranked the head of its split, so its held-out prompts are
    the head's too (not the random sample a new ranking takes)."""
    import shutil

    import yaml

    from pipelines.config import TrackingConfig
    from pipelines.validate_config import SourceConfig
    from pipelines.validate_pairs import fetch_ranking

    _, _, tmp, val = validated
    tracking = TrackingConfig(tracking_uri=val["tracking"]["tracking_uri"])
    assert fetch_ranking(SourceConfig(ranking_dir=str(tmp / "rank")), tracking, tmp_path / "a").config.data.sample == "random"
    folder = tmp_path / "rank"
    shutil.copytree(tmp / "rank", folder)
    raw = yaml.safe_load((folder / "config.resolved.yaml").read_text())
    del raw["data"]["sample"]
    (folder / "config.resolved.yaml").write_text(yaml.safe_dump(raw))
    assert fetch_ranking(SourceConfig(ranking_dir=str(folder)), tracking, tmp_path / "b").config.data.sample == "head"
