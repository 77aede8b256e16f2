"""End to end: the ranking pipeline on a tiny random pool, CSV and MLflow read back and checked."""

import json
import math

import numpy as np
import pytest
import torch
import yaml

from mdboost.md.solve import solve
from mdboost.ranking.report import read_csv
from pipelines.loader import from_dict, load_yaml, to_dict
from pipelines.config import RankConfig

REQUIRED = ["drafter", "target", "divergence", "max_divergence", "sd_acceptance", "md_acceptance",
            "acceptance_gain", "cost_ratio", "best_gamma", "predicted_speedup", "mu_target", "mu_drafter",
            "boosting_advantage", "eps_pq_median", "rho_pq_median", "k_median", "nll_target", "nll_drafter",
            "nll_mentored", "nll_boosted", "rank"]


def hand_speedup(alpha: float, gamma: int, c: float, v: float, s: float, md_solve: str = "reached",
                 sd: float = 0.0) -> float:
    """The speed model written out: E[tokens] / (gamma c + v + s E[solved]), sums not closed forms;
    ``md_solve="needed"`` solves a reached position only where SD would reject (``1 - sd``)."""
    tokens = sum(alpha ** i for i in range(gamma + 1))
    solved = sum(alpha ** i for i in range(gamma)) * ((1 - sd) if md_solve == "needed" else 1.0)
    return tokens / (gamma * c + v + s * solved)


def check_speed_columns(r: dict, profile: dict, kind: str, gamma_range) -> None:
    """The i.i.d. ``predicted_speedup_iid`` (at the row's gamma) and ``best_gamma_iid`` of a CSV row
    against the hand formula and brute force. (Process columns: ``tests/test_ranking_process.py``.)"""
    alpha, c, g = float(r["md_acceptance"]), float(r["cost_ratio"]), int(r["gamma"])
    s = profile["md_overhead"][kind] if float(r["max_divergence"]) > 0 else 0.0
    v, solve, sd = profile["verify_cost"], r["md_solve"], float(r["sd_acceptance"])
    assert float(r["verify_cost"]) == pytest.approx(v[g]) and float(r["md_overhead"]) == pytest.approx(s)
    assert float(r["predicted_speedup_iid"]) == pytest.approx(hand_speedup(alpha, g, c, v[g], s, solve, sd), rel=1e-6)
    best = max(gamma_range, key=lambda k: hand_speedup(alpha, k, c, v[k], s, solve, sd))
    assert int(r["best_gamma_iid"]) == best


def _config(tmp_path, **over) -> RankConfig:
    data = to_dict(load_yaml("configs/tiny.yaml", RankConfig))
    data["pool"].update(drafters=["early_exit:2", "ngram:2"], pairs="all")
    data["data"]["limit"] = 3
    data["md"].update(budgets=[0.0, 0.3], rules=[{"rule": "mentored", "drafting": "sampled"}])  # MD's rows (other
    # rules: tests/test_rank_pipeline_rules.py)
    data["ranking"]["frontier_rows"] = 0  # the frontier: tests/test_rank_pipeline_rules.py
    data["cache"]["dir"] = str(tmp_path / "cache")
    data["output_dir"] = str(tmp_path / "out")
    data["tracking"].update(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", artifact_root=str(tmp_path / "art"))
    for section, values in over.items():
        data[section].update(values)
    return from_dict(RankConfig, data)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    from pipelines.rank_pool import run

    tmp_path = tmp_path_factory.mktemp("rank")
    cfg = _config(tmp_path)
    return tmp_path, cfg, run(cfg)


def _rows(tmp_path, batch_size: int = 1) -> list[dict]:
    """The ranking's rows at one batch size (the default config ranks batch sizes 1 and 4)."""
    return [r for r in read_csv(tmp_path / "out" / "ranking.csv") if int(r["batch_size"]) == batch_size]


def test_csv_has_required_fields_and_ranks(first_run):
    tmp_path, cfg, summary = first_run
    rows = _rows(tmp_path)
    assert set(REQUIRED + ["temperature", "gamma", "is_best_gamma", "predicted_speedup_lo", "batch_size"]) <= set(rows[0])
    # 4 ordered pairs (ngram is never a target) x 2 temperatures x (plain SD once + 2 divergences x
    # budget 0.3) x 6 gammas, and the 2 model drafters alone at each temperature, at batch sizes 1 and 4
    assert cfg.speed.batch_sizes == [1, 4]
    assert 2 * len(rows) == summary["n_rows"] == 2 * (4 * 2 * 3 * 6 + 2 * 2)
    assert summary["n_points"] == 4 * 2 * 3 + 2 * 2
    alone = [r for r in rows if r["rule"] == "alone"]
    assert sorted((r["drafter"], r["target"]) for r in alone) == [("early_exit:2", "tiny")] * 2 + [("tiny", "early_exit:2")] * 2
    assert all(r["gamma"] == "0" and r["is_best_gamma"] == "True" and r["engines"] == "mdboost" for r in alone)
    assert sorted(int(r["rank"]) for r in rows) == list(range(1, len(rows) + 1))
    assert {float(r["temperature"]) for r in rows} == {0.7, 1.0}
    points = {}
    for r in (r for r in rows if r["rule"] != "alone"):
        points.setdefault((r["drafter"], r["target"], r["temperature"], r["divergence"], r["max_divergence"]), []).append(r)
    assert len(points) == 24
    for key, mine in points.items():
        assert sorted(int(r["gamma"]) for r in mine) == list(range(1, 7))
        assert sum(r["is_best_gamma"] == "True" for r in mine) == 1
        assert (key[3] == "none") == (float(key[4]) == 0)  # budget 0 once, as plain SD
        for r in mine:  # the 90% intervals hold the point estimate
            for name in ("predicted_speedup", "engine_acceptance", "engine_mean_accepted_length"):
                assert float(r[f"{name}_lo"]) - 1e-9 <= float(r[name]) <= float(r[f"{name}_hi"]) + 1e-9, (name, r)
    rec = summary["recommendation"]
    assert set(rec) >= {"drafter", "target", "temperature", "divergence", "max_divergence", "gamma",
                        "predicted_speedup", "predicted_speedup_lo", "predicted_speedup_hi", "beats_plain_decoding"}
    assert summary["bootstrap"] == {"prompts": 3, "resamples": cfg.ranking.resamples, "level": 0.9, "seed": 0}
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["recommendation"] == rec and saved["sampling"]["temperatures"] == [0.7, 1.0]
    assert {(r["drafter"], r["target"]) for r in rows} == {
        ("early_exit:2", "tiny"), ("ngram:2", "tiny"), ("tiny", "early_exit:2"), ("ngram:2", "early_exit:2")}
    for name in ("ranking.html", "ranking_full.html", "config.resolved.yaml", "plots/acceptance_vs_budget.png",
                 "plots/k_vs_acceptance.png", "plots/margin_cdf.png", "plots/speedup_by_drafter.png"):
        assert (tmp_path / "out" / name).is_file()
    assert load_yaml(tmp_path / "out" / "config.resolved.yaml", RankConfig) == cfg
    from mdboost.export import export_plan, load_ranking  # one renderer: rank prints what export prints

    assert summary["engine_snippet"] == export_plan(load_ranking(tmp_path / "out"))["mdboost"]["python"]


def test_metrics_match_direct_computation_on_cache(first_run):
    from mdboost.cache import LogitCache
    from mdboost.cache.speed import SpeedStore, speed_path
    tmp_path, cfg, _ = first_run
    rows = [r for r in _rows(tmp_path) if r["drafter"] == "early_exit:2" and r["target"] == "tiny"
            and float(r["temperature"]) == 1.0 and r["rule"] != "alone"]
    spec = cfg.cache_spec(1.0)
    tc, dc = LogitCache.open(spec.member_dir("tiny")), LogitCache.open(spec.member_dir("early_exit:2"))
    true = tc.true_tokens()
    q = torch.softmax(tc.full_logits("tiny").double(), -1)
    p = torch.softmax(dc.full_logits("early_exit:2").double(), -1)
    idx = torch.arange(len(true))
    for r in rows:
        f = "kl" if r["divergence"] == "none" else r["divergence"]
        sol = solve(p, q, max_divergence=float(r["max_divergence"]), divergence=f)
        assert float(r["sd_acceptance"]) == pytest.approx(float(torch.minimum(p, q).sum(-1).mean()), rel=1e-6)
        assert float(r["md_acceptance"]) == pytest.approx(float(sol.acceptance.mean()), rel=1e-6)
        assert float(r["nll_target"]) == pytest.approx(float(-q[idx, true].log().mean()), rel=1e-3)
        assert float(r["nll_drafter"]) == pytest.approx(float(-p[idx, true].log().mean()), rel=1e-3)
        assert float(r["cost_ratio"]) == pytest.approx(SpeedStore(speed_path(spec)).drafter("early_exit:2")["median"])
        profile = SpeedStore(speed_path(spec)).profile
        assert profile["verify_cost"][0] == 1.0 and len(profile["verify_cost"]) >= cfg.speed.gamma_max + 1
        check_speed_columns(r, profile, "dense", range(cfg.speed.gamma_min, cfg.speed.gamma_max + 1))
    ngram = [r for r in _rows(tmp_path) if r["drafter"] == "ngram:2" and r["target"] == "tiny"
             and float(r["temperature"]) == 1.0]
    for r in ngram:  # one-hot drafts use their own MD overhead
        check_speed_columns(r, SpeedStore(speed_path(spec)).profile, "onehot", range(cfg.speed.gamma_min, cfg.speed.gamma_max + 1))
    # a pair whose target is not the pool target has no profile: v = 1, s = 0
    for r in read_csv(tmp_path / "out" / "ranking.csv"):
        if r["target"] == "early_exit:2" and r["rule"] != "alone":
            assert float(r["verify_cost"]) == 1.0 and float(r["md_overhead"]) == 0.0


def test_batch_size_rows_repeat_the_points_with_their_own_costs(first_run):
    """Every point is ranked at each batch size, ranks restart per batch size, the acceptance side is
    the same, the costs are those measured at that batch size, and the summary has a recommendation
    per batch size."""
    from mdboost.cache.speed import SpeedStore, speed_path

    tmp_path, cfg, summary = first_run
    one, four = _rows(tmp_path, 1), _rows(tmp_path, 4)
    key = lambda r: tuple(r[c] for c in ("drafter", "target", "temperature", "divergence", "max_divergence", "gamma"))  # noqa: E731
    assert sorted(map(key, one)) == sorted(map(key, four))
    assert sorted(int(r["rank"]) for r in four) == list(range(1, len(four) + 1))
    by_key = {key(r): r for r in one}
    store = SpeedStore(speed_path(cfg.cache_spec(1.0)))
    for r in four:
        assert r["engine_acceptance"] == by_key[key(r)]["engine_acceptance"]
        if r["target"] == "tiny" and float(r["temperature"]) == 1.0:
            assert float(r["cost_ratio"]) == pytest.approx(store.drafter(r["drafter"], 4)["median"])
            if r["rule"] != "alone":  # the drafter alone verifies nothing
                assert float(r["verify_cost"]) == pytest.approx(store.profile_at(4)["verify_cost"][int(r["gamma"])])
    assert set(summary["recommendations_by_batch_size"]) == {"1", "4"}
    assert summary["recommendations_by_batch_size"]["1"] == summary["recommendation"]
    best4 = min(four, key=lambda r: int(r["rank"]))
    assert summary["recommendations_by_batch_size"]["4"]["drafter"] == best4["drafter"] or not best4["quality_ok"]


def test_mlflow_runs_hold_the_fields(first_run):
    from mlflow.tracking import MlflowClient

    tmp_path, cfg, summary = first_run
    client = MlflowClient(cfg.tracking.tracking_uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parent = [r for r in runs if r.info.run_id == summary["run_id"]][0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == summary["n_points"] == 28  # each point at its best gamma, and each drafter alone
    children = [c for c in children if c.data.params["rule"] != "alone"]
    rows = {(r["drafter"], r["target"], float(r["temperature"]), r["divergence"], float(r["max_divergence"])): r
            for r in _rows(tmp_path) if r["is_best_gamma"] == "True"}
    numeric = set(REQUIRED) - {"drafter", "target", "divergence", "nll_drafter"}
    for child in children:
        prm, met = child.data.params, child.data.metrics
        row = rows[(prm["drafter"], prm["target"], float(prm["temperature"]), prm["divergence"],
                    float(prm["max_divergence"]))]
        assert prm["gamma"] == row["gamma"] == row["best_gamma"]
        assert numeric <= set(met)
        for key in numeric:
            assert met[key] == pytest.approx(float(row[key]), rel=1e-9, abs=1e-12)
    assert parent.data.params["cache.k"] == str(cfg.cache.k)
    rec = summary["recommendation"]
    assert parent.data.params["recommendation.drafter"] == rec["drafter"]
    assert parent.data.metrics["recommendation_predicted_speedup"] == pytest.approx(rec["predicted_speedup"])
    assert summary["verdict"] in parent.data.tags["mlflow.note.content"]
    top = {f.path for f in client.list_artifacts(parent.info.run_id)}
    assert {"ranking.csv", "ranking.html", "ranking_full.html", "config.resolved.yaml", "summary.json",
            "ranking_table.json", "plots"} <= top
    plots = {f.path for f in client.list_artifacts(parent.info.run_id, "plots")}
    assert {"plots/acceptance_vs_budget.png", "plots/k_vs_acceptance.png", "plots/margin_cdf.png",
            "plots/speedup_by_drafter.png"} == plots
    run = parent.info  # the parent's Duration is the job's: it starts before the slowest stage ran
    assert (run.end_time - run.start_time) / 1000 >= summary["seconds_total"] - summary["seconds_by_stage"]["mlflow"]


def test_rerun_reuses_cache_and_rescoring_recomputes_only_scores(first_run):
    from pipelines.rank_pool import run

    tmp_path, cfg, summary = first_run
    assert summary["cache_reused"] is False
    before = read_csv(tmp_path / "out" / "ranking.csv")
    again = run(_config(tmp_path, tracking={"enabled": False}))
    assert again["cache_reused"] is True
    after = read_csv(tmp_path / "out" / "ranking.csv")
    assert [r["md_acceptance"] for r in before] == [r["md_acceptance"] for r in after]
    more = run(_config(tmp_path, tracking={"enabled": False}, md={"budgets": [0.0, 0.3, 1.0]}))
    assert more["cache_reused"] is True and more["n_rows"] == 2 * (4 * 2 * 5 * 6 + 2 * 2)  # batch sizes 1 and 4


def test_main_reports_config_errors(tmp_path, capsys):
    from pipelines.rank_pool import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"md": {"budgets": [0.1], "divergnce": "kl"}}))
    with pytest.raises(ValueError, match="unknown key 'divergnce' at 'md'"):  # mdboost.cli.main reports it
        main(config=str(bad))


def test_score_values_are_finite_where_defined(first_run):
    _, _, summary = first_run
    for row in summary["rows"]:
        if row["rule"] == "alone":  # no drafts: no acceptance
            assert math.isnan(row["md_acceptance"]) and math.isfinite(row["predicted_speedup"])
            continue
        for key in ("sd_acceptance", "md_acceptance", "predicted_speedup", "nll_target", "nll_mentored", "nll_boosted"):
            assert math.isfinite(row[key]), (key, row)
        assert 0 <= row["sd_acceptance"] <= row["md_acceptance"] + 1e-9 <= 1 + 1e-9
        assert row["margin_risk_0"] <= row["margin_bound_0"] + 1e-12
        if row["drafter"].startswith("ngram"):
            assert np.isinf(row["nll_drafter"])
