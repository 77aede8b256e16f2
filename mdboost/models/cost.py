"""A quick, bare estimate of a drafter's cost ratio (``Pool.measure_costs``).

:func:`measure_cost_ratio`: ``c`` = drafter step / target step. Prefill a KV cache with a fixed
context, then time single-token decode steps (cropping the cache back after each), alternating
drafter and target steps so both see the same machine load; ``c`` = median drafter step /
median target step. For the ``ngram`` drafter a step is one prompt-lookup proposal over the
same context. A bare forward misses the engine's work per draft token (sampling over the
vocabulary, the loop): the ranking's speed model uses the engine's own steps instead
(:mod:`mdboost.engine.costs`, ``docs/theory.md``, "Speed model for ranking").
"""

from __future__ import annotations

import statistics
import time

import torch
from transformers import DynamicCache

from .loading import cache_kwarg, synchronize


@torch.no_grad()
def _stepper(member, context: torch.Tensor):  # context: [L + 1]
    """A zero-argument callable doing one decode step for ``member`` on the last token of
    ``context`` after a KV cache of the others (state restored after)."""
    if member.kind == "ngram":
        return lambda: member.ngram.propose(context, 1)
    return _chunk_steppers(member.model, context[:-1], [context[-1:]])[0][0]


@torch.no_grad()
def _chunk_steppers(model, prefix: torch.Tensor, chunks: list[torch.Tensor]):  # [L], [[n_i]]
    """``(steps, cache)``: per chunk a callable that forwards it on the shared KV cache of
    ``prefix``, crops the cache back and returns the logits ``[1, n_i, V]``."""
    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    key = cache_kwarg(model)
    model(input_ids=prefix.to(device)[None], use_cache=True, **{key: cache})

    def make(chunk):
        ids = chunk.to(device)[None]

        def step():
            logits = model(input_ids=ids, use_cache=True, **{key: cache}).logits
            cache.crop(-ids.shape[1])
            return logits

        return step

    return [make(c) for c in chunks], cache


def _check_counts(context_len, repeats):
    if int(context_len) != context_len or context_len < 1:
        raise ValueError(f"context_len must be a positive integer, got {context_len!r}")
    if int(repeats) != repeats or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")


def _time_alternating(steps: dict, device, repeats: int, warmup: int) -> dict:
    """Median seconds of each callable in ``steps``, timed in turn in each of the rounds."""
    times = {key: [] for key in steps}
    for i in range(warmup + repeats):
        for key, step in steps.items():
            synchronize(device)
            start = time.perf_counter()
            step()
            synchronize(device)
            if i >= warmup:
                times[key].append(time.perf_counter() - start)
    return {key: statistics.median(t) for key, t in times.items()}


@torch.no_grad()
def measure_cost_ratio(
    drafter,
    target,
    context_len: int = 128,
    repeats: int = 21,
    warmup: int = 3,
    seed: int = 0,
) -> tuple[float, str]:
    """Measure ``c = drafter step time / target step time``.

    Parameters
    ----------
    drafter, target : PoolMember
    context_len : int, default=128
        Tokens in the KV cache before the timed step, ``>= 1``.
    repeats, warmup : int
        Timed (``>= 1``) and untimed alternating step pairs.
    seed : int
        Seeds the random context (a ``torch.Generator``).

    Returns
    -------
    (float, str)
        The ratio and the method string.
    """
    _check_counts(context_len, repeats)
    vocab = len(target.tokenizer)
    gen = torch.Generator().manual_seed(seed)
    context = torch.randint(0, vocab, (context_len + 1,), generator=gen)
    steps = {"d": _stepper(drafter, context), "t": _stepper(target, context)}
    device = next(target.model.parameters()).device
    times = _time_alternating(steps, device, repeats, warmup)
    ratio = times["d"] / times["t"]
    method = (f"median of {repeats} alternating single-token decode steps (after {warmup} warm-up), "
              f"KV cache at context {context_len}, {device.type}, {torch.get_num_threads()} threads")
    return ratio, method
