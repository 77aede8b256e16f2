"""Benchmark: the ranking's predictions against the realized generation grid.

Re-scores the default pool from its cache (``configs/full.yaml``: run ``mdboost rank --config configs/full.yaml`` first;
nothing is rebuilt unless the cache is missing) at the grid's operating points -- KL budgets
0 (SD), 0.01, 0.05, 0.2, gammas 2, 4, 6, temperatures 1.0 and 0.7 -- and compares every
predicted cell (``predicted_speedup`` with its 90% interval, ``engine_mean_accepted_length``)
with the realized cell of ``bench/generation_cells.json`` (or ``--cells``): Spearman, MAE,
max error, coverage of the intervals, and the regret of the predicted-best cell, per temperature
and overall (``mdboost.validation.calibration``). Writes the ``predictions`` section of
``bench/RESULTS.md``.

Caveats printed with the figures: the grid's prompts (HumanEval/0-9, 10 x 64 tokens) are not
the ranking's (16 records of the ``cache`` split), and grid cells of one drafter come
from chunks whose AR reference may differ (``bench/_generation_report.py``). **Replicates:** a
cell measured again with other seeds (``bench/generation.py --seed N``, same prompts) is realized
as the mean over its seeds, and the seed-to-seed range is reported: it is the sampling noise a
single run carries. Intervals are widened for a run over the grid's own prompts, as validation
does (:func:`~mdboost.validation.calibration.predictive_scale`). **Reference check:** every cell's AR reference (tokens/s of
its chunk's own AR run) is compared with the median AR reference of its temperature; cells whose
reference deviates by more than :data:`REFERENCE_TOLERANCE` are flagged (their machine state
differed from the rest of the grid), and the figures are reported with and without them. The
report also states the grid's measurement conditions (date, parallel shards, load).

Usage: ``.venv/bin/python bench/predictions.py [--config configs/full.yaml] [--cells PATH] [--no-write]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import update_section  # noqa: E402
from mdboost.validation.calibration import calibration, predictive_interval, predictive_scale  # noqa: E402
from pipelines.loader import load_yaml  # noqa: E402
from pipelines.config import RankConfig  # noqa: E402

GRID_BUDGETS = (0.0, 0.01, 0.05, 0.2)
GRID_GAMMAS = (2, 4, 6)
REFERENCE_TOLERANCE = 0.15  # a chunk's AR tokens/s this far from its temperature's median: flagged


GRID_SETTINGS = dict(prompts=10, new_tokens=64)  # the grid's settings; the seed may differ (replicates)


def grid_cells(path: Path) -> dict:
    """``(drafter, temperature, budget, gamma) -> [cell, ...]``: the realized SD/MD cells of the
    grid's settings, one per seed (replicates of a cell differ only in their seed)."""
    cells = json.loads(path.read_text())["cells"]
    out = {}
    for c in cells:
        if c["mode"] in ("sd", "md") and c["temperature"] > 0 and all(c[k] == v for k, v in GRID_SETTINGS.items()):
            budget = 0.0 if c["mode"] == "sd" else float(c["budget"])
            out.setdefault((c["drafter"], float(c["temperature"]), budget, int(c["gamma"])), []).append(c)
    return {k: sorted(v, key=lambda c: c["seed"]) for k, v in out.items()}


def flag_references(cells: dict, tolerance: float = REFERENCE_TOLERANCE) -> dict:
    """``key -> (ar tokens/s, deviation from its temperature's median, flagged)`` per grid cell.

    A cell's reference is its seed-0 run's chunk (the grid's own), else its first replicate's."""
    import statistics

    ar = {k: c[0]["references"]["ar"]["tok_s"] for k, c in cells.items()}
    medians = {t: statistics.median(v for k, v in ar.items() if k[1] == t) for t in {k[1] for k in ar}}
    out = {}
    for k, v in ar.items():
        dev = v / medians[k[1]] - 1
        out[k] = (v, dev, abs(dev) > tolerance)
    return out


def conditions(path: Path) -> str:
    """The grid's measurement conditions: dates, parallel shards, 1-min load range."""
    cells = [c for c in json.loads(path.read_text())["cells"] if c["mode"] in ("sd", "md")]
    dates = sorted({c["date"][:10] for c in cells})
    shards = sorted({str(c.get("shards")) for c in cells})
    loads = [c["loadavg"] for c in cells if isinstance(c.get("loadavg"), (int, float))]
    load = f", 1-min load {min(loads):.2f}-{max(loads):.2f}" if loads else ""
    return f"measured {', '.join(dates)}, shards {', '.join(shards)}{load}"


def grid_prompts(cfg: RankConfig) -> RankConfig:
    """``cfg`` ranking the grid's own prompts (HumanEval/0-9: ``split: all``, ``limit: 10``, ``sample: head``), not
    its cache split: the same prompts on both sides, so a gap is the model's (or sampling noise),
    not the prompt set's. Its cache folders are keyed apart (the data section is in every key)."""
    data = dataclasses.replace(cfg.data, split="all", limit=GRID_SETTINGS["prompts"], sample="head", stratify=None)
    return dataclasses.replace(cfg, data=data)


def predicted_rows(cfg: RankConfig, resamples: int | None = None) -> dict:
    """The ranking (its summary, ``rows`` included) at the grid's budgets (KL only), every gamma,
    both grid temperatures; ``resamples`` overrides the bootstrap's."""
    from pipelines.rank_pool import run

    md = dataclasses.replace(cfg.md, divergences=["kl"], budgets=list(GRID_BUDGETS), temperature=None,
                             temperatures=[1.0, 0.7])
    rule = cfg.ranking if resamples is None else dataclasses.replace(cfg.ranking, resamples=resamples)
    cfg = dataclasses.replace(cfg, md=md, ranking=rule, tracking=dataclasses.replace(cfg.tracking, enabled=False),
                              output_dir=str(ROOT / "outputs" / "bench-predictions"), progress=False)
    return run(cfg)


def bootstrap_overhead(cfg: RankConfig, repeats: int = 3) -> tuple[float, list, list]:
    """Median scoring seconds with the configured bootstrap over none, interleaved ``repeats`` times."""
    import statistics

    with_b, without = [], []
    for _ in range(repeats):
        without.append(predicted_rows(cfg, resamples=0)["seconds_scoring"])
        with_b.append(predicted_rows(cfg)["seconds_scoring"])
    return statistics.median(with_b) / statistics.median(without), with_b, without


def compare(rows: list[dict], cells: dict, scale: float = 1.0) -> list[dict]:
    """One record per grid cell the ranking predicts (``flagged``: its AR reference deviates).

    ``realized`` and ``mal_realized`` are means over the cell's replicates (``seeds``; their
    range in ``realized_min``/``realized_max``); the intervals' prompt parts are widened by ``scale`` on each
    side of the point (:func:`~mdboost.validation.calibration.predictive_interval`, with the
    scale of :func:`~mdboost.validation.calibration.predictive_scale`: a run over the
    grid's own prompts, as in validation)."""
    import statistics

    flags = flag_references(cells)
    out = []
    for r in rows:
        key = (r["drafter"], float(r["temperature"]), float(r["max_divergence"]), int(r["gamma"]))
        runs = cells.get(key)
        if runs is None or r["target"] != runs[0]["target"]:
            continue
        speed = [c["speedup_vs_ar"] for c in runs]
        prompts = (r.get("predicted_speedup_prompts_lo"), r.get("predicted_speedup_prompts_hi"))
        lo, hi = predictive_interval(r["predicted_speedup"], r["predicted_speedup_lo"], r["predicted_speedup_hi"], scale,
                                     prompts if None not in prompts else None)
        mal_lo, mal_hi = predictive_interval(r["engine_mean_accepted_length"], r["engine_mean_accepted_length_lo"],
                                r["engine_mean_accepted_length_hi"], scale)
        out.append({"drafter": key[0], "temperature": key[1], "budget": key[2], "gamma": key[3],
                    "predicted": r["predicted_speedup"], "lo": lo, "hi": hi,
                    "realized": statistics.fmean(speed), "realized_min": min(speed), "realized_max": max(speed),
                    "seeds": len(runs), "mal_predicted": r["engine_mean_accepted_length"],
                    "mal_realized": statistics.fmean(c["mean_accepted_length"] for c in runs),
                    "mal_lo": mal_lo, "mal_hi": mal_hi,
                    "ar_tok_s": flags[key][0], "ar_deviation": flags[key][1], "flagged": flags[key][2]})
    return out


def noise_floor(cells: list[dict], level: float = 0.90) -> float:
    """The speedup MAE an exactly right model would still show: ``E|N(0, sigma)| = sigma sqrt(2/pi)``
    per cell, ``sigma`` the predictive interval's half-width over the normal quantile of ``level``
    (prompt and sampling noise of the run and of the ranking's estimate), averaged over cells."""
    from statistics import NormalDist, fmean

    z = NormalDist().inv_cdf(0.5 + level / 2)
    return fmean((c["hi"] - c["lo"]) / (2 * z) * (2 / math.pi) ** 0.5 for c in cells)


def _line(name: str, cells: list[dict]) -> str:
    speed = calibration([c["predicted"] for c in cells], [c["lo"] for c in cells], [c["hi"] for c in cells],
                        [c["realized"] for c in cells])
    mal = calibration([c["mal_predicted"] for c in cells], [c["mal_lo"] for c in cells],
                      [c["mal_hi"] for c in cells], [c["mal_realized"] for c in cells])
    best = max(cells, key=lambda c: c["predicted"])
    real = max(cells, key=lambda c: c["realized"])
    return (f"| {name} | {speed.cells} | {speed.spearman:.3f} | {speed.mae:.3f} | {noise_floor(cells):.3f} | "
            f"{speed.max_error:.3f} | "
            f"{speed.coverage:.0%} | {speed.regret:.1%} | {best['drafter']} g{best['gamma']} D{best['budget']:g} "
            f"({best['predicted']:.2f} pred, {best['realized']:.2f} real) | {real['drafter']} g{real['gamma']} "
            f"D{real['budget']:g} ({real['realized']:.2f}) | {mal.mae:.3f} | {mal.coverage:.0%} |")


def replicate_line(cells: list[dict]) -> str:
    """The seed-to-seed spread of the replicated cells (sampling noise of a single run)."""
    import statistics

    reps = [c for c in cells if c["seeds"] > 1]
    if not reps:
        return "Replicates: none (every realized cell is a single run)."
    ranges = [c["realized_max"] - c["realized_min"] for c in reps]
    worst = max(reps, key=lambda c: c["realized_max"] - c["realized_min"])
    return (f"Replicates: {len(reps)} cells measured with {min(c['seeds'] for c in reps)}-"
            f"{max(c['seeds'] for c in reps)} seeds (the realized value is their mean); the speedup's range over "
            f"seeds is {statistics.median(ranges):.3f} (median), up to {max(ranges):.3f} ({worst['drafter']} "
            f"g{worst['gamma']} D{worst['budget']:g} T={worst['temperature']:g}: {worst['realized_min']:.2f}-"
            f"{worst['realized_max']:.2f}): a single run's error of that order is sampling noise, not the model's.")


TABLE_HEAD = ["", "| cells | n | Spearman | MAE | MAE noise floor | max err | coverage | regret | predicted best | "
              "realized best | MAL MAE | MAL coverage |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]


def table(cells: list[dict], reference_check: bool = False) -> list[str]:
    """The comparison's table lines: per temperature, both, without prompt lookup (the drafter
    whose text depends most on the prompts), optionally the cells whose AR reference passed the
    check, and the replicated cells."""
    lines = list(TABLE_HEAD)
    for t in sorted({c["temperature"] for c in cells}, reverse=True):
        lines.append(_line(f"T = {t:g}", [c for c in cells if c["temperature"] == t]))
    lines.append(_line("both", cells))
    lines.append(_line("both, without ngram:3", [c for c in cells if not c["drafter"].startswith("ngram")]))
    kept = [c for c in cells if not c["flagged"]]
    if reference_check and len(kept) < len(cells):
        lines.append(_line("both, reference check passed", kept))
    reps = [c for c in cells if c["seeds"] > 1]
    if reps:
        lines.append(_line("both, replicated cells only", reps))
    return lines


def report(cells: list[dict], cfg: RankConfig, grid_conditions: str = "", scale: float = 1.0,
           prompts: int | None = None) -> str:
    lines = [
        "## Ranking predictions vs the realized generation grid",
        "_`bench/predictions.py`: the default pool re-scored from its cache at the grid's points (KL 0 / 0.01 / "
        "0.05 / 0.2, gamma 2 / 4 / 6), compared with `bench/generation_cells.json`. Speedup: predicted vs realized "
        "over the same process's AR (mean over the cell's seeds where replicated); MAL: mean accepted length. "
        f"Coverage: realized inside the predicted 90% interval (bootstrap over {prompts or cfg.data.limit} ranking "
        f"prompts), widened x{scale:.2f} for a run over the grid's {GRID_SETTINGS['prompts']} prompts as in "
        "validation. MAE noise floor: the MAE an exactly right model would still show from that noise "
        "(`noise_floor`: sigma sqrt(2/pi) per cell, sigma from the predictive interval). Caveats: the grid ran on HumanEval/0-9, the ranking on its own cache prompts; grid "
        f"conditions: {grid_conditions or 'not recorded'}._",
    ] + table(cells, reference_check=True)
    flagged = sorted({(c["drafter"], c["temperature"], round(c["ar_tok_s"], 2), round(100 * c["ar_deviation"]))
                      for c in cells if c["flagged"]})
    goals = ("Goals (issue text): Spearman >= 0.97, MAE <= 0.03, predicted best within 5% of the realized best "
             "(regret <= 5%), mean accepted length MAE <= 0.1.")
    flag_text = ("Cells whose chunk's AR reference deviates from their temperature's median by more than "
                 f"{REFERENCE_TOLERANCE:.0%}: " + ("; ".join(f"{d} T={t:g} ({a} tok/s, {p:+d}%)" for d, t, a, p in flagged)
                                                  if flagged else "none") + ".")
    return "\n".join(lines + ["", replicate_line(cells), "", flag_text, "", goals])


def same_prompts_report(cells: list[dict], prompts: int, scale: float) -> str:
    """The comparison with the ranking run on the grid's own prompts (:func:`grid_prompts`)."""
    lines = [
        "### The ranking on the grid's own prompts",
        f"_The same comparison with the pool ranked on HumanEval/0-9 ({prompts} prompts, the grid's): no prompt-set "
        f"difference. Intervals widened x{scale:.2f} (`predictive_scale`, as if the run's prompts were new: an upper "
        "bound here, since the prompts' own effect is shared and only the texts sampled on them differ)._",
    ]
    return "\n".join(lines + table(cells))


def grid_arguments(description: str) -> argparse.Namespace:
    """``--config``, ``--cells`` and ``--no-write``, the options of the scripts comparing with the grid."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--config", default="configs/full.yaml")
    ap.add_argument("--cells", type=Path, default=ROOT / "bench" / "generation_cells.json")
    ap.add_argument("--no-write", action="store_true")
    return ap.parse_args()


def main() -> None:
    args = grid_arguments(__doc__.splitlines()[0])
    cfg = load_yaml(ROOT / args.config, RankConfig)
    summary = predicted_rows(cfg)
    prompts = summary["bootstrap"]["prompts"]
    scale = predictive_scale(prompts, GRID_SETTINGS["prompts"])
    cells = compare(summary["rows"], grid_cells(args.cells), scale)
    if not cells:
        raise SystemExit("no grid cell matched a ranking row (wrong target or pool?)")
    ratio, with_b, without = bootstrap_overhead(cfg)
    text = report(cells, cfg, conditions(args.cells), scale, prompts) + (
        f"\n\nBootstrap cost: scoring with {cfg.ranking.resamples} resamples takes {ratio:.3f}x the time without "
        f"(median of 3 interleaved runs each: {sorted(round(x, 1) for x in with_b)} s vs "
        f"{sorted(round(x, 1) for x in without)} s; goal <= 1.10x).")
    same = predicted_rows(grid_prompts(cfg))
    n_same = same["bootstrap"]["prompts"]
    same_scale = predictive_scale(n_same, GRID_SETTINGS["prompts"])
    same_cells = compare(same["rows"], grid_cells(args.cells), same_scale)
    text += "\n\n" + same_prompts_report(same_cells, n_same, same_scale)
    print(text)
    if not args.no_write:
        update_section("predictions", text)


if __name__ == "__main__":
    main()
