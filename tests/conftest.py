import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

from hypothesis import settings  # noqa: E402

# Property tests draw the same examples on every run (CI must not depend on the draw).
settings.register_profile("mdboost", derandomize=True, print_blob=True)
settings.load_profile("mdboost")


import types  # noqa: E402

import pytest  # noqa: E402


class VirtualClock:
    """A clock that moves only when a test says a model ran (``sleep``), never on its own.

    The timing code reads ``time.perf_counter``; a test that stands this clock in for it and
    advances it from forward hooks knows the exact time every step took, whatever the load of
    the machine (a real ``time.sleep`` is only a lower bound on a shared CPU)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def virtual_clock(monkeypatch):
    """The clock of mdboost's timers (the engine's step timer, the bare cost ratio's), virtual."""
    import importlib

    clock = VirtualClock()
    for name in ("mdboost.engine.generate", "mdboost.models.cost"):  # modules (the package re-exports a function named generate)
        monkeypatch.setattr(importlib.import_module(name), "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    return clock
