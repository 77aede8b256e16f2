"""The drafter cost ratio ``c`` as the engine pays it (``docs/theory.md``, "Speed model for ranking").

:func:`measure_engine_cost` times the engine's own steps (:func:`mdboost.engine.generate`'s
step function, its drafter session and :class:`~mdboost.engine.kv.CachedLM`), not bare model
forwards: a drafted step costs the drafter's forwards *plus* what the engine does per draft
token (``logits_to_probs`` over the whole vocabulary, the multinomial draw, the Python loop,
the shared-KV layer view of an early exit, the one-hot ``p`` of prompt lookup), and a target
step is the engine's single-token step (its forward and ``logits_to_probs``). For a drafter
whose forward is cheap that overhead is a large share of ``c``.

Each repeat is a fresh generation from the same prompt: after an untimed prefill it runs
``warmup + steps`` pairs of one drafted step (``gamma`` drafts) and one undrafted
single-token target step, interleaved so that both see the same machine load; the repeat's
sample is (drafter seconds per draft token) / (target seconds per step) over its ``steps``
timed pairs. The prompt repeats a random block of (up to) :data:`PERIOD` tokens; a prompt-lookup
drafter (:class:`~mdboost.engine.drafting.NgramAdapter`) makes its proposal, as the engine's
session makes it, on that prompt (a match: a full-length draft), since the target's sampled
tokens soon leave the period and lookup in random tokens then finds nothing.

The result keeps every sample with its median and spread, at a fixed torch thread count (the
engine's benchmarks run at 1 thread; with 2 threads on a loaded 2-core CPU the int8
drafter's ratio varied from 0.5 to 1.0 between runs where 1 thread gave 0.34 each time), and
the 1-minute load average before and after.
"""

from __future__ import annotations

import os
import statistics
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from mdboost.engine.drafting import NgramAdapter, as_drafter
from mdboost.engine.generate import _State, _step, _Timer
from mdboost.engine.kv import CachedLM
from mdboost.engine.settings import GenerationSettings
from mdboost.engine.stats import GenerationStats

PERIOD = 16  # tokens of the random block the prompt repeats (prompt lookup then always finds a match)


def _quantile(values, q: float) -> float:
    """Linear-interpolation quantile ``q`` in ``[0, 1]`` of ``values`` (numpy's default)."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (pos - low) * (ordered[high] - ordered[low])


@dataclass(frozen=True)
class CostMeasurement:
    """Repeated measurements of a drafter's cost ratio ``c`` against its target.

    Attributes
    ----------
    samples : list of float
        One ``c`` per repeat, in measurement order.
    method : str
        How it was measured, with the thread count and the load averages.
    threads : int
        ``torch.get_num_threads()`` during the measurement.
    load_before, load_after : float
        The 1-minute load average (``os.getloadavg``) before and after; ``nan`` where the
        platform has none.
    """

    samples: list[float]
    method: str
    threads: int
    load_before: float
    load_after: float

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples))

    def spread(self, level: float = 0.9) -> tuple[float, float]:
        """The central ``level`` range of the samples: ``(q_lo, q_hi)`` at ``(1 -/+ level) / 2``.

        Examples
        --------
        >>> CostMeasurement([0.4, 0.5, 0.6], "", 1, 0.0, 0.0).spread(1.0)
        (0.4, 0.6)
        """
        if not 0 < level <= 1:
            raise ValueError(f"level must be in (0, 1], got {level!r}")
        return _quantile(self.samples, (1 - level) / 2), _quantile(self.samples, (1 + level) / 2)

    def describe(self) -> str:
        """``"0.612 [0.590, 0.650] (5-95%, 21 repeats, 1 threads, load 0.40)"``."""
        lo, hi = self.spread()
        return (f"{self.median:.3f} [{lo:.3f}, {hi:.3f}] (5-95%, {len(self.samples)} repeats, "
                f"{self.threads} threads, load {self.load_before:.2f})")


def _load() -> float:
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return float("nan")


# the torch thread count cost ratios are measured at; realized runs that are compared with the
# predictions (``mdboost validate``) use it too, so prediction and realization share one setting
ENGINE_THREADS = 1


@contextmanager
def torch_threads(threads: int | None):
    """Run the block with ``torch.set_num_threads(threads)`` (``None``: as is), then restore."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _check_positive(name: str, value) -> None:
    if int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _prompt(vocab_size: int, context_len: int, seed: int) -> torch.Tensor:  # [1, context_len]
    """A random block of ``min(PERIOD, context_len // 2)`` tokens (at least 1), repeated to
    ``context_len`` tokens: a context of 2 tokens or more holds its block twice."""
    gen = torch.Generator().manual_seed(seed)
    block = torch.randint(0, vocab_size, (max(1, min(PERIOD, context_len // 2)),), generator=gen)
    return block.repeat(context_len // block.numel() + 1)[:context_len][None]


def _repeat(target, drafter, prompt, settings, steps: int, warmup: int, seed: int) -> float:
    """One fresh generation: prefill, then ``warmup + steps`` (drafted, undrafted) step pairs."""
    device = next(target.parameters()).device
    prompts = prompt.tolist()
    lm = CachedLM(target, len(prompts), device)
    session = drafter.start(prompts, lm, settings)
    state = _State(prompts, max_new_tokens=10 ** 9, eos_token_id=None)
    stats, timer = GenerationStats(mode="sd"), _Timer(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    args = (settings.sampling, settings.verify_args, generator, stats, timer)
    drafter_time = draft_tokens = target_time = 0.0
    lookup = isinstance(drafter, NgramAdapter)
    with torch.inference_mode():
        _step(lm, session, state, 0, *args)  # prefill: the prompt through the target, one token
        for i in range(warmup + steps):
            d_time, d_tokens = stats.time_drafter, stats.num_draft_tokens
            if lookup:  # the proposal on the periodic prompt: a match, a full-length draft
                start = timer.now()
                lengths = session.propose(prompts, settings.gamma, generator)[2]
                stats.time_drafter += timer.now() - start
                stats.num_draft_tokens += sum(lengths)
            else:
                _step(lm, session, state, settings.gamma, *args)
            t_time = stats.time_target
            _step(lm, session, state, 0, *args)
            if i >= warmup:
                drafter_time += stats.time_drafter - d_time
                draft_tokens += stats.num_draft_tokens - d_tokens
                target_time += stats.time_target - t_time
    if not draft_tokens:
        raise RuntimeError("the drafter proposed no token in a whole repeat; its cost per draft token is undefined")
    return (drafter_time / draft_tokens) / (target_time / steps)


def measure_engine_cost(
    drafter,
    target,
    *,
    context_len: int = 128,
    repeats: int = 21,
    steps: int = 4,
    warmup: int = 2,
    settings: GenerationSettings | None = None,
    threads: int | None = ENGINE_THREADS,
    seed: int = 0,
) -> CostMeasurement:
    """Measure ``c`` = drafter time per draft token / target time per single-token step, in the engine.

    Parameters
    ----------
    drafter : Drafter, transformers causal LM or NgramDrafter
        Converted with :func:`~mdboost.engine.drafting.as_drafter` (a pool member's ``model``,
        or its ``ngram`` for prompt lookup); must share ``target``'s vocabulary.
    target : transformers causal LM
    context_len : int, default=128
        Prompt tokens (a random block of :data:`PERIOD` tokens, or half the prompt if
        shorter, repeated), ``>= 1`` (``>= 2`` for prompt lookup to find its match).
    repeats : int, default=21
        Samples, one fresh generation each, ``>= 1``.
    steps, warmup : int, default=4, 2
        Timed (``>= 1``) and untimed (drafted, undrafted) step pairs per repeat.
    settings : GenerationSettings, optional
        Sampling and draft length ``gamma`` of the drafted steps (default:
        ``GenerationSettings()``: temperature 1, ``gamma`` 4, lossless verification).
    threads : int or None, default=1
        ``torch.set_num_threads`` during the measurement (restored after); ``None``: as is.
    seed : int
        Seeds the prompt and the sampling generator.

    Returns
    -------
    CostMeasurement
    """
    _check_positive("context_len", context_len)
    _check_positive("repeats", repeats)
    _check_positive("steps", steps)
    if int(warmup) != warmup or warmup < 0:
        raise ValueError(f"warmup must be a non-negative integer, got {warmup!r}")
    if threads is not None:
        _check_positive("threads", threads)
    settings = GenerationSettings() if settings is None else settings
    if not isinstance(settings, GenerationSettings):
        raise TypeError(f"settings must be a GenerationSettings or None, got {type(settings).__name__}")
    drafter = as_drafter(drafter)
    device = next(target.parameters()).device
    prompt = _prompt(target.config.get_text_config().vocab_size, context_len, seed).to(device)
    with torch_threads(threads):
        load_before, used = _load(), torch.get_num_threads()
        samples = [_repeat(target, drafter, prompt, settings, steps, warmup, seed + r) for r in range(repeats)]
        load_after = _load()
    method = (f"engine steps: {repeats} repeats (fresh generations), each {steps} interleaved pairs of a drafted "
              f"step (gamma {settings.gamma}, temperature {settings.temperature:g}) and a single-token target "
              f"step after {warmup} warm-up pairs, prompt {context_len} tokens; drafter seconds per draft token "
              f"over target seconds per step; {device.type}, {used} threads, 1-min load "
              f"{load_before:.2f} -> {load_after:.2f}")
    return CostMeasurement([float(s) for s in samples], method, used, load_before, load_after)
