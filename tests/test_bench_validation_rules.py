"""bench/validation_rules.py renders a validation summary: one row per cell, the goal met or not."""

import math

from bench.validation_rules import render


def _cell(i, rule, inside=True, floor=0.0):
    return {"cell": i, "drafter": "d", "temperature": 0.7, "divergence": "kl", "max_divergence": 0.0, "rule": rule,
            "drafting": "greedy", "draft_p_min": floor, "gamma": 2, "predicted_speedup": 1.1,
            "predicted_speedup_lo": 1.0, "predicted_speedup_hi": 1.2, "realized_speedup": 1.05,
            "predicted_acceptance": 0.5, "predicted_acceptance_lo": 0.4, "predicted_acceptance_hi": 0.6,
            "realized_acceptance": math.nan if not inside else 0.5, "speedup_inside": True, "acceptance_inside": inside}


def _summary(cells, covered):
    n = len(cells)
    return {"cells": cells, "verdict": "v", "generation": {"first_prompt": 0, "prompts": 10, "max_new_tokens": 64},
            "metrics": {"speedup": {"covered": covered, "with_interval": n, "coverage": covered / n},
                        "acceptance": {"covered": n, "with_interval": n}}}


def test_goal_met_needs_twelve_cells_four_rules_and_coverage_in_band():
    rules = ["match", "threshold", "rejection", "block"] * 3
    cells = [_cell(i, r, floor=0.5 if i == 0 else 0.0) for i, r in enumerate(rules)]
    text = render(_summary(cells, 11))
    assert "| 0 | d | 0.7 | lossless | match:greedy:p0.5 | 2 |" in text and ": met on this run" in text
    assert ": not met" in render(_summary(cells, 12))  # 100% coverage: intervals too wide
    assert ": not met" in render(_summary(cells[:11], 10))  # 11 cells
    assert ": not met" in render(_summary([_cell(i, "match") for i in range(12)], 11))  # one rule
    cells[3] = _cell(3, "block", inside=False)
    assert ": not met" in render(_summary(cells, 11)) and "| nan |" in render(_summary(cells, 11))
