"""Greedy decoding (``md.temperatures`` with 0) end to end on the tiny pool: lossless rows only,
acceptance = the argmax match along the target's greedy continuations, costs of the engine's
greedy path in their own speed file."""

import pytest
import torch

from mdboost.ranking.report import read_csv
from tests.test_rank_pipeline_sampled import _config


@pytest.fixture(scope="module")
def greedy_run(tmp_path_factory):
    from pipelines.rank_pool import run

    tmp_path = tmp_path_factory.mktemp("rank_greedy")
    cfg = _config(tmp_path, md={"temperatures": [0.0, 1.0]}, tracking={"enabled": False})
    return tmp_path, cfg, run(cfg)


def test_greedy_rows_are_lossless_and_argmax_matches(greedy_run):
    from mdboost.cache import LogitCache

    tmp_path, cfg, summary = greedy_run
    rows = [r for r in read_csv(tmp_path / "out" / "ranking.csv") if r["batch_size"] == "1"]
    greedy = [r for r in rows if float(r["temperature"]) == 0.0 and r["rule"] != "alone"]
    # the model drafter decodes alone greedily too
    assert [r["drafter"] for r in rows if float(r["temperature"]) == 0.0 and r["rule"] == "alone"] == ["early_exit:2"]
    assert {float(r["temperature"]) for r in rows} == {0.0, 1.0}
    gammas = range(cfg.speed.gamma_min, cfg.speed.gamma_max + 1)
    assert len(greedy) == len(cfg.pool.drafters) * len(gammas)  # one lossless point per drafter and gamma
    assert {r["divergence"] for r in greedy} == {"none"} and {float(r["max_divergence"]) for r in greedy} == {0.0}
    spec = cfg.cache_spec(0.0)
    target = LogitCache.open(spec.member_dir("tiny", acceptance=True))
    text = target.true_tokens()
    # the continuations are the target's greedy ones: its argmax is the text token
    assert float((target.topk("tiny")[0][:, 0] == text).double().mean()) >= 0.98
    drafter = LogitCache.open(spec.member_dir("early_exit:2", acceptance=True))
    match = (drafter.topk("early_exit:2")[0][:, 0] == target.topk("tiny")[0][:, 0]).double().mean()
    for r in greedy:
        if r["drafter"] == "early_exit:2":
            assert float(r["sd_acceptance"]) == pytest.approx(float(match), rel=1e-9)
            assert float(r["md_acceptance"]) == pytest.approx(float(match), rel=1e-9)
        assert r["quality_ok"] == "True" and 0 < float(r["predicted_speedup"])
        assert float(r["predicted_speedup_lo"]) <= float(r["predicted_speedup"]) <= float(r["predicted_speedup_hi"])


def test_greedy_costs_have_their_own_speed_file(greedy_run):
    from mdboost.cache.speed import SpeedStore, speed_path

    _, cfg, _ = greedy_run
    greedy, sampled = (SpeedStore(speed_path(cfg.cache_spec(t))) for t in (0.0, 1.0))
    assert greedy.path != sampled.path
    assert greedy.profile["md_overhead"] is None and "greedy path" in greedy.profile["method"]
    assert set(sampled.profile["md_overhead"]) == {"dense", "onehot"}
    assert greedy.drafter("early_exit:2")["median"] > 0 and sampled.drafter("early_exit:2")["median"] > 0


def test_greedy_needs_sampled_continuations(tmp_path):
    with pytest.raises(ValueError, match="acceptance_source"):
        _config(tmp_path, md={"temperatures": [0.0]}, cache={"acceptance_source": "reference"})


def test_greedy_member_rows_are_one_hot():
    """``member_rows(..., 0)``: log p is 0 at the argmax and -inf elsewhere; true_logp 0 where the text is it."""
    from mdboost.ranking.rows import member_rows

    class Cache:
        vocab_size = 5
        manifest = {"keep_full": False}

        def true_tokens(self):
            return torch.tensor([2, 1])

        def kind(self, name):
            return "model"

        def topk(self, name):
            return torch.tensor([[2, 0], [3, 1]]), torch.tensor([[5.0, 1.0], [4.0, 3.9]])

        def true_logit(self, name):
            return torch.tensor([5.0, 3.9])

        def logit_sum(self, name):
            return torch.tensor([6.0, 7.9])

    rows, _ = member_rows(Cache(), "m", 0.0)
    assert rows.logp.tolist() == [[0.0, -float("inf")], [0.0, -float("inf")]]
    assert rows.true_logp.tolist() == [0.0, -float("inf")] and rows.tail.tolist() == [0.0, 0.0]
