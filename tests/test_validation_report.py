"""mdboost.validation.report: per-cell records, coverage / regret against a direct computation,
the verdict rule, validation.csv / summary.json and the terminal table."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from scipy import stats

from mdboost.validation.report import (
    COLUMNS,
    cell_record,
    format_table,
    summarize,
    verdict,
    write_summary_json,
    write_validation_csv,
)
from tests._validation_rows import ranking_rows


def _realized(speedup, acceptance, length):
    return {"realized_speedup": speedup, "realized_acceptance": acceptance, "expected_acceptance": math.nan,
            "mean_accepted_length": length, "ar_tokens_per_second": 10.0, "tokens_per_second": 10.0 * speedup,
            "model_speedup_at_realized_acceptance": speedup, "realized_divergence": 0.0,
            "max_realized_divergence": 0.0, "acceptance_rate_all_positions": acceptance, "num_new_tokens": 32.0,
            "num_budget_accepted": 0.0, "nll_target_outputs": 1.0, "nll_target_ar_outputs": 1.0}


@pytest.fixture
def records():
    rng = np.random.default_rng(0)
    rows = [r for r in ranking_rows() if r["target"] == "t"][::7][:9]
    out = []
    for i, row in enumerate(rows):
        s = float(row["predicted_speedup"]) + rng.normal(0, 0.05)
        a = float(row["engine_acceptance"]) + rng.normal(0, 0.03)
        n = float(row["engine_mean_accepted_length"]) + rng.normal(0, 0.1)
        out.append(cell_record(i, "recommendation" if i == 0 else "sample", row, _realized(s, a, n)))
    return out


def test_metrics_equal_a_direct_computation(records):
    m = summarize(records)
    col = lambda k: np.array([r[k] for r in records])  # noqa: E731
    for figure, pred, real in (("speedup", "predicted_speedup", "realized_speedup"),
                               ("acceptance", "predicted_acceptance", "realized_acceptance"),
                               ("mean_accepted_length", "predicted_mean_accepted_length", "realized_mean_accepted_length")):
        p, r, lo, hi = col(pred), col(real), col(f"{pred}_lo"), col(f"{pred}_hi")
        inside = [lo[i] <= r[i] <= hi[i] for i in range(len(r))]
        assert m[figure]["covered"] == sum(inside) and m[figure]["with_interval"] == len(r) == m[figure]["cells"]
        assert m[figure]["coverage"] == pytest.approx(sum(inside) / len(r))
        assert [x[f"{figure}_inside"] for x in records] == inside
        assert m[figure]["mae"] == pytest.approx(np.mean(np.abs(p - r)))
        assert m[figure]["max_error"] == pytest.approx(np.max(np.abs(p - r)))
        assert m[figure]["spearman"] == pytest.approx(stats.spearmanr(p, r).statistic)
    p, r = col("predicted_speedup"), col("realized_speedup")
    assert m["speedup"]["regret"] == pytest.approx(1 - r[int(np.argmax(p))] / r.max())
    assert "regret" not in m["acceptance"]
    rec = m["recommendation"]
    assert rec["realized_speedup"] == r[0] and rec["regret"] == pytest.approx(1 - r[0] / r.max())
    assert rec["inside"] == bool(records[0]["predicted_speedup_lo"] <= r[0] <= records[0]["predicted_speedup_hi"])


def test_coverage_skips_cells_without_interval(records):
    for r in records[:3]:
        r["predicted_acceptance_lo"] = math.nan
    m = summarize(records)["acceptance"]
    assert m["with_interval"] == len(records) - 3 and m["cells"] == len(records)
    rest = records[3:]
    assert m["coverage"] == pytest.approx(np.mean([r["predicted_acceptance_lo"] <= r["realized_acceptance"]
                                                   <= r["predicted_acceptance_hi"] for r in rest]))


def test_cells_that_all_realize_no_acceptance_still_summarize(records):
    # a short validation on a small model can accept nothing in any cell: the acceptance figure
    # then has errors and coverage but no regret, and the summary is still written
    for r in records:
        r["realized_acceptance"] = 0.0
    m = summarize(records)
    assert m["acceptance"]["mae"] == pytest.approx(np.mean([r["predicted_acceptance"] for r in records]))
    assert m["acceptance"]["coverage"] == pytest.approx(np.mean([r["predicted_acceptance_lo"] <= 0.0 for r in records]))
    assert "regret" in m["speedup"] and math.isfinite(m["speedup"]["regret"])


def _metrics(coverage=11 / 12, regret=0.03, inside=True, covered=11, with_interval=12):
    return {"speedup": {"cells": 12, "with_interval": with_interval, "covered": covered, "coverage": coverage,
                        "mae": 0.04, "max_error": 0.1, "spearman": 0.9, "regret": regret},
            "recommendation": {"realized_speedup": 1.12, "predicted_speedup_lo": 1.05, "predicted_speedup_hi": 1.2,
                               "inside": inside}}


def test_verdict_rule():
    assert verdict(_metrics()).endswith(": predictions hold")
    assert "intervals cover 11 of 12 cells (92%)" in verdict(_metrics())
    low = verdict(_metrics(coverage=9 / 12, covered=9))
    assert "predictions do not hold: intervals cover less than 80% (too narrow)" in low
    assert "realizes 6% below the best validated cell" in verdict(_metrics(regret=0.06))
    out = verdict(_metrics(inside=False))
    assert "recommendation 1.12x outside [1.05, 1.20]" in out and "lies outside its interval" in out
    assert "may be wider than 90%" in verdict(_metrics(coverage=1.0, covered=12))
    none = verdict(_metrics(coverage=None, covered=0, with_interval=0, inside=None))
    assert none.startswith("no predicted intervals") and "intervals not checked" in none


def test_files_and_table(records, tmp_path):
    row = {**[r for r in ranking_rows() if r["target"] == "t"][5], "predicted_speedup_hi": ""}
    records[1] = cell_record(1, "sample", row, _realized(1.0, 0.5, 2.0))
    path = write_validation_csv(records, tmp_path / "out" / "validation.csv")
    with open(path, newline="") as fh:
        back = list(csv.DictReader(fh))
    assert len(back) == len(records) and list(back[0]) == COLUMNS
    assert back[0]["role"] == "recommendation" and float(back[2]["realized_speedup"]) == records[2]["realized_speedup"]
    assert back[1]["predicted_speedup_hi"] == "nan" and back[1]["speedup_inside"] == ""
    summary = {"verdict": verdict(summarize(records)), "metrics": summarize(records), "cells": records}
    text = write_summary_json(summary, tmp_path / "out" / "summary.json").read_text()
    loaded = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert loaded["cells"][1]["predicted_speedup_hi"] is None and loaded["verdict"] == summary["verdict"]
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]
    table = format_table(records).splitlines()
    assert len(table) == len(records) + 3 and len({len(line) for line in table[2:-1]}) == 1
    assert "speedup pred [90%]" in table[0]


def test_predictive_intervals_widen_each_side_about_the_point():
    """``interval_scale`` stretches ``[lo, hi]`` about the prediction: ``point -/+ scale (point - lo)``,
    ``(hi - point)`` (asymmetric intervals stay asymmetric), and decides ``*_inside`` on the widened one."""
    from mdboost.validation.calibration import predictive_scale

    row = next(r for r in ranking_rows() if r["target"] == "t")
    point, lo, hi = (float(row[k]) for k in ("predicted_speedup", "predicted_speedup_lo", "predicted_speedup_hi"))
    outside = hi + 0.5 * (hi - point)  # outside the ranking's interval, inside it widened x2
    plain = cell_record(1, "sample", row, _realized(outside, 0.5, 2.0))
    wide = cell_record(1, "sample", row, _realized(outside, 0.5, 2.0), interval_scale=2.0)
    assert plain["speedup_inside"] is False and wide["speedup_inside"] is True
    assert wide["predicted_speedup_lo"] == pytest.approx(point - 2 * (point - lo))
    assert wide["predicted_speedup_hi"] == pytest.approx(point + 2 * (hi - point))
    assert predictive_scale(16, 10) == pytest.approx(math.sqrt(2.6))
    with pytest.raises(ValueError, match="interval_scale"):
        cell_record(1, "sample", row, _realized(1.0, 0.5, 2.0), interval_scale=0.5)
    with pytest.raises(ValueError, match="new_prompts"):
        predictive_scale(16, 0)


def test_widened_intervals_stay_within_what_the_figure_can_take():
    """Widening about the point pushed a prompt-lookup acceptance of 0.019 [0.007, 0.047] x1.73 to
    [-0.001, ...] and its mean accepted length below 1; the bounds now stop at 0 / 1 and 1 / gamma + 1."""
    row = dict(next(r for r in ranking_rows() if r["target"] == "t"), gamma=3,
               engine_acceptance=0.019, engine_acceptance_lo=0.007, engine_acceptance_hi=0.998,
               engine_mean_accepted_length=1.02, engine_mean_accepted_length_lo=1.005,
               engine_mean_accepted_length_hi=3.99, predicted_speedup=0.1, predicted_speedup_lo=0.02,
               predicted_speedup_hi=0.2)
    rec = cell_record(1, "sample", row, _realized(0.1, 0.0, 1.0), interval_scale=1.73)
    assert rec["predicted_acceptance_lo"] == 0.0 and rec["predicted_acceptance_hi"] == 1.0
    assert rec["predicted_mean_accepted_length_lo"] == 1.0 and rec["predicted_mean_accepted_length_hi"] == 4.0
    assert rec["predicted_speedup_lo"] == 0.0 and rec["predicted_speedup_hi"] == pytest.approx(0.1 + 1.73 * 0.1)
    assert rec["acceptance_inside"] is True and rec["mean_accepted_length_inside"] is True


def test_only_the_prompt_part_of_a_speedup_interval_grows_on_new_prompts():
    """With the ranking's prompt-only interval (``predicted_speedup_prompts_*``), a side of
    half-width ``h`` with prompt part ``h_p`` becomes ``sqrt(h^2 + (s^2 - 1) h_p^2)``: no prompt
    spread leaves the interval as it is, all of it is ``s h`` (the old widening), and a ranking
    without the columns keeps the old widening."""
    row = dict(next(r for r in ranking_rows() if r["target"] == "t"), predicted_speedup=1.0,
               predicted_speedup_lo=0.7, predicted_speedup_hi=1.4)
    s = 1.5

    def bounds(**prompts):
        rec = cell_record(1, "sample", {**row, **prompts}, _realized(1.0, 0.5, 2.0), interval_scale=s)
        return rec["predicted_speedup_lo"], rec["predicted_speedup_hi"]

    assert bounds(predicted_speedup_prompts_lo=1.0, predicted_speedup_prompts_hi=1.0) == pytest.approx((0.7, 1.4))
    assert bounds(predicted_speedup_prompts_lo=0.7, predicted_speedup_prompts_hi=1.4) == pytest.approx((1 - s * 0.3, 1 + s * 0.4))
    assert bounds() == pytest.approx((1 - s * 0.3, 1 + s * 0.4))
    lo, hi = bounds(predicted_speedup_prompts_lo=0.9, predicted_speedup_prompts_hi=1.2)
    assert lo == pytest.approx(1 - math.sqrt(0.3 ** 2 + (s * s - 1) * 0.1 ** 2))
    assert hi == pytest.approx(1 + math.sqrt(0.4 ** 2 + (s * s - 1) * 0.2 ** 2))


def test_the_timing_noise_widens_the_speedup_interval_alone():
    """``timing`` (a log half-width) adds ``point (1 - e^-w)`` below and ``point (e^w - 1)`` above
    the speedup's point, in quadrature with the rest; acceptance and accepted length keep theirs."""
    row = dict(next(r for r in ranking_rows() if r["target"] == "t"), predicted_speedup=1.0,
               predicted_speedup_lo=0.7, predicted_speedup_hi=1.4,
               predicted_speedup_prompts_lo=1.0, predicted_speedup_prompts_hi=1.0)
    w = math.log(1.2)
    plain = cell_record(1, "sample", row, _realized(1.0, 0.5, 2.0))
    noisy = cell_record(1, "sample", row, _realized(1.0, 0.5, 2.0), timing=w)
    assert noisy["predicted_speedup_lo"] == pytest.approx(1 - math.sqrt(0.3 ** 2 + (1 - 1 / 1.2) ** 2))
    assert noisy["predicted_speedup_hi"] == pytest.approx(1 + math.sqrt(0.4 ** 2 + 0.2 ** 2))
    for key in ("predicted_acceptance_lo", "predicted_acceptance_hi", "predicted_mean_accepted_length_lo",
                "predicted_mean_accepted_length_hi"):
        assert noisy[key] == plain[key] or (math.isnan(noisy[key]) and math.isnan(plain[key]))
    with pytest.raises(ValueError, match="timing must be a finite half-width >= 0, got -0.1"):
        cell_record(1, "sample", row, _realized(1.0, 0.5, 2.0), timing=-0.1)


def test_timing_noise_pools_the_passes_spread_of_every_cell():
    """The pooled spread of log speedups about each cell's mean, against a direct computation on
    simulated passes; its interval for the mean of R passes is Student's t at the pooled degrees
    of freedom; a half of simulated validations' means fall within the half-width of a 50% level."""
    from mdboost.validation.calibration import timing_noise

    rng = np.random.default_rng(0)
    truth = np.array([0.4, 0.9, 1.6])  # three cells, true speedups
    passes = truth[:, None] * np.exp(rng.normal(0, 0.05, size=(3, 4)))
    t = timing_noise(passes.tolist(), 0.9)
    logs = np.log(passes)
    sd = math.sqrt(((logs - logs.mean(axis=1, keepdims=True)) ** 2).sum() / 9)
    assert (t.passes, t.cells, t.df) == (4, 3, 9) and t.sd_log == pytest.approx(sd)
    assert t.half_width_log == pytest.approx(stats.t.ppf(0.95, 9) * sd / 2)
    # calibration of the half-width: simulated validations of 2 passes, sigma 0.05 per pass
    hits = []
    for _ in range(2000):
        runs = truth[:, None] * np.exp(rng.normal(0, 0.05, size=(3, 2)))
        half = timing_noise(runs.tolist(), 0.5).half_width_log
        fresh = np.log(truth * np.exp(rng.normal(0, 0.05 / math.sqrt(2), size=3)))  # another run's mean
        hits.append(np.abs(fresh - np.log(truth)) <= half)
    assert 0.45 <= np.mean(hits) <= 0.55
    assert timing_noise([[1.0], [2.0]], 0.9) is None
    with pytest.raises(ValueError, match="per_pass must hold one non-empty list of passes per cell"):
        timing_noise([[1.0, 1.1], [2.0]], 0.9)
    with pytest.raises(ValueError, match="positive finite speedups"):
        timing_noise([[1.0, 0.0]], 0.9)
