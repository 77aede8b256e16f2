"""Running and timing single engine steps, the clock every cost of :mod:`mdboost.engine.costs` shares.

:class:`_Run` is one fresh generation whose steps are run one by one (the engine's own step
function, drafter sessions and KV cache) and timed; :func:`_prefill_slope` fits a model's
forward time over prompt lengths; the rest are the measurements' common arguments and
conditions (thread count, load average).
"""

from __future__ import annotations

import os
import statistics
from contextlib import contextmanager

import torch

from mdboost.engine.generate import _State, _step, _Timer
from mdboost.engine.kv import LMBackend, model_device, model_vocab_size, open_lm
from mdboost.engine.settings import GenerationSettings
from mdboost.engine.stats import GenerationStats

PERIOD = 16  # tokens of the random block the prompt repeats (prompt lookup then always finds a match)
PREFILL_LENGTHS = (1, 64, 128, 256)  # prompt lengths the prefill slope is fitted over
# the unit and method of the figures below; stored measurements of another unit are measured again
# (v4: T_ar is an undrafted step that follows another one, as in plain decoding: :meth:`_Run.plain_step`)
COST_UNIT = "engine-step-wall-v4"


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
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_common(context_len, repeats, steps, warmup, threads, settings, batch_size=1) -> GenerationSettings:
    _check_positive("context_len", context_len)
    _check_positive("repeats", repeats)
    _check_positive("batch_size", batch_size)
    _check_positive("steps", steps)
    if isinstance(warmup, bool) or int(warmup) != warmup or warmup < 0:
        raise ValueError(f"warmup must be a non-negative integer, got {warmup!r}")
    if threads is not None:
        _check_positive("threads", threads)
    settings = GenerationSettings() if settings is None else settings
    if not isinstance(settings, GenerationSettings):
        raise TypeError(f"settings must be a GenerationSettings or None, got {type(settings).__name__}")
    return settings


def _check_lengths(lengths) -> None:
    try:
        ok = len(set(lengths)) >= 2 and all(not isinstance(n, bool) and int(n) == n and n >= 1 for n in lengths)
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"prefill_lengths must hold at least two distinct positive integers, got {lengths!r}")


def _prompt(vocab_size: int, context_len: int, seed: int, batch_size: int = 1) -> torch.Tensor:  # [B, context_len]
    """``batch_size`` rows, each a random block of ``min(PERIOD, context_len // 2)`` tokens (at
    least 1) repeated to ``context_len`` tokens: a context of 2 tokens or more holds its block
    twice. The rows' blocks are drawn one after another from one generator (row 0: the same
    prompt at every batch size)."""
    gen = torch.Generator().manual_seed(seed)
    width = max(1, min(PERIOD, context_len // 2))
    blocks = [torch.randint(0, vocab_size, (width,), generator=gen) for _ in range(batch_size)]
    return torch.stack([block.repeat(context_len // width + 1)[:context_len] for block in blocks])


class _Run:
    """One fresh generation from ``prompt`` whose steps are run and timed one by one."""

    def __init__(self, target, drafter, prompt, settings, seed):
        device = model_device(target)
        self.prompts = prompt.tolist()
        self.lm = open_lm(target, len(self.prompts), device)
        self.session = drafter.start(self.prompts, self.lm, settings) if drafter is not None else None
        self.state = _State(self.prompts, max_new_tokens=10 ** 9, eos_token_id=None)
        self.stats, self.timer = GenerationStats(mode="sd"), _Timer(device)
        generator = torch.Generator(device=device).manual_seed(seed)
        self.args = (settings.sampling, settings.verify_args, generator, self.stats, self.timer)
        self.generator = generator
        self.greedy = settings.temperature == 0 and not settings.lossy  # the engine's greedy path

    def step(self, limit: int, args=None) -> tuple[float, float]:
        """One engine step drafting at most ``limit`` tokens: ``(wall seconds, drafter seconds)``.

        ``args``: other ``(sampling, verify_args, generator, stats, timer)`` (an MD step), run on
        the sampling path; default: the run's own settings (greedy at temperature 0, as the engine)."""
        before = self.stats.time_drafter
        start = self.timer.now()
        _step(self.lm, self.session, self.state, limit, *(args or self.args), self.greedy and args is None)
        return self.timer.now() - start, self.stats.time_drafter - before

    def plain_step(self) -> float:
        """Wall seconds of an undrafted step as plain decoding runs it: after another undrafted
        step (untimed), not after a step of another shape.

        Plain decoding feeds one token per step, every step alike; an engine may reuse the work of
        the previous step's shape (llama.cpp reuses its compute graph when the new batch has the
        previous one's shape: ``src/llama-context.cpp``, ``process_ubatch``, and ``allow_reuse`` in
        ``src/llama-graph.h``, llama.cpp as vendored by llama-cpp-python 0.3.36), so an undrafted step
        timed right after a drafted one is not plain decoding's step: on the default GGUF it took
        about 6% longer (``docs/engine.md``, "T_ar as plain decoding runs it")."""
        self.step(0)
        return self.step(0)[0]


def _forward_seconds(model, length: int, vocab_size: int, device, seed: int, batch_size: int = 1) -> float:
    """Wall time of one forward of a fresh ``[batch_size, length]`` prompt batch through ``model``'s
    engine state (:func:`~mdboost.engine.kv.open_lm`)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (batch_size, length), generator=gen).to(device)  # [B, length]
    lm = open_lm(model, batch_size, device)
    timer = _Timer(device)
    start = timer.now()
    lm.forward(ids, torch.ones_like(ids, dtype=torch.bool), logits_to_keep=1)
    return timer.now() - start


def _slope(lengths, seconds) -> float:
    """Least-squares slope of ``seconds`` over ``lengths``."""
    mean_l, mean_s = statistics.fmean(lengths), statistics.fmean(seconds)
    num = sum((l - mean_l) * (s - mean_s) for l, s in zip(lengths, seconds))
    return num / sum((l - mean_l) ** 2 for l in lengths)


def _prefill_slope(model, target, prompt, settings, repeats: int, seed: int, lengths=PREFILL_LENGTHS) -> float:
    """``beta``: ``model``'s forward seconds per prompt token over ``T_ar``, medians over repeats.

    Each repeat times ``model``'s forward of a fresh prompt batch of ``prompt``'s rows (``B``)
    at every length in ``lengths``, interleaved with undrafted steps of the target over the
    ``B`` rows of ``prompt`` (``T_ar(B)``): the slope is per token of each row's prompt.
    """
    device, vocab = model_device(target), model_vocab_size(target)
    # llama.cpp holds one cache per model: a backend timing its own prefill starts a fresh run per length
    one_cache = model is target and isinstance(target, LMBackend)
    slopes = []
    with torch.inference_mode():
        for r in range(repeats):
            run = _Run(target, None, prompt, settings, seed + r)
            run.step(0)
            seconds, walls = [], []
            for length in lengths:
                if one_cache and length != lengths[0]:
                    run = _Run(target, None, prompt, settings, seed + r)
                    run.step(0)
                walls.append(run.plain_step())
                seconds.append(_forward_seconds(model, length, vocab, device, seed + r, prompt.shape[0]))
            slopes.append(_slope(lengths, seconds) / statistics.median(walls))
    return max(0.0, float(statistics.median(slopes)))


