"""The ranking pipeline on the real offline default model (SmolLM2-135M), a small slice: slow."""

import math

import pytest

from mdboost.ranking.report import read_csv
from pipelines.loader import from_dict, load_yaml, to_dict
from pipelines.config import RankConfig

pytestmark = pytest.mark.slow


def test_smollm2_rank_small(tmp_path):
    from mdboost.models.convert import smollm2_gguf
    from pipelines.rank_pool import run

    try:
        smollm2_gguf()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    data = to_dict(load_yaml("configs/default.yaml", RankConfig))
    data["pool"]["drafters"] = ["early_exit:24", "ngram:3"]
    data["data"].update(limit=2, max_tokens=256)
    data["cache"].update(dir=str(tmp_path / "cache"), k=64, cost_repeats=5)
    data["md"]["budgets"] = [0.0, 0.2]
    data["md"]["temperatures"] = [1.0]
    data["md"]["rules"] = [{"rule": "mentored", "drafting": "sampled"}]  # MD's rows (rules: test_rank_pipeline_rules.py)
    data["ranking"]["frontier_rows"] = 0
    data["speed"]["batch_sizes"] = [1]  # batch sizes: tests/test_rank_pipeline.py (B = 4 costs take minutes here)
    data["output_dir"] = str(tmp_path / "out")
    data["progress"] = False
    data["tracking"].update(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}", artifact_root=str(tmp_path / "a"))
    summary = run(from_dict(RankConfig, data))
    rows = read_csv(tmp_path / "out" / "ranking.csv")
    # 2 pairs x (plain SD + 3 divergences at 0.2) x gammas 1..8, and the model drafter alone
    assert len(rows) == summary["n_rows"] == 2 * 4 * 8 + 1
    (alone,) = [r for r in rows if r["rule"] == "alone"]
    assert (alone["drafter"], alone["gamma"], alone["quality_ok"]) == ("early_exit:24", "0", "False")
    assert float(alone["nll_mentored"]) == float(alone["nll_drafter"]) > float(alone["nll_target"])
    # alone it pays one drafter step per token: about 1 / c (its prefill moves it a little)
    assert float(alone["predicted_speedup"]) == pytest.approx(1 / float(alone["cost_ratio"]), rel=0.1)
    rows = [r for r in rows if r["rule"] != "alone"]
    for r in rows:
        assert 0 < float(r["sd_acceptance"]) <= float(r["md_acceptance"]) + 1e-9 <= 1 + 1e-9
        assert math.isfinite(float(r["nll_target"])) and float(r["nll_target"]) > 0
        assert float(r["mu_target"]) > 0  # the target predicts the reference better than chance
    exit_rows = [r for r in rows if r["drafter"] == "early_exit:24"]
    ngram_rows = [r for r in rows if r["drafter"] == "ngram:3"]
    # a 24-of-30-layer exit is a worse model than the target, and costs more than prompt lookup
    assert float(exit_rows[0]["nll_drafter"]) > float(exit_rows[0]["nll_target"])
    assert float(ngram_rows[0]["cost_ratio"]) < float(exit_rows[0]["cost_ratio"])
    # prompt lookup's budget points run on MD's own text (one short sampling pass), the rest on the target's
    assert {r["process_text"] for r in ngram_rows if float(r["max_divergence"]) > 0} == {"own"}
    assert {r["process_text"] for r in rows if r["drafter"] != "ngram:3" or float(r["max_divergence"]) == 0} == {"target"}
