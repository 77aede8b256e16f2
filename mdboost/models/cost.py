"""Decode costs for the speed model, relative to one target step.

Definitions: ``docs/theory.md``, "Speed model for ranking".

- :func:`measure_cost_ratio`: ``c`` = drafter step / target step. Prefill a KV cache with a
  fixed context, then time single-token decode steps (cropping the cache back after each),
  alternating drafter and target steps so both see the same machine load; ``c`` = median
  drafter step / median target step. For the ``ngram`` drafter a step is one prompt-lookup
  proposal over the same context. A bare forward: it misses the engine's work per draft token
  (sampling over the vocabulary, the loop); the cache build measures ``c`` in the engine's own
  steps instead (:func:`mdboost.engine.costs.measure_engine_cost`).
- :func:`measure_verify_ratios`: ``T_target(g + 1 tokens) / T_target(1 token)``, the
  verification forward of a ``g``-token draft on the same KV cache (same alternating method,
  all chunk sizes in turn in each round), as timed; :func:`measure_verify_costs`: the table
  ``v(g)`` the speed model uses (:func:`verify_cost_table`: a running maximum of the ratios).
- :func:`measure_md_overhead`: ``s`` = extra time of :func:`mdboost.md.verify.verify` with one
  draft at a KL budget over the same call at budget 0 (plain SD), per target step, for dense
  and one-hot (``ngram``) drafts.

Each returns a method string recording how it measured.
"""

from __future__ import annotations

import statistics
import time

import torch

from .loading import cache_kwarg


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def _stepper(member, context: torch.Tensor, chunk: int = 1):  # context: [L + chunk]
    """A zero-argument callable doing one decode step for ``member`` on the last ``chunk``
    tokens of ``context`` after a KV cache of the others (state restored after)."""
    if member.kind == "ngram":
        return lambda: member.ngram.propose(context, 1)
    return _chunk_steppers(member.model, context[:-chunk], [context[-chunk:]])[0][0]


@torch.no_grad()
def _chunk_steppers(model, prefix: torch.Tensor, chunks: list[torch.Tensor]):  # [L], [[n_i]]
    """``(steps, cache)``: per chunk a callable that forwards it on the shared KV cache of
    ``prefix``, crops the cache back and returns the logits ``[1, n_i, V]``."""
    from transformers import DynamicCache

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
            _sync(device)
            start = time.perf_counter()
            step()
            _sync(device)
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


@torch.no_grad()
def measure_verify_ratios(
    target,
    gamma_max: int = 8,
    context_len: int = 128,
    repeats: int = 21,
    warmup: int = 3,
    seed: int = 0,
) -> tuple[list[float], str]:
    """Measure ``T_target(g + 1 tokens) / T_target(1 token)`` for ``g = 0..gamma_max``, as timed.

    Each round times, in turn, the target's forward of a 1-, 2-, ..., ``gamma_max + 1``-token
    chunk on a KV cache of ``context_len`` random tokens (cropped back after each call); the
    ratio for ``g`` is the median time of the ``g + 1``-token chunk over the median time of the
    1-token chunk. Nothing is clamped: a ratio can dip below an earlier one through timing noise
    (:func:`verify_cost_table` makes the table the speed model uses).

    Parameters
    ----------
    target : PoolMember
        A model member (not ``ngram``).
    gamma_max : int, default=8
        Largest draft length, ``>= 1``.
    context_len, repeats, warmup, seed : as in :func:`measure_cost_ratio`.

    Returns
    -------
    (list of float, str)
        The ratios ``[1.0, r(1), ..., r(gamma_max)]`` and the method string.
    """
    _check_counts(context_len, repeats)
    if int(gamma_max) != gamma_max or gamma_max < 1:
        raise ValueError(f"gamma_max must be a positive integer, got {gamma_max!r}")
    if target.model is None:
        raise ValueError(f"target must be a model member, got kind {target.kind!r}")
    gen = torch.Generator().manual_seed(seed)
    context = torch.randint(0, len(target.tokenizer), (context_len + gamma_max + 1,), generator=gen)
    prefix, tail = context[:context_len], context[context_len:]
    chunks = [tail[:n] for n in range(1, gamma_max + 2)]
    steps = dict(enumerate(_chunk_steppers(target.model, prefix, chunks)[0]))
    device = next(target.model.parameters()).device
    times = _time_alternating(steps, device, repeats, warmup)
    ratios = [times[g] / times[0] for g in range(gamma_max + 1)]  # ratios[0] == 1.0 exactly
    method = (f"median of {repeats} rounds (after {warmup} warm-up) timing target forwards of 1..{gamma_max + 1} "
              f"tokens in turn, KV cache at context {context_len}, {device.type}, {torch.get_num_threads()} threads")
    return ratios, method


def verify_cost_table(ratios) -> list[float]:
    """The verification cost table ``v`` of measured ratios: ``v(0) = 1``, then a running maximum.

    A longer chunk never costs less, so a ratio below an earlier one is timing noise and is
    raised to it; hence ``v(g) >= v(0) = 1``.

    Parameters
    ----------
    ratios : sequence of float
        ``ratios[g] = T_target(g + 1 tokens) / T_target(1 token)`` (``ratios[0]`` is ignored).

    Returns
    -------
    list of float

    Examples
    --------
    >>> verify_cost_table([1.0, 1.4, 1.3, 2.0])
    [1.0, 1.4, 1.4, 2.0]
    >>> verify_cost_table([1.0, 0.9, 1.2])
    [1.0, 1.0, 1.2]
    """
    table = [1.0]
    for ratio in ratios[1:]:
        table.append(max(table[-1], ratio))
    return table


def measure_verify_costs(target, gamma_max: int = 8, **timing) -> tuple[list[float], str]:
    """Measure the table ``v(g)`` for ``g = 0..gamma_max``: :func:`verify_cost_table` of
    :func:`measure_verify_ratios` (``timing``: its ``context_len``, ``repeats``, ``warmup``, ``seed``).

    Returns
    -------
    (list of float, str)
        The table ``[1.0, v(1), ..., v(gamma_max)]`` and the method string.
    """
    ratios, method = measure_verify_ratios(target, gamma_max, **timing)
    return verify_cost_table(ratios), method


def _verify_inputs(logits: torch.Tensor, one_hot: bool):  # logits: [2, V] (two nearby positions)
    """``(draft_tokens [1, 1], draft_probs [1, 1, V], target_probs [1, 2, V])`` for one draft."""
    q = torch.softmax(logits[1].float(), dim=-1)
    p = torch.softmax(logits[0].float(), dim=-1)
    token = int(p.argmax())
    if one_hot:
        p = torch.nn.functional.one_hot(torch.tensor(token), q.numel()).to(q.dtype)
    return torch.tensor([[token]]), p.view(1, 1, -1), torch.stack([q, q]).unsqueeze(0)


@torch.no_grad()
def measure_md_overhead(
    target,
    max_divergence: float = 0.05,
    divergence: str = "kl",
    context_len: int = 128,
    repeats: int = 21,
    warmup: int = 3,
    seed: int = 0,
) -> tuple[dict[str, float], str]:
    """Measure ``s`` = (MD verify time - SD verify time) per position / target step.

    Inputs are realistic ``[1, 1, V]`` distributions: the softmax of the target's own logits at
    the last two positions of a random context (the earlier one plays the drafter; for
    ``onehot`` its argmax, as an ``ngram`` drafter proposes). Each round times, in turn, a
    single-token target step, :func:`mdboost.md.verify.verify` with one draft at
    ``max_divergence`` and the same call at budget 0, for dense and one-hot drafts (the engine's
    call: ``validate=False``). Differences below 0 (timing noise) are reported as 0.

    Returns
    -------
    (dict, str)
        ``{"dense": s, "onehot": s_onehot}`` and the method string.
    """
    from mdboost.md.verify import verify

    _check_counts(context_len, repeats)
    if not max_divergence > 0:
        raise ValueError(f"max_divergence must be > 0, got {max_divergence!r}")
    if target.model is None:
        raise ValueError(f"target must be a model member, got kind {target.kind!r}")
    gen = torch.Generator().manual_seed(seed)
    context = torch.randint(0, len(target.tokenizer), (context_len + 1,), generator=gen)
    device = next(target.model.parameters()).device
    logits = target.model(input_ids=context.to(device)[None]).logits[0, -2:]  # [2, V]
    steps = {"t": _stepper(target, context)}
    for kind in ("dense", "onehot"):
        tokens, p, q = (x.to(device) for x in _verify_inputs(logits, kind == "onehot"))
        for label, budget in (("md", max_divergence), ("sd", 0.0)):
            g = torch.Generator(device=device).manual_seed(seed)
            steps[f"{kind}-{label}"] = (lambda t=tokens, p=p, q=q, b=budget, g=g:
                                        verify(t, p, q, max_divergence=b, divergence=divergence, generator=g,
                                               validate=False))
    times = _time_alternating(steps, device, repeats, warmup)
    out = {kind: max(0.0, (times[f"{kind}-md"] - times[f"{kind}-sd"]) / times["t"]) for kind in ("dense", "onehot")}
    method = (f"median of {repeats} rounds (after {warmup} warm-up) of verify(K=1, {divergence}<={max_divergence:g}) "
              f"minus verify(budget 0), over a single-token target step at context {context_len}; "
              f"{device.type}, {torch.get_num_threads()} threads")
    return out, method
