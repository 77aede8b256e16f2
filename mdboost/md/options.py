"""The core's option lists and constants, torch-free.

Each is defined here once and re-exported where the code that uses it lives (the name there is
the documented one: :data:`mdboost.md.divergences.DIVERGENCES`, :data:`mdboost.md.drafting.DRAFTING`,
:data:`mdboost.md.verify.SOLVE`, ...). This module imports nothing, so a YAML config
(``pipelines/config.py``) checks its values against them before torch loads.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MD_SOLVE", "DIVERGENCES", "DRAFTING", "FLOOR_TOP_K", "SOLVE"]

DIVERGENCES: tuple[str, ...] = ("kl", "rkl", "hellinger", "pearson", "neyman", "tv", "js")
"""Names of the shipped generators (:data:`mdboost.md.divergences.GENERATORS`, in this order)."""

DRAFTING = ("sampled", "greedy")
"""How a rule's drafts are drawn (:mod:`mdboost.md.drafting`)."""

FLOOR_TOP_K = 10
"""The logits a draft probability floor reads: llama.cpp's draft sampler is top-k 10, then softmax
(common/speculative.cpp:236-237; :func:`mdboost.md.drafting.draft_confidence`)."""

SOLVE = ("all", "reached", "needed")
"""Where :func:`mdboost.md.verify.verify` solves the clamp (its ``solve`` argument)."""

DEFAULT_MD_SOLVE = "needed"
"""Where MD verification solves the clamp unless told otherwise: the engine's default
(:class:`mdboost.engine.settings.GenerationSettings`); the ranking's speed model predicts for the
same value (:class:`mdboost.ranking.rank.ScoreSettings`), so one default serves both."""
