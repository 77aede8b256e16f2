"""The recommendation end to end on constructed pairs: a drafter that cannot win gives the
"plain decoding is reliably fastest" verdict, a nearly free copy of the target is recommended, and the
intervals come from the bootstrap over prompts (wider with fewer prompts)."""

import pytest
import torch

from mdboost.ranking.boosting import CachedLogitsHypothesis
from mdboost.ranking.layout import SequenceLayout
from mdboost.ranking.rank import PairRows, PairSide, ScoreSettings, rank_rows, score_pair
from mdboost.ranking.recommend import recommend
from mdboost.ranking.support import rows_from_logits
from mdboost.ranking.uncertainty import BootstrapSettings

V, PROMPTS, LENGTH = 24, 12, 20


def _side(name, logits, true, cost):
    rows = rows_from_logits(logits, true, V - 1)
    idx = torch.arange(len(true))
    hyp = CachedLogitsHypothesis(true, logits[idx, true], logits.sum(-1), V, topk_ids=rows.ids,
                                 topk_logits=logits.gather(-1, rows.ids), name=name)
    return PairSide(name, rows, hyp, cost)


def _pair(drafter_logits, cost, prompts=PROMPTS, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = prompts * LENGTH
    lq = torch.randn(n, V, generator=gen, dtype=torch.float64) * 3
    lp = drafter_logits(lq, gen)
    true = torch.multinomial(torch.softmax(lq, -1), 1, generator=gen).squeeze(-1)
    layout = SequenceLayout(torch.arange(prompts).repeat_interleave(LENGTH))
    return PairRows(_side("d", lp, true, cost), _side("t", lq, true, 1.0), true.numpy(), layout=layout)


SETTINGS = ScoreSettings(divergences=("kl",), budgets=(0.0, 0.05), gamma_min=1, gamma_max=4,
                         bootstrap=BootstrapSettings(num_resamples=400, seed=1))


def test_a_drafter_that_cannot_win_gives_the_plain_decoding_verdict():
    # an unrelated drafter as slow as the target: every point is slower than plain decoding
    pair = _pair(lambda lq, gen: torch.randn(lq.shape, generator=gen, dtype=torch.float64) * 3, cost=1.0)
    score = score_pair(pair, V, settings=SETTINGS)
    rows = rank_rows(score.rows + score.alone_rows)
    alone = [r for r in rows if r["rule"] == "alone"]
    # the drafter alone costs what the target does (speedup 1) and fails the quality check
    assert len(alone) == 1 and alone[0]["predicted_speedup"] == pytest.approx(1.0) and not alone[0]["quality_ok"]
    assert all(r["predicted_speedup_hi"] < 1 for r in rows if r["rule"] != "alone")
    rec = recommend(rows)
    assert not rec.beats_plain_decoding
    assert rec.verdict().startswith("plain decoding is reliably fastest here; the best speculative point is d -> t")
    best = max((r for r in rows if r["quality_ok"]), key=lambda r: r["predicted_speedup"])
    assert rec.predicted_speedup == best["predicted_speedup"] and rec.gamma == best["gamma"]


def test_a_nearly_free_copy_of_the_target_is_recommended():
    pair = _pair(lambda lq, gen: lq + 0.05 * torch.randn(lq.shape, generator=gen, dtype=torch.float64), cost=0.02)
    score = score_pair(pair, V, settings=SETTINGS)
    rows = rank_rows(score.rows + score.alone_rows)
    rec = recommend(rows)
    assert rec.beats_plain_decoding and rec.predicted_speedup_lo > 1
    assert rec.predicted_speedup_lo <= rec.predicted_speedup <= rec.predicted_speedup_hi
    # the copy is within the quality tolerance of the target, so decoding with it alone wins:
    # 1 / c = 50 (no prompt tokens here), faster than any verified point
    assert rec.verdict().startswith("recommended: d alone (instead of t), T=1: predicted speedup 50.00x")
    assert rec.gamma == 0 and rec.drafter_share == 1.0 and rec.nll_mentored <= rec.nll_target + 0.05
    # without the drafter alone the best verified point is recommended
    rec = recommend([r for r in rows if r["rule"] != "alone"])
    assert rec.beats_plain_decoding and rec.verdict().startswith("recommended: d -> t")


def test_a_drafter_outside_the_quality_tolerance_alone_is_not_recommended():
    # a noisier copy: verified points keep the target's quality, the drafter alone does not
    pair = _pair(lambda lq, gen: lq + 1.0 * torch.randn(lq.shape, generator=gen, dtype=torch.float64), cost=0.02)
    score = score_pair(pair, V, settings=SETTINGS)
    rows = rank_rows(score.rows + score.alone_rows)
    alone = [r for r in rows if r["rule"] == "alone"]
    assert len(alone) == 1 and not alone[0]["quality_ok"] and alone[0]["nll_mentored"] == alone[0]["nll_drafter"]
    assert alone[0]["predicted_speedup"] > max(r["predicted_speedup"] for r in rows if r["rule"] != "alone")
    rec = recommend(rows)
    assert rec.rule != "alone" and rec.quality_ok


def test_fewer_prompts_give_wider_intervals():
    drafter = lambda lq, gen: lq + 1.5 * torch.randn(lq.shape, generator=gen, dtype=torch.float64)  # noqa: E731
    widths = []
    for prompts in (40, 5):
        rows = score_pair(_pair(drafter, 0.3, prompts=prompts), V, settings=SETTINGS).rows
        widths.append(max(r["predicted_speedup_hi"] - r["predicted_speedup_lo"] for r in rows if r["is_best_gamma"]))
    assert widths[1] > widths[0] > 0


def test_no_resamples_means_no_interval_and_no_faster_claim():
    pair = _pair(lambda lq, gen: lq + 0.05 * torch.randn(lq.shape, generator=gen, dtype=torch.float64), cost=0.02)
    settings = ScoreSettings(divergences=("kl",), budgets=(0.0,), gamma_min=1, gamma_max=4,
                             bootstrap=BootstrapSettings(num_resamples=0))
    rows = rank_rows(score_pair(pair, V, settings=settings).rows)
    assert all(r["predicted_speedup_lo"] != r["predicted_speedup_lo"] for r in rows)  # NaN
    assert not recommend(rows).beats_plain_decoding


def test_the_engine_snippet_runs(tmp_path):
    """The snippet printed for a recommendation runs as written (tiny pool, both verdicts)."""
    from mdboost.ranking.recommend import Recommendation
    from pipelines.loader import load_yaml
    from pipelines.config import RankConfig
    from pipelines.rank_pool import engine_snippet

    cfg = load_yaml("configs/tiny.yaml", RankConfig)
    for beats, drafter in ((True, "early_exit:2"), (False, "ngram:2"), (True, "ngram:2")):
        rec = Recommendation(drafter, "tiny", 0.7, "kl", 0.1, 3, 1.2, 1.1, 1.3, beats, True, 1.0, 1.0)
        scope = {}
        exec(compile(engine_snippet(rec, cfg), "<snippet>", "exec"), scope)  # noqa: S102
        assert scope["out"].num_new_tokens.item() >= 1
