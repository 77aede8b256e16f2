"""A validation's results: one record per cell, metrics over cells, a verdict, files and a table.

:func:`cell_record` joins a ranking row (its predictions, each with its 90% interval where the
ranking has one) with the realized numbers of :func:`mdboost.validation.points.realize_cells`.
:func:`summarize` computes, per figure (speedup, acceptance, mean accepted length), the metrics
of :mod:`mdboost.validation.calibration` over the cells: coverage of the intervals, MAE, max
error, Spearman, and for the speedup the regret of the pick; plus whether the recommendation's
realized speedup lies inside its interval. :func:`verdict` turns them into one line by the rule
below; :func:`write_validation_csv`, :func:`write_summary_json` and :func:`format_table` write
and show them.

The verdict rule (``docs/validation.md``, "The verdict"): the predictions *hold* when the
speedup intervals cover at least ``MIN_COVERAGE`` (80%) of the cells, the regret of the pick is
at most ``MAX_REGRET`` (5%) and the recommendation's realized speedup lies inside its interval;
otherwise they *do not hold*, and the line names each failed condition. Without intervals in
the ranking the coverage cannot be checked and the line says so. Coverage above
``WIDE_COVERAGE`` (97%) is noted (the intervals may be wider than 90%), not failed: over a dozen
cells, a calibrated 90% interval covers all of them one time in four. When the realized
*acceptance* falls outside its 90% intervals in more cells than chance allows
(:func:`prompt_shift`), the line ends with a warning: the validation prompts behave unlike the
ranked ones (the ranked sample may not represent them).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path

import numpy as np

from mdboost._io import atomic_write_text, json_ready
from mdboost.ranking.recommend import plain_wins_from
from mdboost.ranking.report import csv_bool, csv_float, row_batch_size, row_draft_p_min
from mdboost.validation.calibration import calibration, coverage, predictive_interval
from mdboost.validation.prediction import predicted_acceptance

MIN_COVERAGE = 0.80
MAX_REGRET = 0.05
WIDE_COVERAGE = 0.97
INTERVAL_LEVEL = 0.90  # the ranking's intervals (mdboost.ranking.uncertainty)
SHIFT_TEST_LEVEL = 0.05  # the binomial test of prompt_shift

CELL_FIELDS = ("drafter", "target", "temperature", "divergence", "max_divergence", "gamma", "md_solve", "rule",
               "drafting", "draft_p_min", "batch_size")

#: figure -> (predicted column, realized column) of a record
FIGURES = {"speedup": ("predicted_speedup", "realized_speedup"),
           "acceptance": ("predicted_acceptance", "realized_acceptance"),
           "mean_accepted_length": ("predicted_mean_accepted_length", "realized_mean_accepted_length")}

COLUMNS = [
    "cell", "role", *CELL_FIELDS, "top_k", "top_p", "rank", "quality_ok",
    "predicted_speedup", "predicted_speedup_lo", "predicted_speedup_hi", "realized_speedup", "speedup_inside",
    "predicted_acceptance", "predicted_acceptance_lo", "predicted_acceptance_hi", "realized_acceptance",
    "acceptance_inside", "expected_acceptance", "predicted_acceptance_from_process",
    "predicted_mean_accepted_length", "predicted_mean_accepted_length_lo", "predicted_mean_accepted_length_hi",
    "realized_mean_accepted_length", "mean_accepted_length_inside",
    "ar_tokens_per_second", "tokens_per_second", "tokens_per_second_ratio", "model_speedup_at_realized_acceptance", "realized_divergence",
    "max_realized_divergence", "acceptance_rate_all_positions", "num_new_tokens", "num_budget_accepted",
    "nll_target_outputs", "nll_target_ar_outputs",
]


def _inside(value: float, lo: float, hi: float) -> bool | None:
    """``lo <= value <= hi``; ``None`` when the interval or the value is missing."""
    if not all(math.isfinite(x) for x in (value, lo, hi)):
        return None
    return bool(lo <= value <= hi)


def _figure_range(figure: str, gamma: int) -> tuple[float, float]:
    """The values a figure can take: an acceptance is a probability, a mean accepted length lies
    in ``[1, gamma + 1]``, a speedup is ``>= 0``."""
    return {"acceptance": (0.0, 1.0), "mean_accepted_length": (1.0, gamma + 1.0)}.get(figure, (0.0, math.inf))


def _clip(value: float, low: float, high: float) -> float:
    """``value`` within ``[low, high]`` (NaN stays NaN)."""
    return value if math.isnan(value) else min(max(value, low), high)


def cell_record(index: int, role: str, row: dict, realized: dict, *, top_k=None, top_p=None,
                interval_scale: float = 1.0, timing: float = 0.0) -> dict:
    """One validated cell: the ranking row's predictions next to the realized numbers.

    Parameters
    ----------
    index : int
        The cell's number in the validation (0 for the recommendation).
    role : str
        ``"recommendation"`` or ``"sample"``.
    row : dict
        The ranking row (strings or numbers), with ``temperature``, ``gamma`` and ``md_solve``.
    realized : dict
        The row's entry of :func:`mdboost.validation.points.realize_cells`.
    top_k, top_p : int or None, float or None
        The sampling settings the cell ran with (the ranking's).
    interval_scale : float, default=1.0
        The prompts' part of every predicted interval is widened by this factor on each side of
        its point (``>= 1``; :func:`~mdboost.validation.calibration.predictive_scale`: the
        ranking's interval for the expected value becomes one for a run over the validation's
        prompts; the speedup's cost part, from the row's ``predicted_speedup_prompts_lo`` /
        ``_hi``, stays as it is, :func:`~mdboost.validation.calibration.predictive_interval`), then kept
        within the values the figure can take (acceptance in ``[0, 1]``, mean accepted length
        in ``[1, gamma + 1]``, speedup ``>= 0``).
    timing : float, default=0.0
        The realized speedup's timing noise, a half-width on the log scale
        (:attr:`~mdboost.validation.calibration.TimingNoise.half_width_log`), added to the speedup's
        interval (:func:`~mdboost.validation.calibration.predictive_interval`); 0 without passes to
        estimate it from.

    Returns
    -------
    dict
        The fields of :data:`COLUMNS`; a missing interval has NaN bounds and ``*_inside`` None.
    """
    if not interval_scale >= 1:
        raise ValueError(f"interval_scale must be >= 1, got {interval_scale!r}")
    acc, from_process = predicted_acceptance(row)
    acc_lo, acc_hi = ((csv_float(row.get("engine_acceptance_lo")), csv_float(row.get("engine_acceptance_hi")))
                      if from_process else (math.nan, math.nan))
    rec = {"cell": int(index), "role": role, "drafter": str(row["drafter"]), "target": str(row["target"]),
           "temperature": csv_float(row["temperature"]), "divergence": str(row["divergence"]),
           "max_divergence": csv_float(row["max_divergence"]), "gamma": int(csv_float(row["gamma"])),
           "md_solve": str(row["md_solve"]), "rule": str(row.get("rule") or "mentored"),
           "drafting": str(row.get("drafting") or "sampled"), "draft_p_min": row_draft_p_min(row), "batch_size": row_batch_size(row), "top_k": top_k, "top_p": top_p, "rank": csv_float(row.get("rank")),
           "quality_ok": csv_bool(row.get("quality_ok")),
           "predicted_speedup": csv_float(row["predicted_speedup"]),
           "predicted_speedup_lo": csv_float(row.get("predicted_speedup_lo")),
           "predicted_speedup_hi": csv_float(row.get("predicted_speedup_hi")),
           "realized_speedup": float(realized["realized_speedup"]),
           "realized_speedup_passes": [float(x) for x in realized.get("realized_speedup_passes",
                                                                      [realized["realized_speedup"]])],
           "predicted_acceptance": acc, "predicted_acceptance_lo": acc_lo, "predicted_acceptance_hi": acc_hi,
           "realized_acceptance": float(realized["realized_acceptance"]),
           "expected_acceptance": float(realized["expected_acceptance"]),
           "predicted_acceptance_from_process": bool(from_process),
           "predicted_mean_accepted_length": csv_float(row.get("engine_mean_accepted_length")),
           "predicted_mean_accepted_length_lo": csv_float(row.get("engine_mean_accepted_length_lo")),
           "predicted_mean_accepted_length_hi": csv_float(row.get("engine_mean_accepted_length_hi")),
           "realized_mean_accepted_length": float(realized["mean_accepted_length"])}
    for key in ("ar_tokens_per_second", "tokens_per_second", "model_speedup_at_realized_acceptance",
                "realized_divergence", "max_realized_divergence", "acceptance_rate_all_positions", "num_new_tokens",
                "num_budget_accepted", "nll_target_outputs", "nll_target_ar_outputs"):
        rec[key] = float(realized[key])
    # the ratio of the two modes' tokens/s as measured, each at its own lengths (realized_speedup
    # takes plain decoding at the cell's: mdboost.validation.runs.equal_work_speedup)
    rec["tokens_per_second_ratio"] = (rec["tokens_per_second"] / rec["ar_tokens_per_second"]
                                      if rec["ar_tokens_per_second"] > 0 else math.nan)
    # the speedup interval's prompt part (the ranking's ``predicted_speedup_prompts_*``; a ranking
    # without them: the whole interval, an upper bound); the other figures hold the prompts' spread alone
    prompts = {"speedup": tuple(csv_float(row.get(f"predicted_speedup_prompts_{side}", math.nan)) for side in ("lo", "hi"))}
    for figure, (pred, real) in FIGURES.items():  # widened, then kept within the figure's range
        part = prompts.get(figure)
        lo, hi = predictive_interval(rec[pred], rec[f"{pred}_lo"], rec[f"{pred}_hi"], interval_scale,
                                     part if part is not None and all(map(math.isfinite, part)) else None,
                                     timing=timing if figure == "speedup" else 0.0)
        low, high = _figure_range(figure, rec["gamma"])
        rec[f"{pred}_lo"], rec[f"{pred}_hi"] = _clip(lo, low, high), _clip(hi, low, high)
        rec[f"{figure}_inside"] = _inside(rec[real], rec[f"{pred}_lo"], rec[f"{pred}_hi"])
    return rec


def figure_metrics(records: list[dict], figure: str) -> dict | None:
    """Metrics of one figure of :data:`FIGURES` over the records where it is finite.

    ``cells`` (records compared), ``with_interval`` (of those, with a finite interval),
    ``covered``, ``coverage`` (``covered / with_interval``, None without intervals), ``mae``,
    ``max_error``, ``spearman`` (NaN when undefined) and, for the speedup, ``regret``
    (:func:`mdboost.validation.calibration.regret`). None when no record has the figure.
    """
    pred, real = FIGURES[figure]
    use = [r for r in records if math.isfinite(r[pred]) and math.isfinite(r[real])]
    if not use:
        return None
    p, r = np.array([x[pred] for x in use]), np.array([x[real] for x in use])
    lo, hi = np.array([x[f"{pred}_lo"] for x in use]), np.array([x[f"{pred}_hi"] for x in use])
    has = np.isfinite(lo) & np.isfinite(hi)
    cal = calibration(p, lo, hi, r).to_dict()
    out = {"cells": cal["cells"], "with_interval": int(has.sum()),
           "covered": int(np.sum(has & (lo <= r) & (r <= hi))),
           "coverage": coverage(r[has], lo[has], hi[has]) if has.any() else None,
           "mae": cal["mae"], "max_error": cal["max_error"], "spearman": cal["spearman"]}
    if figure == "speedup":
        out["regret"] = cal["regret"]
    return out


def summarize(records: list[dict]) -> dict:
    """Metrics over the validated cells: one :func:`figure_metrics` entry per figure, and
    ``recommendation``: the first record's cell, predicted speedup with interval, realized
    speedup, ``inside`` (None without an interval) and ``regret`` (``1 - realized / best
    realized`` among the validated cells). With cells at several batch sizes the figures are the
    smallest batch size's (the first record's), ``by_batch_size`` holds per batch size its
    :func:`batch_metrics`, and ``crossover`` the predicted and realized crossover."""
    if not records:
        raise ValueError("records must hold at least one validated cell, got none")
    sizes = sorted({int(r.get("batch_size", 1)) for r in records})
    # batch sizes are workloads, not choices, and each divides by its own plain decoding: the
    # headline figures (and the regret) are the first batch size's, the others' are by_batch_size
    head = [r for r in records if int(r.get("batch_size", 1)) == sizes[0]]
    metrics = {figure: figure_metrics(head, figure) for figure in FIGURES}
    rec = records[0]
    best = max(r["realized_speedup"] for r in head)
    metrics["recommendation"] = {
        **{k: rec[k] for k in CELL_FIELDS}, "role": rec["role"],
        **{k: rec[k] for k in ("predicted_speedup", "predicted_speedup_lo", "predicted_speedup_hi",
                               "realized_speedup")},
        "inside": rec["speedup_inside"], "regret": float(1 - rec["realized_speedup"] / best) if best > 0 else math.nan}
    if len(sizes) > 1:
        metrics["by_batch_size"] = {str(b): batch_metrics([r for r in records if int(r.get("batch_size", 1)) == b])
                                    for b in sizes}
        metrics["crossover"] = crossover(metrics["by_batch_size"])
    return metrics


def batch_metrics(records: list[dict]) -> dict:
    """One batch size's cells: the speedup's :func:`figure_metrics`, and the best cell's predicted
    and realized speedups (the best by prediction, and the best realized)."""
    best_pred = max(records, key=lambda r: r["predicted_speedup"])
    return {"speedup": figure_metrics(records, "speedup"), "cells": len(records),
            "best_predicted_speedup": best_pred["predicted_speedup"],
            "best_realized_speedup": max(r["realized_speedup"] for r in records)}


def crossover(by_batch: dict) -> dict:
    """The batch size from which plain decoding wins, predicted and realized, over the validated cells.

    From each batch size's best cell (:func:`batch_metrics`): the smallest listed batch size from
    which on no cell is predicted (realized) faster than plain decoding; None when one is at the
    largest size. ``within_one``: the two are at most one listed batch size apart (None counts
    as one place past the largest).

    >>> crossover({"1": {"best_predicted_speedup": 1.2, "best_realized_speedup": 1.1},
    ...            "4": {"best_predicted_speedup": 0.9, "best_realized_speedup": 1.02}})
    {'predicted': 4, 'realized': None, 'within_one': True}
    """
    sizes = sorted(int(b) for b in by_batch)
    pred, real = (plain_wins_from({int(b): m[key] for b, m in by_batch.items()})
                  for key in ("best_predicted_speedup", "best_realized_speedup"))
    place = lambda b: len(sizes) if b is None else sizes.index(b)  # noqa: E731
    return {"predicted": pred, "realized": real, "within_one": abs(place(pred) - place(real)) <= 1}


def allowed_misses(cells: int, level: float = INTERVAL_LEVEL, alpha: float = SHIFT_TEST_LEVEL) -> int:
    """The most cells of ``cells`` that calibrated ``level`` intervals miss, by chance, at test level
    ``alpha``: the largest ``k`` with ``P(X >= k) >= alpha``, ``X ~ Binomial(cells, 1 - level)``.

    >>> allowed_misses(13), allowed_misses(7), allowed_misses(0)
    (3, 2, 0)
    """
    p, tail, k = 1 - level, 1.0, 0  # tail = P(X >= k)
    while k < cells:
        tail -= math.comb(cells, k) * p ** k * (1 - p) ** (cells - k)
        if tail < alpha:
            break
        k += 1
    return k


def prompt_shift(metrics: dict, level: float = INTERVAL_LEVEL) -> str | None:
    """A warning when the realized acceptance falls outside its ``level`` intervals in more cells
    than :func:`allowed_misses` (the validation prompts differ from the ranked ones), else None.
    The test counts cells as independent; cells share their prompts, so it alarms somewhat more
    often than its 5% level when nothing differs.

    >>> prompt_shift({"acceptance": {"with_interval": 13, "covered": 7}})[:56]
    'your validation prompts differ from the ranked ones: the'
    >>> prompt_shift({"acceptance": {"with_interval": 13, "covered": 11}}) is None
    True
    """
    a = metrics.get("acceptance")
    if not a or not a["with_interval"]:
        return None
    n, missed = a["with_interval"], a["with_interval"] - a["covered"]
    allowed = allowed_misses(n, level)
    if missed <= allowed:
        return None
    return (f"your validation prompts differ from the ranked ones: the realized acceptance falls outside its "
            f"{level:.0%} interval in {missed} of {n} cells (at most {allowed} by chance, binomial test at "
            f"{SHIFT_TEST_LEVEL:.0%}); rank on a sample like them (data.sample, data.stratify, data.limit)")


def verdict(metrics: dict, level: float | None = None) -> str:
    """One line: the speedup figures, whether the predictions hold (module rule), and a warning
    when the validation prompts behave unlike the ranked ones (:func:`prompt_shift`; ``level``:
    the intervals' level, default 90%).

    >>> m = {"speedup": {"cells": 12, "with_interval": 12, "covered": 11, "coverage": 11 / 12, "mae": 0.04,
    ...      "max_error": 0.1, "spearman": 0.9, "regret": 0.03},
    ...      "recommendation": {"realized_speedup": 1.12, "predicted_speedup_lo": 1.05,
    ...                         "predicted_speedup_hi": 1.2, "inside": True}}
    >>> verdict(m)
    'intervals cover 11 of 12 cells (92%), Spearman 0.90, MAE 0.040, regret 3%, recommendation 1.12x inside [1.05, 1.20]: predictions hold'
    """
    shift = prompt_shift(metrics, INTERVAL_LEVEL if level is None else level)
    line = _speed_verdict(metrics)
    return line if shift is None else f"{line}; warning: {shift}"


def _speed_verdict(metrics: dict) -> str:
    s, rec = metrics["speedup"], metrics["recommendation"]
    rho = "n/a" if s["spearman"] is None or not math.isfinite(s["spearman"]) else f"{s['spearman']:.2f}"
    where = {True: "inside", False: "outside", None: "without interval"}[rec["inside"]]
    bounds = "" if rec["inside"] is None else f" [{rec['predicted_speedup_lo']:.2f}, {rec['predicted_speedup_hi']:.2f}]"
    cover = ("no predicted intervals" if s["coverage"] is None else
             f"intervals cover {s['covered']} of {s['with_interval']} cells ({s['coverage']:.0%})")
    head = (f"{cover}, Spearman {rho}, MAE {s['mae']:.3f}, regret {s['regret']:.0%}, "
            f"recommendation {rec['realized_speedup']:.2f}x {where}{bounds}")
    by_batch = metrics.get("by_batch_size") or {}
    if by_batch:  # the figures above are the first batch size's
        first = min(by_batch, key=int)
        others = [f"B={b}: {m['speedup']['covered']} of {m['speedup']['with_interval']}"
                  for b, m in sorted(by_batch.items(), key=lambda kv: int(kv[0])) if b != first and m["speedup"]]
        head = f"B={first}: {head}" + (f" (other batch sizes' intervals cover {', '.join(others)})" if others else "")
    problems = []
    if s["coverage"] is not None and s["coverage"] < MIN_COVERAGE:
        problems.append(f"intervals cover less than {MIN_COVERAGE:.0%} (too narrow)")
    if s["regret"] > MAX_REGRET:
        problems.append(f"the predicted-best cell realizes {s['regret']:.0%} below the best validated cell "
                        f"(> {MAX_REGRET:.0%})")
    if rec["inside"] is False:
        problems.append("the recommendation's realized speedup lies outside its interval")
    if problems:
        return f"{head}: predictions do not hold: {'; '.join(problems)}"
    if s["coverage"] is None or rec["inside"] is None:
        return f"{head}: intervals not checked (the ranking has none); point predictions within the regret limit"
    wide = (f" (coverage above {WIDE_COVERAGE:.0%}: the intervals may be wider than 90%)"
            if s["coverage"] > WIDE_COVERAGE else "")
    return f"{head}: predictions hold{wide}"


def _csv_value(value):
    if value is None:
        return ""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def write_validation_csv(records: list[dict], path: str | os.PathLike) -> Path:
    """``validation.csv``: one row per cell, the columns of :data:`COLUMNS` (atomic)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: _csv_value(v) for k, v in r.items()} for r in records)
    return atomic_write_text(path, buf.getvalue())


def write_summary_json(summary: dict, path: str | os.PathLike) -> Path:
    """``summary.json`` (strict JSON: NaN written as null), atomically."""
    return atomic_write_text(path, json.dumps(json_ready(summary), indent=2, allow_nan=False) + "\n")


def _num(value, fmt: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, fmt)


def _interval(rec: dict, pred: str, fmt: str) -> str:
    lo, hi = rec[f"{pred}_lo"], rec[f"{pred}_hi"]
    bounds = f" [{_num(lo, fmt)}, {_num(hi, fmt)}]" if math.isfinite(lo) and math.isfinite(hi) else ""
    return _num(rec[pred], fmt) + bounds


def format_table(records: list[dict]) -> str:
    """A fixed-width table of the cells: predicted (with interval) vs realized, ``*`` = outside."""
    mark = {True: " ", False: "*", None: " "}
    head = (f"{'#':>2} {'drafter':<14} {'target':<14} {'T':>4} {'point':<14} {'rule':<12} {'g':>2} "
            f"{'speedup pred [90%]':<22} {'real':>6}  {'accept pred [90%]':<22} {'real':>6}  "
            f"{'length pred [90%]':<22} {'real':>6}")
    lines = [head, "-" * len(head)]
    for r in records:
        point = "lossless" if r["max_divergence"] == 0 else f"{r['divergence']}<={r['max_divergence']:g}"
        rule = f"{r.get('rule', 'mentored')}:{r.get('drafting', 'sampled')[0]}"  # the rule and its drafting's initial
        lines.append(
            f"{r['cell']:>2} {r['drafter'][:14]:<14} {r['target'][:14]:<14} {r['temperature']:>4g} {point[:14]:<14} "
            f"{rule[:12]:<12} "
            f"{r['gamma']:>2} {_interval(r, 'predicted_speedup', '.2f'):<22} {_num(r['realized_speedup'], '.2f'):>6}"
            f"{mark[r['speedup_inside']]} {_interval(r, 'predicted_acceptance', '.3f'):<22} "
            f"{_num(r['realized_acceptance'], '.3f'):>6}{mark[r['acceptance_inside']]} "
            f"{_interval(r, 'predicted_mean_accepted_length', '.2f'):<22} "
            f"{_num(r['realized_mean_accepted_length'], '.2f'):>6}{mark[r['mean_accepted_length_inside']]}")
    lines.append("cell 0 is the recommendation; * = realized outside the predicted 90% interval; rule: "
                 "mdboost.md.rules name, s/g = sampled/greedy drafts")
    return "\n".join(lines)
