"""Validation of ranked pairs: how well predicted acceptance/speedup match real runs.

- :mod:`mdboost.validation.prediction` -- per-pair absolute errors, Spearman rank
  correlation, top-pair agreement (pure numpy, no tracking).
- :mod:`mdboost.validation.plots` -- predicted-vs-realized scatter plot (matplotlib Agg).
"""

from mdboost.validation.prediction import (
    PredictionQuality,
    absolute_errors,
    prediction_quality,
    spearman,
    top_pair_agrees,
)

__all__ = ["PredictionQuality", "absolute_errors", "prediction_quality", "spearman", "top_pair_agrees"]
