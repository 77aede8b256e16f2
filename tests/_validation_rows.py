"""Synthetic ranking rows in the per-gamma ``ranking.csv`` format (strings, as read back)."""

from __future__ import annotations

import itertools


def ranking_rows(drafters=("a", "b", "c"), temperatures=(0.7, 1.0), gammas=(1, 2, 3, 4),
                 points=(("none", 0.0), ("kl", 0.05), ("kl", 0.2), ("tv", 0.2)), bad_budget=None) -> list[dict]:
    """One row per (drafter, temperature, point, gamma), ranked by a made-up speedup.

    ``bad_budget``: rows at this budget fail the quality check. One extra row has an n-gram
    target (never a validation cell).
    """
    rows = []
    for di, drafter in enumerate(drafters):
        for t, (f, budget), g in itertools.product(temperatures, points, gammas):
            acc = min(0.95, 0.3 + 0.1 * di + 0.5 * budget + 0.05 * (t < 1))
            speed = 0.8 + 0.1 * di + 0.3 * budget - 0.02 * abs(g - 3) + 0.05 * (t < 1)
            rows.append({
                "drafter": drafter, "target": "t", "temperature": str(t), "divergence": f, "max_divergence": str(budget),
                "gamma": str(g), "best_gamma": "3", "is_best_gamma": str(g == 3),
                "predicted_speedup": f"{speed:.4f}", "predicted_speedup_lo": f"{speed - 0.05:.4f}",
                "predicted_speedup_hi": f"{speed + 0.05:.4f}",
                "engine_acceptance": f"{acc:.4f}", "engine_acceptance_lo": f"{acc - 0.03:.4f}",
                "engine_acceptance_hi": f"{acc + 0.03:.4f}", "md_acceptance": f"{acc:.4f}", "sd_acceptance": "0.3",
                "engine_mean_accepted_length": f"{1 + acc * g:.4f}", "engine_mean_accepted_length_lo": f"{0.9 + acc * g:.4f}",
                "engine_mean_accepted_length_hi": f"{1.1 + acc * g:.4f}", "md_solve": "needed", "cost_ratio": "0.2",
                "verify_cost": "1.0", "md_overhead": "0.0", "nll_target": "1.0", "nll_mentored": "1.01",
                "quality_ok": str(budget != bad_budget)})
    rows.append({**rows[0], "drafter": "t", "target": "ngram:2", "predicted_speedup": "9.0"})
    for i, r in enumerate(sorted(rows, key=lambda r: -float(r["predicted_speedup"])), start=1):
        r["rank"] = str(i)
    return rows
