"""Mentored decoding core: pure, batched tensor functions over ``[..., V]``.

Paper letters inside the math: p = drafter, q = target. Public arguments are named
``draft_probs`` / ``target_probs``. Definitions: ``docs/theory.md``.

The TV optimal set (paper Section 3.2, :mod:`mdboost.md.tv_set`) is exported here:
``tv_optimal_set``, ``is_tv_optimal``, ``project_tv_optimal``, ``tv_projection``,
``geometric_mixture``, ``BoostedMentor`` (imported on first use).
"""

from importlib import import_module

_TV_SET = ("TVOptimalSet", "TVProjection", "tv_optimal_set", "is_tv_optimal", "project_tv_optimal", "tv_projection",
           "geometric_mixture", "BoostedMentor")

__all__ = list(_TV_SET)


def __getattr__(name):
    if name in _TV_SET:
        return getattr(import_module("mdboost.md.tv_set"), name)
    raise AttributeError(f"module 'mdboost.md' has no attribute {name!r}")
