"""The ranking's option lists and defaults, torch-free.

Each is defined here once and re-exported where the code that uses it lives
(:data:`mdboost.ranking.rank.MD_MODES`, :data:`mdboost.ranking.rows.PAIR_MODES`,
:data:`mdboost.ranking.uncertainty.DEFAULT_RESAMPLES`, ...; the rules of
:data:`mdboost.ranking.rule_points.RULES` by their names). This module imports nothing, so a YAML
config (``pipelines/config.py``) checks its values against them before torch loads.
"""

from __future__ import annotations

__all__ = ["BOOSTING_ORDERS", "DEFAULT_LEVEL", "DEFAULT_RESAMPLES", "MD_MODES", "PAIR_MODES", "RULE_NAMES",
           "TV_MENTORS"]

MD_MODES = ("exact", "bound")
"""How MD's operating points are solved (:class:`mdboost.ranking.rank.ScoreSettings` ``mode``)."""

TV_MENTORS = ("clamp", "boosted")
"""What TV points emit (:class:`mdboost.ranking.rank.ScoreSettings` ``tv_mentor``)."""

BOOSTING_ORDERS = ("target_first", "greedy")
"""The pair boosting runs (:class:`mdboost.ranking.rank.ScoreSettings` ``orders``)."""

PAIR_MODES = ("target", "all")
"""Which pairs of a pool are ranked (:func:`mdboost.ranking.rows.select_pairs`)."""

RULE_NAMES = ("mentored", "rejection", "block", "threshold", "match")
"""The verification rules the ranking scores, by their :attr:`mdboost.md.rules.Rule.name`, in order
(:data:`mdboost.ranking.rule_points.RULES` maps them to their classes)."""

DEFAULT_RESAMPLES = 1000
"""Bootstrap resamples of the prompts (:class:`mdboost.ranking.uncertainty.BootstrapSettings`)."""

DEFAULT_LEVEL = 0.9
"""Nominal coverage of the intervals (:class:`mdboost.ranking.uncertainty.BootstrapSettings`)."""
