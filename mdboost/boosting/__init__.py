"""Multiclass self-normalized boosting (paper Section 4).

Definitions: ``docs/theory.md``, "Multiclass self-normalized boosting".

- :mod:`mdboost.boosting.labels` -- label coding ``y_ij`` and label scores ``y_i^T h``.
- :mod:`mdboost.boosting.margins` -- one boosting round, the margin bound and risk.
- :mod:`mdboost.boosting.scorers` -- the fixed scorers of pool mode (LLMs over a logit cache), the pool round.
- :mod:`mdboost.boosting._weak` -- estimator mode's weak learner (private).
- :mod:`mdboost.boosting.estimator` -- :class:`SelfNormalizedBoostClassifier`.
"""

from mdboost.boosting.estimator import LOG_PROBA_FLOOR, SelfNormalizedBoostClassifier
from mdboost.boosting.labels import LabelSets, encode_labels, label_scores, label_scores_from_sums
from mdboost.boosting.margins import EDGE_EPS, edge_step, margin_bound, margin_risk
from mdboost.boosting.scorers import FixedScorer, TableScorer

__all__ = [
    "EDGE_EPS",
    "LOG_PROBA_FLOOR",
    "FixedScorer",
    "LabelSets",
    "SelfNormalizedBoostClassifier",
    "TableScorer",
    "edge_step",
    "encode_labels",
    "label_scores",
    "label_scores_from_sums",
    "margin_bound",
    "margin_risk",
]
