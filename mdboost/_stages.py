"""Seconds per stage of a long job, summed into a dict (``summary.json``'s ``seconds_by_stage``):
the cache builder times its steps with it, the pipelines theirs."""

from __future__ import annotations

import time
from contextlib import contextmanager


@contextmanager
def timed(stages: dict, name: str):
    """Add the wall-clock seconds of the ``with`` block to ``stages[name]`` (even when it raises).

    >>> stages = {}
    >>> with timed(stages, "scoring"):
    ...     pass
    >>> list(stages), stages["scoring"] >= 0
    (['scoring'], True)
    """
    start = time.perf_counter()
    try:
        yield
    finally:
        stages[name] = stages.get(name, 0.0) + time.perf_counter() - start
