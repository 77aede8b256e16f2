"""Seconds per stage of a long job, summed into a dict (``summary.json``'s ``seconds_by_stage``):
the cache builder times its steps with it, the pipelines theirs; and :func:`ticking`, the elapsed
time of a step that reports no progress of its own (a job never goes silent for long)."""

from __future__ import annotations

import threading
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


@contextmanager
def ticking(desc: str, enabled: bool = True, every: float = 5.0):
    """Show ``desc`` with its elapsed time, redrawn every ``every`` seconds until the block ends.

    For one long call that reports nothing while it runs (loading and converting models): a
    progress bar without a total, redrawn by a daemon thread, so the terminal sees the step and
    its time instead of silence. ``enabled=False`` shows nothing (a job's ``progress: false``).

    >>> with ticking("a step", enabled=False):
    ...     pass
    """
    if not enabled:
        yield
        return
    # deferred: tqdm draws only when enabled
    from tqdm.auto import tqdm

    bar = tqdm(total=None, desc=desc, bar_format="{desc}: {elapsed}", mininterval=0)
    stop = threading.Event()

    def redraw():
        while not stop.wait(every):
            bar.refresh()

    thread = threading.Thread(target=redraw, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        bar.close()
