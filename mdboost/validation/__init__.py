"""Validation of ranked pairs: how well predicted acceptance/speedup match real runs.

- :mod:`mdboost.validation.points` -- ranked operating points run for real (AR, SD, MD on
  held-out prompts), the speed model at realized acceptance, HumanEval pass@1.
- :mod:`mdboost.validation.runs` -- interleaved generation runs and their statistics.
- :mod:`mdboost.validation.prediction` -- per-pair absolute errors, Spearman rank
  correlation, top-pair agreement (pure numpy, no tracking).
- :mod:`mdboost.validation.plots` -- predicted-vs-realized scatter plot (matplotlib Agg).
"""

from mdboost.validation.points import (
    heldout_prompts,
    iid_acceptance_errors,
    model_speedup,
    point_key,
    points_quality,
    select_points,
    validate_point,
)
from mdboost.validation.prediction import (
    PredictionQuality,
    absolute_errors,
    prediction_quality,
    spearman,
    top_pair_agrees,
)

__all__ = ["PredictionQuality", "absolute_errors", "heldout_prompts", "iid_acceptance_errors", "model_speedup",
           "point_key", "points_quality", "prediction_quality", "select_points", "spearman", "top_pair_agrees",
           "validate_point"]
