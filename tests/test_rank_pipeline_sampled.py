"""End to end with ``cache.acceptance_source: sampled``: acceptance columns from the target-sampled
cache, quality columns from the reference cache, both checked against direct computations."""

import pytest
import torch

from mdboost.md.solve import solve
from mdboost.ranking.report import read_csv
from pipelines.config import RankConfig
from tests.test_rank_pipeline import _config as rank_config
from tests.test_rank_pipeline import check_speed_columns


def _config(tmp_path, **over) -> RankConfig:
    """The tiny end-to-end config of test_rank_pipeline, target pairs, sampled acceptance."""
    cache = {"acceptance_source": "sampled", "acceptance_max_new_tokens": 12, **over.pop("cache", {})}
    return rank_config(tmp_path, pool={"pairs": "target"}, cache=cache, **over)


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory):
    from pipelines.rank_pool import run

    tmp_path = tmp_path_factory.mktemp("rank_sampled")
    cfg = _config(tmp_path)
    return tmp_path, cfg, run(cfg)


def test_acceptance_from_sampled_cache_quality_from_reference(sampled_run):
    from mdboost.cache import LogitCache
    from mdboost.cache.speed import SpeedStore, speed_path
    from mdboost.ranking.diagnostics import boost_coefficient

    tmp_path, cfg, _ = sampled_run
    spec = cfg.cache_spec()  # the first temperature's folders
    rows = [r for r in read_csv(tmp_path / "out" / "ranking.csv") if r["drafter"] == "early_exit:2"
            and float(r["temperature"]) == spec.temperature and r["batch_size"] == "1"]  # batch size 1's costs
    ref_t, ref_d = (LogitCache.open(spec.member_dir(m)) for m in ("tiny", "early_exit:2"))
    smp_t, smp_d = (LogitCache.open(spec.member_dir(m, acceptance=True)) for m in ("tiny", "early_exit:2"))
    assert smp_t.manifest["source"] == "sampled" and ref_t.manifest["source"] == "reference"
    assert 0 < smp_t.num_rows <= 3 * 12 and smp_t.num_rows != ref_t.num_rows
    t = spec.temperature
    q, p = (torch.softmax(c.full_logits(m).double() / t, -1) for c, m in ((ref_t, "tiny"), (ref_d, "early_exit:2")))
    qs, ps = (torch.softmax(c.full_logits(m).double() / t, -1) for c, m in ((smp_t, "tiny"), (smp_d, "early_exit:2")))
    true = ref_t.true_tokens()
    idx = torch.arange(len(true))
    for r in (r for r in rows if r["rule"] != "alone"):
        assert r["acceptance_source"] == "sampled"
        assert 0.0 <= float(r["engine_acceptance"]) <= 1.0 and float(r["engine_mean_accepted_length"]) >= 1.0
        assert int(r["acceptance_positions"]) == smp_t.num_rows and int(r["n_positions"]) == ref_t.num_rows
        budget, f = float(r["max_divergence"]), "kl" if r["divergence"] == "none" else r["divergence"]
        sol_s = solve(ps, qs, max_divergence=budget, divergence=f)
        sol_r = solve(p, q, max_divergence=budget, divergence=f)
        assert float(r["sd_acceptance"]) == pytest.approx(float(torch.minimum(ps, qs).sum(-1).mean()), rel=1e-6)
        assert float(r["md_acceptance"]) == pytest.approx(float(sol_s.acceptance.mean()), rel=1e-6)
        assert float(r["acceptance_gain"]) == pytest.approx(float(sol_s.acceptance.mean() - torch.minimum(ps, qs).sum(-1).mean()), abs=1e-9)
        k = boost_coefficient(sol_s.a, sol_s.b)
        assert float(r["k_median"]) == pytest.approx(float(torch.quantile(k, 0.5, interpolation="nearest")), rel=1e-6)
        assert float(r["cost_ratio"]) == pytest.approx(SpeedStore(speed_path(spec)).drafter("early_exit:2")["median"])
        check_speed_columns(r, SpeedStore(speed_path(spec)).profile, "dense", range(cfg.speed.gamma_min, cfg.speed.gamma_max + 1))
        # quality stays on the teacher-forced reference cache
        assert float(r["nll_target"]) == pytest.approx(float(-q[idx, true].log().mean()), rel=1e-3)
        assert float(r["nll_drafter"]) == pytest.approx(float(-p[idx, true].log().mean()), rel=1e-3)
        pi = torch.maximum((1 - sol_r.b)[:, None] * q, torch.minimum(p, (1 + sol_r.a)[:, None] * q))
        assert float(r["nll_mentored"]) == pytest.approx(float(-pi[idx, true].log().mean()), rel=1e-3)


def test_sampled_source_is_recorded_and_reused(sampled_run):
    from mlflow.tracking import MlflowClient

    from pipelines.rank_pool import run

    tmp_path, cfg, summary = sampled_run
    assert summary["cache_reused"] is False and summary["acceptance_source"] == "sampled"
    client = MlflowClient(cfg.tracking.tracking_uri)
    parent = client.get_run(summary["run_id"])
    assert parent.data.params["cache.acceptance_source"] == "sampled"
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    children = [r for r in client.search_runs([exp.experiment_id], max_results=100)
                if r.data.tags.get("mlflow.parentRunId") == summary["run_id"]]
    # 2 target pairs x 2 temperatures x (plain SD + kl 0.3 + tv 0.3), each at its best gamma
    children = [c for c in children if c.data.params["rule"] != "alone"]  # and the model drafter alone, twice
    assert len(children) == 12 and {c.data.params["acceptance_source"] for c in children} == {"sampled"}
    # prompt lookup's lossy points ran on their own text, every other point on the target's
    texts = {(c.data.params["drafter"], c.data.params["max_divergence"]): c.data.params["process_text"] for c in children}
    assert {k: v for k, v in texts.items() if v == "own"} == {("ngram:2", "0.3"): "own"}
    before = read_csv(tmp_path / "out" / "ranking.csv")
    again = run(_config(tmp_path, tracking={"enabled": False}))
    assert again["cache_reused"] is True
    assert [r["md_acceptance"] for r in read_csv(tmp_path / "out" / "ranking.csv")] == [r["md_acceptance"] for r in before]
    # back to reference acceptance: same main folders, acceptance from the teacher-forced rows
    ref = run(_config(tmp_path, tracking={"enabled": False}, cache={"acceptance_source": "reference"}))
    assert ref["cache_reused"] is True
    rows = read_csv(tmp_path / "out" / "ranking.csv")
    assert {r["acceptance_source"] for r in rows} == {"reference"}
    key = lambda r: (r["drafter"], r["temperature"], r["divergence"], r["max_divergence"], r["gamma"])
    sampled = {key(r): r for r in before}
    for r in (r for r in rows if r["rule"] != "alone"):  # the drafter alone's TV is the acceptance rows'
        assert r["nll_mentored"] == sampled[key(r)]["nll_mentored"]
        assert r["acceptance_positions"] == r["n_positions"]
