"""Bootstrap over prompts, the recommendation rule and the validation's calibration metrics,
each against a direct computation."""

import math
import re

import numpy as np
import pytest
import torch

from mdboost.ranking.recommend import recommend
from mdboost.ranking.uncertainty import BootstrapSettings, percentile_interval, prompt_weights, resample_sums
from mdboost.validation.calibration import calibration, coverage, regret


def test_prompt_weights_are_multinomial_counts_and_seeded():
    w = prompt_weights(7, BootstrapSettings(num_resamples=500, seed=3))
    assert w.shape == (500, 7) and torch.all(w.sum(1) == 7) and torch.all(w == w.round()) and (w >= 0).all()
    assert torch.equal(w, prompt_weights(7, BootstrapSettings(num_resamples=500, seed=3)))
    assert not torch.equal(w, prompt_weights(7, BootstrapSettings(num_resamples=500, seed=4)))
    # each prompt is drawn 1 time on average, with the binomial variance (1 - 1/B)
    assert abs(float(w.mean()) - 1) < 1e-12 and abs(float(w.var()) - 6 / 7) < 0.1


def test_bootstrap_of_a_mean_matches_the_textbook_standard_error():
    x = torch.tensor(np.random.default_rng(0).normal(size=40))
    w = prompt_weights(40, BootstrapSettings(num_resamples=4000, seed=0))
    means = resample_sums(x, w) / 40
    se = float(x.std(unbiased=False)) / math.sqrt(40)  # the bootstrap's plug-in standard error
    assert float(means.std()) == pytest.approx(se, rel=0.06)
    lo, hi = percentile_interval(means, 0.9)
    assert float(lo) == pytest.approx(float(x.mean()) - 1.645 * se, abs=0.3 * se)
    assert float(hi) == pytest.approx(float(x.mean()) + 1.645 * se, abs=0.3 * se)


@pytest.mark.parametrize("bad", [dict(num_resamples=-1), dict(level=1.0), dict(level="0.9"), dict(seed=1.5)])
def test_bootstrap_settings_name_the_bad_field(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        BootstrapSettings(**bad)


def _row(drafter, speedup, lo, hi, gamma=4, budget=0.05, ok=True):
    return {"drafter": drafter, "target": "t", "temperature": 0.7, "divergence": "kl" if budget else "none",
            "max_divergence": budget, "gamma": gamma, "predicted_speedup": speedup, "predicted_speedup_lo": lo,
            "predicted_speedup_hi": hi, "quality_ok": ok, "nll_target": 1.0, "nll_mentored": 1.01}


def test_recommendation_takes_the_fastest_point_whose_interval_clears_one():
    rows = [_row("a", 1.30, 0.95, 1.6), _row("b", 1.20, 1.05, 1.3), _row("c", 1.50, 1.2, 1.8, ok=False)]
    rec = recommend(rows)
    assert (rec.drafter, rec.beats_plain_decoding, rec.quality_ok) == ("b", True, True)
    assert rec.verdict().startswith("recommended: b -> t, T=0.7, kl <= 0.05, gamma 4")


def test_plain_decoding_is_fastest_when_no_interval_clears_one():
    rows = [_row("a", 0.86, 0.80, 0.92, budget=0.2), _row("b", 0.7, 0.6, 0.8), _row("c", 1.0, 0.99, 1.01, budget=0.0)]
    rec = recommend(rows)
    assert not rec.beats_plain_decoding and rec.drafter == "c"
    assert rec.verdict() == ("no drafter is reliably faster here; the best speculative point is "
                             "c -> t, T=0.7, SD, gamma 4 at 1.00x [0.99, 1.01]")
    assert set(rec.to_dict()) >= {"drafter", "target", "temperature", "divergence", "max_divergence", "gamma",
                                  "predicted_speedup", "predicted_speedup_lo", "predicted_speedup_hi",
                                  "beats_plain_decoding"}


def test_recommendation_reads_csv_strings():
    rows = [{k: str(v) for k, v in _row("a", 1.3, 1.1, 1.5).items()}, {k: str(v) for k, v in _row("b", 1.2, 1.1, 1.4).items()}]
    rec = recommend(rows)
    assert rec.drafter == "a" and rec.gamma == 4 and rec.beats_plain_decoding


def test_recommend_takes_any_iterable_of_rows_and_names_what_is_not_one():
    rows = [_row("a", 1.30, 0.95, 1.6), _row("b", 1.20, 1.05, 1.3)]
    assert recommend(iter(rows)) == recommend(rows)  # a generator is read once
    for bad, shown in (("outputs/rank-tiny", "str 'outputs/rank-tiny'"), (rows[0], "dict"), (3, "int 3"),
                       ([rows[0], "b"], "str 'b'")):  # were AttributeError / TypeError from deep inside
        with pytest.raises(TypeError, match=r"^rows must be a list of ranking rows \(dicts, e.g. "
                                            rf"load_ranking\(folder\)\['rows'\]\), got {re.escape(shown)}"):
            recommend(bad)
    with pytest.raises(ValueError, match="^rows must hold at least one ranking row, got none$"):
        recommend(iter([]))


def test_calibration_metrics_equal_a_direct_computation():
    rng = np.random.default_rng(1)
    pred = rng.uniform(0.8, 1.5, 20)
    real = pred + rng.normal(0, 0.05, 20)
    lo, hi = pred - 0.06, pred + 0.06
    cal = calibration(pred, lo, hi, real)
    inside = sum(1 for p, r in zip(pred, real) if p - 0.06 <= r <= p + 0.06)
    assert cal.coverage == pytest.approx(inside / 20) and cal.cells == 20
    assert cal.mae == pytest.approx(np.mean(np.abs(pred - real)))
    best_pred = max(range(20), key=lambda i: pred[i])
    assert cal.regret == pytest.approx(1 - real[best_pred] / real.max())
    assert coverage([1.0], [float("nan")], [2.0]) == 0.0
    assert regret([2.0, 1.0], [1.0, 1.0]) == 0.0
    with pytest.raises(ValueError, match="realized"):
        coverage([1.0, 2.0], [0.0], [3.0])


def test_expanded_tail_is_hesterbergs_formula():
    """``alpha'/2 = Phi(-sqrt(B/(B-1)) t_{B-1, 0.95})`` at level 0.9, from table values of t."""
    from mdboost.ranking.uncertainty import expanded_tail

    for n, t in ((4, 2.353363), (16, 1.753050)):  # Student t quantiles, 3 and 15 degrees of freedom
        z = math.sqrt(n / (n - 1)) * t
        assert expanded_tail(0.9, n) == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)), rel=1e-5)
    assert expanded_tail(0.9, 10**7) == pytest.approx(0.05, rel=1e-4)
    assert expanded_tail(0.9, 1) == 0.0
    with pytest.raises(ValueError, match="num_prompts must be an int >= 1, got 0"):
        expanded_tail(0.9, 0)


def test_the_expanded_interval_covers_closer_to_its_level_with_few_prompts():
    """A seeded simulation with a known truth (bench/interval_coverage.py): at 8 prompts the plain
    percentile interval covers well under 90%, the expanded one close to it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.interval_coverage import coverage, draw_prompts

    tokens, cost = draw_prompts(400_000, torch.Generator().manual_seed(1))
    plain, expanded = coverage(8, trials=400, truth=float(tokens.sum() / cost.sum()), resamples=400)
    assert plain < 0.86 < expanded < 0.95  # standard error of each about 1.5 points
