"""Tiny pool end to end: rank, then validate; runs linked to the ranking, metrics checked."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from scipy import stats

RANK = {
    "name": "tiny-e2e", "pool": {"target": "tiny", "drafters": ["int8", "ngram:2"], "pairs": "target", "device": "cpu"},
    "data": {"source": "humaneval", "split": "cache", "limit": 2, "max_tokens": 32},
    "cache": {"k": 16, "full_logits": True, "shard_size": 2, "cost_repeats": 1, "cost_context": 8},
    "md": {"divergences": ["kl"], "budgets": [0.0, 0.2], "temperatures": [1.0]},
    "speed": {"gamma_min": 1, "gamma_max": 3, "md_solve": "reached"}, "boosting": {"n_estimators": 2, "orders": ["target_first"]},
    "progress": False,
}


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
    val = {"name": "e2e", "output_dir": str(tmp / "val"), "ranking": {"ranking_run_id": rank_parent, "top": 3, "per_pair": False},
           "generation": {"prompts": 2, "max_new_tokens": 8}, "humaneval": {"tasks": 1, "max_new_tokens": 8},
           "tracking": {**tracking, "experiment": "val-e2e"}, "progress": False}
    (tmp / "val.yaml").write_text(yaml.safe_dump(val))
    assert validate_pairs.main(str(tmp / "val.yaml")) == 0
    return client, rank_parent


def test_validation_runs_exist_and_link_to_ranking_runs(validated):
    client, rank_parent = validated
    exp = client.get_experiment_by_name("val-e2e").experiment_id
    parent = client.search_runs([exp], "tags.`mdboost.pipeline` = 'validate_pairs'")[0]
    assert parent.data.tags["mdboost.ranking_run_id"] == rank_parent
    children = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 3
    for child in children:
        linked = client.get_run(child.data.tags["mdboost.ranking_run_id"])
        assert linked.data.tags["mlflow.parentRunId"] == rank_parent
        for key in ("drafter", "target", "divergence"):
            assert linked.data.params[key] == child.data.params[key]
        assert float(linked.data.params["max_divergence"]) == float(child.data.params["max_divergence"])
        # compared: the process's engine_acceptance (sampled acceptance source, the default)
        lm = linked.data.metrics
        assert child.data.metrics["predicted_acceptance"] == pytest.approx(lm["engine_acceptance"])
        assert child.data.metrics["predicted_acceptance_iid"] == pytest.approx(lm["md_acceptance"])
        assert child.data.metrics["predicted_acceptance_from_process"] == 1.0
        m = child.data.metrics
        for key in ("realized_acceptance", "md_mean_accepted_length", "md_tokens_per_second", "realized_speedup",
                    "md_realized_divergence", "nll_target_md_outputs"):
            assert key in m and math.isfinite(m[key])
        assert 0.0 <= m["realized_acceptance"] <= 1.0
        assert m["realized_speedup"] == pytest.approx(m["md_tokens_per_second"] / m["ar_tokens_per_second"])
        if float(child.data.params["max_divergence"]) == 0.0:
            assert m["md_realized_divergence"] == 0.0
        # Rao-Blackwellized acceptance (the ranking's speed.md_solve is "reached": P_acc at every draft)
        assert 0.0 <= m["expected_acceptance"] <= 1.0
        assert m["acceptance_error_expected"] == pytest.approx(abs(m["predicted_acceptance"] - m["expected_acceptance"]))
        assert m["acceptance_error"] == pytest.approx(abs(m["predicted_acceptance"] - m["realized_acceptance"]))
        # the speed model at the realized acceptance, written out by hand
        lr = linked.data.metrics
        alpha, g, c = m["expected_acceptance"], int(child.data.params["best_gamma"]), lr["cost_ratio"]
        s = lr["md_overhead"]
        tokens, solved = sum(alpha ** i for i in range(g + 1)), sum(alpha ** i for i in range(g))
        assert m["model_speedup_at_realized_acceptance"] == pytest.approx(tokens / (g * c + lr["verify_cost"] + s * solved))


def test_prediction_metrics_equal_a_direct_computation(validated):
    client, _ = validated
    exp = client.get_experiment_by_name("val-e2e").experiment_id
    parent = client.search_runs([exp], "tags.`mdboost.pipeline` = 'validate_pairs'")[0]
    children = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    pa, ra, ps, rs = (np.array([c.data.metrics[k] for c in children]) for k in
                      ("predicted_acceptance", "realized_acceptance", "predicted_speedup", "realized_speedup"))
    m = parent.data.metrics
    ea = np.array([c.data.metrics["expected_acceptance"] for c in children])
    assert m["acceptance_mae_expected"] == pytest.approx(np.mean(np.abs(pa - ea)))
    assert m["acceptance_max_error_expected"] == pytest.approx(np.max(np.abs(pa - ea)))
    assert m["acceptance_points_expected"] == len(children)
    assert parent.data.params["md_solve"] == "reached"
    assert m["acceptance_mae"] == pytest.approx(np.mean(np.abs(pa - ra)))
    iid = np.array([c.data.metrics["predicted_acceptance_iid"] for c in children])
    assert m["acceptance_mae_iid"] == pytest.approx(np.mean(np.abs(iid - ra)))
    assert m["acceptance_max_error_iid_expected"] == pytest.approx(np.max(np.abs(iid - ea)))
    assert m["acceptance_max_error"] == pytest.approx(np.max(np.abs(pa - ra)))
    assert m["speedup_mae"] == pytest.approx(np.mean(np.abs(ps - rs)))
    assert m["top_pair_agrees"] == float(rs[np.argmax(ps)] == rs.max())
    rho = stats.spearmanr(ps, rs).statistic
    if math.isfinite(rho):
        assert m["speedup_spearman"] == pytest.approx(rho)
    assert 0.0 <= m["humaneval_pass_at_1_ar"] <= 1.0 and 0.0 <= m["humaneval_pass_at_1_md"] <= 1.0
    artifacts = [f.path for f in client.list_artifacts(parent.info.run_id)]
    assert "predicted_vs_realized.png" in artifacts
