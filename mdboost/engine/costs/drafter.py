"""A drafter's engine-step cost ``c`` (:mod:`mdboost.engine.costs`)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch

from mdboost.engine.costs._stopping import SPREAD_RATIO, StoppingRule, central_range, median_interval, run_alone
from mdboost.engine.costs._timing import (ENGINE_THREADS, PREFILL_LENGTHS, _check_common, _check_lengths, _load,
                                          _prefill_slope, _prompt, _Run, torch_threads)
from mdboost.engine.drafting import ModelDrafter, NgramAdapter, as_drafter
from mdboost.engine.kv import model_device, model_vocab_size
from mdboost.engine.settings import GenerationSettings


@dataclass(frozen=True)
class CostMeasurement:
    """Repeated measurements of a drafter's cost ratio ``c`` against its target, at one batch size.

    Attributes
    ----------
    samples : list of float
        One ``c`` per repeat, in measurement order (``repeats_run`` of them).
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
    batch_size : int, default=1
        Rows ``B`` of every timed step: ``c(B)`` is the drafter's seconds per draft position
        of the ``B``-row batch over ``T_ar(B)``.
    step_seconds : float, default=nan
        The median over repeats of ``T_ar(B)`` itself (seconds).
    rule : StoppingRule or None, default=None
        How many repeats ran (``docs/engine.md``, "Costs measured once, well"); None: not recorded.
    stopped : {"tight", "spread", "max_repeats"} or None, default=None
        Why the repeats stopped.
    c_interval : tuple of float or None, default=None
        The 90% sign-test interval of the median ``c`` (None below 5 repeats).
    """

    samples: list[float]
    method: str
    threads: int
    load_before: float
    load_after: float
    prefill_per_token: float = 0.0
    batch_size: int = 1
    step_seconds: float = math.nan
    rule: StoppingRule | None = None
    stopped: str | None = None
    c_interval: tuple[float, float] | None = None

    @property
    def repeats_run(self) -> int:
        return len(self.samples)

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
        return central_range(self.samples, level)

    def to_dict(self) -> dict:
        """The JSON form stored with the cache (a drafter's entry of :mod:`mdboost.cache.speed`)."""
        return {"median": self.median, "samples": list(self.samples), "prefill_per_token": self.prefill_per_token,
                "method": self.method, "threads": self.threads, "load_before": self.load_before,
                "load_after": self.load_after, "batch_size": self.batch_size, "step_seconds": self.step_seconds,
                "repeats_run": self.repeats_run, "stopped": self.stopped,
                "c_interval": None if self.c_interval is None else list(self.c_interval),
                **(self.rule.to_dict() if self.rule is not None else {})}

    def describe(self) -> str:
        """``"0.612 [0.590, 0.650] (5-95%, 21 repeats, 1 threads, load 0.40)"``."""
        lo, hi = self.spread()
        return (f"{self.median:.3f} [{lo:.3f}, {hi:.3f}] (5-95%, {len(self.samples)} repeats, "
                f"{self.threads} threads, load {self.load_before:.2f})")


def _repeat(target, drafter, prompt, settings, steps: int, warmup: int, seed: int) -> tuple[float, float]:
    """One fresh generation of ``prompt``'s ``B`` rows: prefill, then ``warmup + steps`` (drafted,
    undrafted) step pairs, each undrafted step timed after an untimed one (``_Run.plain_step``). Returns ``(c(B), T_ar(B) seconds)``: the drafter's seconds per draft
    position of the batch (its draft tokens over ``B``) over the mean undrafted step."""
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
            wall = run.plain_step()
            if i >= warmup:
                drafter_time += d_time
                draft_tokens += run.stats.num_draft_tokens - d_tokens
                step_time += wall
    if not draft_tokens:
        raise RuntimeError("the drafter proposed no token in a whole repeat; its cost per draft token is undefined")
    return (drafter_time / (draft_tokens / prompt.shape[0])) / (step_time / steps), step_time / steps


def cost_repeats(
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
    batch_size: int = 1,
    min_repeats: int = 5,
    rel_tol: float = 0.02,
    spread_ratio: float = SPREAD_RATIO,
):
    """Measure ``c`` = drafter time per draft position / ``T_ar`` (an undrafted step), in the engine,
    one repeat per step of the generator.

    :func:`measure_engine_cost` runs it to the end; :func:`mdboost.engine.costs.run_in_turn`
    interleaves its repeats with other measurements'. The arguments are checked at the call.

    Parameters
    ----------
    drafter : Drafter, transformers causal LM or NgramDrafter
        Converted with :func:`~mdboost.engine.drafting.as_drafter` (a pool member's ``model``,
        or its ``ngram`` for prompt lookup); must share ``target``'s vocabulary.
    target : transformers causal LM
    context_len : int, default=128
        Prompt tokens per row (a random block of :data:`PERIOD` tokens, or half the prompt if
        shorter, repeated), ``>= 1`` (``>= 2`` for prompt lookup to find its match).
    repeats : int, default=21
        Samples at most, one fresh generation each, ``>= 1`` (the stopping rule below).
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
        Prompt lengths of the prefill slope (at least two distinct), timed in ``repeats_run // 3``
        (at least 3) further repeats.
    batch_size : int, default=1
        Rows ``B`` of the prompt (each its own random block; row 0 the prompt of ``B = 1``) and
        of every timed step and prefill forward: ``c(B)`` = drafter seconds per draft position of
        the batch (its draft tokens / ``B``) over ``T_ar(B)``, the undrafted ``B``-row step.
    min_repeats : int, default=5
        Repeats before the stopping rule may stop, ``>= 1``.
    rel_tol : float, default=0.02
        Stop once the 90% sign-test interval of the median ``c`` has half-width ``<= rel_tol *
        c`` (:class:`StoppingRule`; ``docs/engine.md``, "Costs measured once, well").
    spread_ratio : float, default=SPREAD_RATIO
        Or once that half-width is ``<= spread_ratio`` times half the central 90% range of the
        single repeats (the median known within their spread, :class:`StoppingRule`);
        ``rel_tol = spread_ratio = 0``: always run ``repeats``.

    Yields
    ------
    tuple
        ``(repeats run, repeats, half-width / |median|)`` after each repeat (``inf`` below 5 repeats).

    Returns
    -------
    CostMeasurement
        The generator's return value (``StopIteration.value``), with ``prefill_per_token`` for a
        model drafter (:class:`~mdboost.engine.drafting.ModelDrafter`).
    """
    settings = _check_common(context_len, repeats, steps, warmup, threads, settings, batch_size)
    rule = StoppingRule(repeats, min_repeats, rel_tol, spread_ratio)
    _check_lengths(prefill_lengths)
    drafter = as_drafter(drafter)
    device = model_device(target)
    prompt = _prompt(model_vocab_size(target), context_len, seed, batch_size).to(device)

    def run():  # the repeats, then the measurement: checked above, at the call, not at the first repeat
        samples, walls, load = [], [], []

        def one_repeat(r: int) -> None:
            with torch_threads(threads):
                load.append((_load(), torch.get_num_threads()))
                sample, wall = _repeat(target, drafter, prompt, settings, steps, warmup, seed + r)
            samples.append(float(sample))
            walls.append(wall)

        stopped = yield from rule.repeats(one_repeat, lambda: [(samples, None)])
        with torch_threads(threads):
            prefill = (_prefill_slope(drafter.model, target, prompt, settings, max(3, len(samples) // 3), seed,
                                      prefill_lengths) if isinstance(drafter, ModelDrafter) else 0.0)
            load_after = _load()
        load_before, used = load[0]
        rows = (f"{batch_size} rows x {context_len} tokens (each row its own block)" if batch_size > 1
                else f"{context_len} tokens")
        method = (f"engine steps: {len(samples)} repeats (fresh generations; {rule.describe()}, stopped: {stopped}), "
                  f"each {steps} interleaved pairs of a drafted step (gamma {settings.gamma}, temperature "
                  f"{settings.temperature:g}) and an undrafted step (after an untimed one) after {warmup} warm-up pairs, prompt {rows}; "
                  f"drafter seconds per draft {'position of the batch' if batch_size > 1 else 'token'} over the "
                  f"undrafted step's wall time; {device.type}, {used} threads, 1-min load "
                  f"{load_before:.2f} -> {load_after:.2f}")
        return CostMeasurement(samples, method, used, load_before, load_after, prefill, batch_size,
                               float(statistics.median(walls)), rule, stopped, median_interval(samples))

    return run()


def measure_engine_cost(drafter, target, *, progress=None, **options) -> CostMeasurement:
    """Measure a drafter's ``c``: :func:`cost_repeats` run alone, to the end.

    ``options``: :func:`cost_repeats`'s keyword arguments; ``progress``, when given, is called
    after each repeat with ``(repeats run, repeats, half-width / |median|)`` (``inf`` below 5 repeats).
    """
    return run_alone(cost_repeats(drafter, target, **options), progress)
