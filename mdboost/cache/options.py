"""The cache's option lists and its backend check, torch-free.

Each is defined here once and re-exported where the code that uses it lives
(:data:`mdboost.cache.settings.SOURCES`, the names of :data:`mdboost.cache.settings.DTYPES`,
:func:`mdboost.cache.build.joblib_backends`), so a YAML config (``pipelines/config.py``) checks its
cache section against them before torch loads.
"""

from __future__ import annotations

__all__ = ["DTYPE_NAMES", "SOURCES", "joblib_backends"]

SOURCES = ("reference", "sampled")
"""What a folder's sequences are: teacher-forced ``reference`` text or ``sampled`` target continuations."""

DTYPE_NAMES = ("float16", "bfloat16", "float32")
"""The storage dtypes of the top-k logits, by their torch names (:data:`mdboost.cache.settings.DTYPES`)."""


def joblib_backends() -> tuple[str, ...]:
    """The joblib backend names a build can run on (registered ones and ``"dask"``, loaded on demand)."""
    from joblib.parallel import BACKENDS, EXTERNAL_BACKENDS  # deferred: joblib: only a parallel build needs it

    return tuple(sorted({*BACKENDS, *EXTERNAL_BACKENDS}))
