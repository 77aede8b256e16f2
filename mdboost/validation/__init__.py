"""Validation of a ranking: its cells run for real, predicted vs realized, with a verdict.

- :mod:`mdboost.validation.cells` -- which cells to validate (the recommendation and a spread
  over the space) and the sampling settings, taken from the ranking and checked.
- :mod:`mdboost.validation.points` -- cells run for real (AR interleaved with SD / MD on
  held-out prompts), the speed model at realized acceptance, HumanEval pass@1.
- :mod:`mdboost.validation.runs` -- interleaved generation runs and their statistics.
- :mod:`mdboost.validation.report` -- per-cell records, metrics over cells, the verdict line,
  ``validation.csv`` / ``summary.json`` and the terminal table.
- :mod:`mdboost.validation.calibration` -- coverage, regret and errors of one figure.
- :mod:`mdboost.validation.prediction` -- absolute errors, Spearman rank correlation,
  top-pair agreement (pure numpy, no tracking).
- :mod:`mdboost.validation.plots` -- predicted-vs-realized scatter plot (matplotlib Agg).
"""

from mdboost.validation.calibration import Calibration, calibration, coverage, regret
from mdboost.validation.cells import cell_key, check_md_solve, complete_rows, resolve_sampling, select_cells
from mdboost.validation.points import heldout_prompts, model_speedup, realize_cells
from mdboost.validation.prediction import (
    PredictionQuality,
    absolute_errors,
    prediction_quality,
    spearman,
    top_pair_agrees,
)
from mdboost.validation.report import cell_record, format_table, summarize, verdict

__all__ = ["Calibration", "PredictionQuality", "absolute_errors", "calibration", "cell_key", "cell_record",
           "check_md_solve", "complete_rows", "coverage", "format_table", "heldout_prompts", "model_speedup",
           "prediction_quality", "realize_cells", "regret", "resolve_sampling", "select_cells", "spearman",
           "summarize", "top_pair_agrees", "verdict"]
