"""Per-token decode cost of a drafter relative to its target (the ``c`` of the speed model).

Method: prefill a KV cache with a fixed context, then time single-token decode steps
(cropping the cache back after each), alternating drafter and target steps so both see the
same machine load; ``c`` = median drafter step / median target step. For the ``ngram``
drafter a step is one prompt-lookup proposal over the same context. The method string
records all of this (the speed model of the math note, section 6).
"""

from __future__ import annotations

import statistics
import time

import torch


def cache_kwarg(model) -> str:
    """The forward keyword for a KV cache: ``cache`` in transformers >= 5.2x (where
    ``past_key_values`` is deprecated), ``past_key_values`` before. Every caller that feeds a
    cache to a model asks here."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def _stepper(member, context: torch.Tensor):  # context: [L + 1]
    """A zero-argument callable doing one decode step for ``member`` (state restored after)."""
    if member.kind == "ngram":
        return lambda: member.ngram.propose(context, 1)
    from transformers import DynamicCache

    model = member.model
    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    key = cache_kwarg(model)
    ids = context.to(device)
    model(input_ids=ids[None, :-1], use_cache=True, **{key: cache})
    last = ids[None, -1:]

    def step():
        model(input_ids=last, use_cache=True, **{key: cache})
        cache.crop(-1)

    return step


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
    if int(context_len) != context_len or context_len < 1:
        raise ValueError(f"context_len must be a positive integer, got {context_len!r}")
    if int(repeats) != repeats or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    vocab = len(target.tokenizer)
    gen = torch.Generator().manual_seed(seed)
    context = torch.randint(0, vocab, (context_len + 1,), generator=gen)
    steps = {"d": _stepper(drafter, context), "t": _stepper(target, context)}
    device = next(target.model.parameters()).device
    times = {"d": [], "t": []}
    for i in range(warmup + repeats):
        for key in ("d", "t"):
            _sync(device)
            start = time.perf_counter()
            steps[key]()
            _sync(device)
            if i >= warmup:
                times[key].append(time.perf_counter() - start)
    ratio = statistics.median(times["d"]) / statistics.median(times["t"])
    method = (f"median of {repeats} alternating single-token decode steps (after {warmup} warm-up), "
              f"KV cache at context {context_len}, {device.type}, {torch.get_num_threads()} threads")
    return ratio, method
