"""A drafter's engine-step cost ``c`` (:mod:`mdboost.engine.costs`)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from mdboost.engine.costs._timing import (ENGINE_THREADS, PREFILL_LENGTHS, _check_common, _check_lengths, _load,
                                          _prefill_slope, _prompt, _quantile, _Run, torch_threads)
from mdboost.engine.drafting import ModelDrafter, NgramAdapter, as_drafter
from mdboost.engine.settings import GenerationSettings


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
    prefill_per_token : float, default=0.0
        The drafter's own prefill cost per prompt token in ``T_ar`` (the module docstring); 0
        for prompt lookup (no model).
    """

    samples: list[float]
    method: str
    threads: int
    load_before: float
    load_after: float
    prefill_per_token: float = 0.0

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

    def to_dict(self) -> dict:
        """The JSON form stored with the cache (a drafter's entry of :mod:`mdboost.cache.speed`)."""
        return {"median": self.median, "samples": list(self.samples), "prefill_per_token": self.prefill_per_token,
                "method": self.method, "threads": self.threads, "load_before": self.load_before,
                "load_after": self.load_after}

    def describe(self) -> str:
        """``"0.612 [0.590, 0.650] (5-95%, 21 repeats, 1 threads, load 0.40)"``."""
        lo, hi = self.spread()
        return (f"{self.median:.3f} [{lo:.3f}, {hi:.3f}] (5-95%, {len(self.samples)} repeats, "
                f"{self.threads} threads, load {self.load_before:.2f})")


def _repeat(target, drafter, prompt, settings, steps: int, warmup: int, seed: int) -> float:
    """One fresh generation: prefill, then ``warmup + steps`` (drafted, undrafted) step pairs."""
    run = _Run(target, drafter, prompt, settings, seed)
    drafter_time = draft_tokens = step_time = 0.0
    lookup = isinstance(drafter, NgramAdapter)
    with torch.inference_mode():
        run.step(0)  # prefill: the prompt through the target, one token
        for i in range(warmup + steps):
            d_tokens = run.stats.num_draft_tokens
            if lookup:  # the proposal on the periodic prompt: a match, a full-length draft
                start = run.timer.now()
                lengths = run.session.propose(run.prompts, settings.gamma, run.generator)[2]
                d_time = run.timer.now() - start
                run.stats.num_draft_tokens += sum(lengths)
            else:
                d_time = run.step(settings.gamma)[1]
            wall = run.step(0)[0]
            if i >= warmup:
                drafter_time += d_time
                draft_tokens += run.stats.num_draft_tokens - d_tokens
                step_time += wall
    if not draft_tokens:
        raise RuntimeError("the drafter proposed no token in a whole repeat; its cost per draft token is undefined")
    return (drafter_time / draft_tokens) / (step_time / steps)


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
    prefill_lengths=PREFILL_LENGTHS,
) -> CostMeasurement:
    """Measure ``c`` = drafter time per draft token / ``T_ar`` (an undrafted step), in the engine.

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
    prefill_lengths : sequence of int, default=PREFILL_LENGTHS
        Prompt lengths of the prefill slope (at least two distinct), timed in ``repeats // 3``
        (at least 3) further repeats.

    Returns
    -------
    CostMeasurement
        With ``prefill_per_token`` for a model drafter (:class:`~mdboost.engine.drafting.ModelDrafter`).
    """
    settings = _check_common(context_len, repeats, steps, warmup, threads, settings)
    _check_lengths(prefill_lengths)
    drafter = as_drafter(drafter)
    device = next(target.parameters()).device
    prompt = _prompt(target.config.get_text_config().vocab_size, context_len, seed).to(device)
    with torch_threads(threads):
        load_before, used = _load(), torch.get_num_threads()
        samples = [_repeat(target, drafter, prompt, settings, steps, warmup, seed + r) for r in range(repeats)]
        prefill = (_prefill_slope(drafter.model, target, prompt, settings, max(3, repeats // 3), seed,
                                  prefill_lengths) if isinstance(drafter, ModelDrafter) else 0.0)
        load_after = _load()
    method = (f"engine steps: {repeats} repeats (fresh generations), each {steps} interleaved pairs of a drafted "
              f"step (gamma {settings.gamma}, temperature {settings.temperature:g}) and an undrafted step after "
              f"{warmup} warm-up pairs, prompt {context_len} tokens; drafter seconds per draft token over the "
              f"undrafted step's wall time; {device.type}, {used} threads, 1-min load "
              f"{load_before:.2f} -> {load_after:.2f}")
    return CostMeasurement([float(s) for s in samples], method, used, load_before, load_after, prefill)
