"""End to end: the ranking pipeline on a tiny random pool, CSV and MLflow read back and checked."""

import math

import numpy as np
import pytest
import torch
import yaml

from mdboost.md.solve import solve
from mdboost.ranking.report import read_csv
from pipelines.config import RankConfig, from_dict, load_yaml, to_dict

REQUIRED = ["drafter", "target", "divergence", "max_divergence", "sd_acceptance", "md_acceptance",
            "acceptance_gain", "cost_ratio", "best_gamma", "predicted_speedup", "mu_target", "mu_drafter",
            "boosting_advantage", "eps_pq_median", "rho_pq_median", "k_median", "nll_target", "nll_drafter",
            "nll_mentored", "nll_boosted", "rank"]


def hand_speedup(alpha: float, gamma: int, c: float, v: float, s: float) -> float:
    """The speed model written out: E[tokens] / (gamma c + v + s E[solved]), sums not closed forms."""
    tokens = sum(alpha ** i for i in range(gamma + 1))
    solved = sum(alpha ** i for i in range(gamma))
    return tokens / (gamma * c + v + s * solved)


def check_speed_columns(r: dict, profile: dict, kind: str, gamma_range) -> None:
    """The i.i.d. ``predicted_speedup_iid``/``best_gamma_iid`` of a CSV row against the hand formula
    and brute force; without process columns (``engine_acceptance``) they are the main columns.
    (Process columns: ``tests/test_ranking_process.py``.)"""
    alpha, c, g = float(r["md_acceptance"]), float(r["cost_ratio"]), int(r["best_gamma_iid"])
    s = profile["md_overhead"][kind] if float(r["max_divergence"]) > 0 else 0.0
    v = profile["verify_cost"]
    assert float(r["verify_cost"]) == pytest.approx(v[int(r["best_gamma"])]) and float(r["md_overhead"]) == pytest.approx(s)
    assert float(r["predicted_speedup_iid"]) == pytest.approx(hand_speedup(alpha, g, c, v[g], s), rel=1e-6)
    assert float(r["predicted_speedup_iid"]) == pytest.approx(max(hand_speedup(alpha, k, c, v[k], s) for k in gamma_range), rel=1e-9)
    if r.get("engine_acceptance", "") == "":
        assert (r["best_gamma"], r["predicted_speedup"]) == (r["best_gamma_iid"], r["predicted_speedup_iid"])


def _config(tmp_path, **over) -> RankConfig:
    data = to_dict(load_yaml("configs/tiny.yaml", RankConfig))
    data["pool"].update(drafters=["early_exit:2", "ngram:2"], pairs="all")
    data["data"]["limit"] = 3
    data["md"]["budgets"] = [0.0, 0.3]
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


def test_csv_has_required_fields_and_ranks(first_run):
    tmp_path, cfg, summary = first_run
    rows = read_csv(tmp_path / "out" / "ranking.csv")
    assert set(REQUIRED) <= set(rows[0])
    # 4 ordered pairs (ngram is never a target) x 2 divergences x 2 budgets
    assert len(rows) == summary["n_rows"] == 16
    assert sorted(int(r["rank"]) for r in rows) == list(range(1, 17))
    assert {(r["drafter"], r["target"]) for r in rows} == {
        ("early_exit:2", "tiny"), ("ngram:2", "tiny"), ("tiny", "early_exit:2"), ("ngram:2", "early_exit:2")}
    for name in ("ranking.html", "config.resolved.yaml", "plots/acceptance_vs_budget.png",
                 "plots/k_vs_acceptance.png", "plots/margin_cdf.png"):
        assert (tmp_path / "out" / name).is_file()
    assert load_yaml(tmp_path / "out" / "config.resolved.yaml", RankConfig) == cfg


def test_metrics_match_direct_computation_on_cache(first_run):
    from mdboost.cache import LogitCache
    tmp_path, cfg, _ = first_run
    rows = [r for r in read_csv(tmp_path / "out" / "ranking.csv") if r["drafter"] == "early_exit:2" and r["target"] == "tiny"]
    spec = cfg.cache_spec()
    tc, dc = LogitCache.open(spec.member_dir("tiny")), LogitCache.open(spec.member_dir("early_exit:2"))
    true = tc.true_tokens()
    q = torch.softmax(tc.full_logits("tiny").double(), -1)
    p = torch.softmax(dc.full_logits("early_exit:2").double(), -1)
    idx = torch.arange(len(true))
    for r in rows:
        sol = solve(p, q, max_divergence=float(r["max_divergence"]), divergence=r["divergence"])
        assert float(r["sd_acceptance"]) == pytest.approx(float(torch.minimum(p, q).sum(-1).mean()), rel=1e-6)
        assert float(r["md_acceptance"]) == pytest.approx(float(sol.acceptance.mean()), rel=1e-6)
        assert float(r["nll_target"]) == pytest.approx(float(-q[idx, true].log().mean()), rel=1e-3)
        assert float(r["nll_drafter"]) == pytest.approx(float(-p[idx, true].log().mean()), rel=1e-3)
        assert float(r["cost_ratio"]) == pytest.approx(dc.cost_ratio("early_exit:2"))
        profile = tc.manifest["speed_profile"]
        assert profile["verify_cost"][0] == 1.0 and len(profile["verify_cost"]) >= cfg.speed.gamma_max + 1
        check_speed_columns(r, profile, "dense", range(cfg.speed.gamma_min, cfg.speed.gamma_max + 1))
    ngram = [r for r in read_csv(tmp_path / "out" / "ranking.csv") if r["drafter"] == "ngram:2" and r["target"] == "tiny"]
    for r in ngram:  # one-hot drafts use their own MD overhead
        check_speed_columns(r, tc.manifest["speed_profile"], "onehot", range(cfg.speed.gamma_min, cfg.speed.gamma_max + 1))
    # a pair whose target is not the pool target has no profile: v = 1, s = 0
    for r in read_csv(tmp_path / "out" / "ranking.csv"):
        if r["target"] == "early_exit:2":
            assert float(r["verify_cost"]) == 1.0 and float(r["md_overhead"]) == 0.0


def test_mlflow_runs_hold_the_fields(first_run):
    from mlflow.tracking import MlflowClient

    tmp_path, cfg, summary = first_run
    client = MlflowClient(cfg.tracking.tracking_uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parent = [r for r in runs if r.info.run_id == summary["run_id"]][0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 16
    rows = {(r["drafter"], r["target"], r["divergence"], float(r["max_divergence"])): r
            for r in read_csv(tmp_path / "out" / "ranking.csv")}
    numeric = set(REQUIRED) - {"drafter", "target", "divergence", "nll_drafter"}
    for child in children:
        prm, met = child.data.params, child.data.metrics
        row = rows[(prm["drafter"], prm["target"], prm["divergence"], float(prm["max_divergence"]))]
        assert numeric <= set(met)
        for key in numeric:
            assert met[key] == pytest.approx(float(row[key]), rel=1e-9, abs=1e-12)
    assert parent.data.params["cache.k"] == str(cfg.cache.k)
    top = {f.path for f in client.list_artifacts(parent.info.run_id)}
    assert {"ranking.csv", "ranking.html", "config.resolved.yaml", "plots"} <= top
    plots = {f.path for f in client.list_artifacts(parent.info.run_id, "plots")}
    assert {"plots/acceptance_vs_budget.png", "plots/k_vs_acceptance.png", "plots/margin_cdf.png"} == plots


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
    assert more["cache_reused"] is True and more["n_rows"] == 24


def test_main_reports_config_errors(tmp_path, capsys):
    from pipelines.rank_pool import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"md": {"budgets": [0.1], "divergnce": "kl"}}))
    assert main(config=str(bad)) == 2
    assert "unknown key 'divergnce' at 'md'" in capsys.readouterr().err


def test_score_values_are_finite_where_defined(first_run):
    _, _, summary = first_run
    for row in summary["rows"]:
        for key in ("sd_acceptance", "md_acceptance", "predicted_speedup", "nll_target", "nll_mentored", "nll_boosted"):
            assert math.isfinite(row[key]), (key, row)
        assert 0 <= row["sd_acceptance"] <= row["md_acceptance"] + 1e-9 <= 1 + 1e-9
        assert row["margin_risk_0"] <= row["margin_bound_0"] + 1e-12
        if row["drafter"].startswith("ngram"):
            assert np.isinf(row["nll_drafter"])
