"""What the engine's steps cost, on one clock (``docs/theory.md``, "Speed model for ranking").

Every figure the speed model uses is a time of the engine's own steps
(:func:`mdboost.engine.generate`'s step function, its drafter sessions and
:class:`~mdboost.engine.kv.CachedLM`) divided by the same unit: the wall time ``T_ar`` of one
undrafted single-token step (the target's forward, ``logits_to_probs``, the draw and the
step's bookkeeping), which is what plain decoding pays per token.

- :func:`measure_engine_cost`: a drafter's ``c`` = drafter seconds per draft token / ``T_ar``.
  A drafted step's drafter time holds the drafter's forwards *and* what the engine does per
  draft token (``logits_to_probs`` over the whole vocabulary, the draw, the Python loop, the
  shared-KV layer view of an early exit, the one-hot ``p`` of prompt lookup). For a model
  drafter it also measures the prefill cost per prompt token (below).
- :func:`measure_engine_profile`: the target's side. ``v(K)`` = wall time of a step verifying
  ``K`` drafts, minus its drafter time, over ``T_ar`` (the ``K + 1``-token forward, ``q`` at
  ``K + 1`` positions, SD's verification, the rollback); ``s`` = the MD solve's extra time per
  solved position over ``T_ar`` (dense and one-hot drafts); the target's prefill cost per
  prompt token.
- Prefill: the first step of a generation feeds the whole prompt to the target, and a model
  drafter's first proposal feeds it to the drafter (a private KV cache keeps it; an early exit
  drafting on the target's cache computes its layers for the prompt and gives the entries back,
  so the target's verification feeds the prompt again). Each costs ``beta (L - 1)`` beyond an
  ordinary step for a prompt of ``L`` tokens, ``beta`` = the least-squares slope of the model's
  forward time over prompt lengths :data:`PREFILL_LENGTHS`, in ``T_ar`` per token.

Each repeat is a fresh generation from the same prompt: after an untimed prefill it runs
``warmup + steps`` rounds, each an undrafted step and the drafted steps being measured,
interleaved so that all see the same machine load; a repeat's sample is a ratio of its own
timed rounds. The prompt repeats a random block of (up to) :data:`PERIOD` tokens; a
prompt-lookup drafter (:class:`~mdboost.engine.drafting.NgramAdapter`) makes its proposal, as
the engine's session makes it, on that prompt (a match: a full-length draft), since the
target's sampled tokens soon leave the period and lookup in random tokens then finds nothing.
The target's ``v`` and ``s`` are measured with fixed random drafts (no drafter cost, the
drafts' ``p`` dense or one-hot), so they belong to the target alone.

The results keep every sample with its median and spread, at a fixed torch thread count (the
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

from mdboost.engine.drafting import DraftSession, Drafter, ModelDrafter, NgramAdapter, as_drafter
from mdboost.engine.generate import _State, _step, _Timer
from mdboost.engine.kv import CachedLM
from mdboost.engine.settings import GenerationSettings
from mdboost.engine.stats import GenerationStats

PERIOD = 16  # tokens of the random block the prompt repeats (prompt lookup then always finds a match)
PREFILL_LENGTHS = (1, 64, 128, 256)  # prompt lengths the prefill slope is fitted over
# the unit and method of the figures below; stored measurements of another unit are measured again
COST_UNIT = "engine-step-wall-v3"


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


@dataclass(frozen=True)
class EngineProfile:
    """The target's side of the speed model, measured in its engine steps (module docstring).

    Attributes
    ----------
    verify_cost : list of float
        ``v(K)`` for ``K = 0..gamma_max`` (``v(0) = 1``: the undrafted step itself), the medians
        over repeats of each repeat's ratio; not forced to be monotone.
    verify_samples : list of list of float
        Per ``K``, the repeats' ratios.
    md_overhead : dict or None
        ``{"dense": s, "onehot": s}``: the MD solve's extra time per solved position over
        ``T_ar`` (medians; a negative difference, timing noise, is reported as 0); None at
        temperature 0 (no MD).
    prefill_per_token : float
        The target's prefill cost per prompt token in ``T_ar``.
    step_seconds : float
        The median ``T_ar`` itself (seconds).
    method : str
    threads : int
    load_before, load_after : float
    """

    verify_cost: list[float]
    verify_samples: list[list[float]]
    md_overhead: dict
    prefill_per_token: float
    step_seconds: float
    method: str
    threads: int
    load_before: float
    load_after: float

    def to_dict(self) -> dict:
        """The JSON form stored with the cache (:mod:`mdboost.cache.pool_cache`)."""
        return {"unit": COST_UNIT, "verify_cost": self.verify_cost, "verify_samples": self.verify_samples,
                "md_overhead": self.md_overhead, "prefill_per_token": self.prefill_per_token,
                "step_seconds": self.step_seconds, "method": self.method, "threads": self.threads,
                "load_before": self.load_before, "load_after": self.load_after}


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


def _check_common(context_len, repeats, steps, warmup, threads, settings) -> GenerationSettings:
    _check_positive("context_len", context_len)
    _check_positive("repeats", repeats)
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


def _prompt(vocab_size: int, context_len: int, seed: int) -> torch.Tensor:  # [1, context_len]
    """A random block of ``min(PERIOD, context_len // 2)`` tokens (at least 1), repeated to
    ``context_len`` tokens: a context of 2 tokens or more holds its block twice."""
    gen = torch.Generator().manual_seed(seed)
    block = torch.randint(0, vocab_size, (max(1, min(PERIOD, context_len // 2)),), generator=gen)
    return block.repeat(context_len // block.numel() + 1)[:context_len][None]


class _Run:
    """One fresh generation from ``prompt`` whose steps are run and timed one by one."""

    def __init__(self, target, drafter, prompt, settings, seed):
        device = next(target.parameters()).device
        self.prompts = prompt.tolist()
        self.lm = CachedLM(target, len(self.prompts), device)
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


def _forward_seconds(model, length: int, vocab_size: int, device, seed: int) -> float:
    """Wall time of one forward of a fresh ``length``-token prompt through ``CachedLM(model)``."""
    ids = torch.randint(0, vocab_size, (1, length), generator=torch.Generator().manual_seed(seed)).to(device)
    lm = CachedLM(model, 1, device)
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

    Each repeat times ``model``'s forward of a fresh prompt at every length in ``lengths``,
    interleaved with undrafted steps of the target (``T_ar``).
    """
    device = next(target.parameters()).device
    vocab = target.config.get_text_config().vocab_size
    slopes = []
    with torch.inference_mode():
        for r in range(repeats):
            run = _Run(target, None, prompt, settings, seed + r)
            run.step(0)
            seconds, walls = [], []
            for length in lengths:
                walls.append(run.step(0)[0])
                seconds.append(_forward_seconds(model, length, vocab, device, seed + r))
            slopes.append(_slope(lengths, seconds) / statistics.median(walls))
    return max(0.0, float(statistics.median(slopes)))


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


class _FixedDrafts(Drafter):
    """``K`` random draft tokens with a fixed dense (or one-hot) ``p``, at no drafter cost."""

    def __init__(self, vocab_size: int, device, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.dense = torch.softmax(torch.randn(vocab_size, generator=gen) * 2, -1).to(device)  # [V]
        self.vocab_size, self.device, self.one_hot = vocab_size, device, False
        self.gen = gen

    def start(self, prompts, target, settings) -> DraftSession:
        return _FixedSession(self)


class _FixedSession(DraftSession):
    def __init__(self, drafts: _FixedDrafts):
        self.d = drafts

    def propose(self, contexts, max_tokens, generator):
        d = self.d
        tokens = torch.randint(0, d.vocab_size, (len(contexts), max_tokens), generator=d.gen).to(d.device)
        if d.one_hot:
            probs = torch.zeros(len(contexts), max_tokens, d.vocab_size, device=d.device)
            probs.scatter_(-1, tokens.unsqueeze(-1), 1.0)
        else:
            probs = d.dense.expand(len(contexts), max_tokens, d.vocab_size)
        return tokens, probs, [max_tokens] * len(contexts)

    def commit(self, num_accepted, new_tokens) -> None:
        """Fixed drafts keep no state."""

    def update(self, num_accepted, lengths) -> None:
        """Fixed drafts keep no schedule."""


def measure_engine_profile(
    target,
    gamma_max: int = 8,
    *,
    context_len: int = 128,
    repeats: int = 21,
    steps: int = 2,
    warmup: int = 1,
    md_draft_len: int = 4,
    max_divergence: float = 0.05,
    divergence: str = "kl",
    settings: GenerationSettings | None = None,
    threads: int | None = ENGINE_THREADS,
    seed: int = 0,
    prefill_lengths=PREFILL_LENGTHS,
) -> EngineProfile:
    """Measure the target's ``v(K)``, ``s`` and prefill slope in its engine steps (module docstring).

    Each of ``repeats`` fresh generations runs, after an untimed prefill, ``warmup + steps``
    rounds of: an undrafted step, a step verifying ``K`` fixed random dense drafts for every
    ``K = 1..gamma_max`` (SD), then ``md_draft_len`` drafts dense and one-hot, each with SD and
    with MD at ``max_divergence`` solving every position (``md_solve="all"``). A repeat's
    ``v(K)`` is its mean ``K``-draft step over its mean undrafted step; ``s`` is (MD step - SD
    step) / ``md_draft_len`` over the undrafted step.

    Parameters
    ----------
    target : transformers causal LM
    gamma_max : int, default=8
        Largest draft length measured, ``>= 1``.
    context_len, repeats, steps, warmup, settings, threads, seed, prefill_lengths :
        As in :func:`measure_engine_cost` (``settings``: sampling of the steps; its budget is
        ignored).
    md_draft_len : int, default=4
        Drafts of the MD overhead steps, ``>= 1``.
    max_divergence, divergence :
        The MD budget of those steps (``> 0``).

    Returns
    -------
    EngineProfile
    """
    from dataclasses import replace

    settings = _check_common(context_len, repeats, steps, warmup, threads, settings)
    _check_lengths(prefill_lengths)
    _check_positive("gamma_max", gamma_max)
    _check_positive("md_draft_len", md_draft_len)
    if not max_divergence > 0:
        raise ValueError(f"max_divergence must be > 0, got {max_divergence!r}")
    sd = replace(settings, max_divergence=0.0, min_acceptance=None)
    md = replace(sd, max_divergence=max_divergence, divergence=divergence, md_solve="all")
    device = next(target.parameters()).device
    vocab = target.config.get_text_config().vocab_size
    prompt = _prompt(vocab, context_len, seed).to(device)
    greedy = sd.temperature == 0
    labels = [("v", k) for k in range(1, gamma_max + 1)] + ([] if greedy else [
        (m, kind) for kind in ("dense", "onehot") for m in ("sd", "md")])
    ratios = {label: [] for label in labels}
    walls = []
    with torch_threads(threads):
        load_before, used = _load(), torch.get_num_threads()
        for r in range(repeats):
            drafts = _FixedDrafts(vocab, device, seed + r)
            run = _Run(target, drafts, prompt, sd, seed + r)
            md_args = (md.sampling, md.verify_args, run.generator, run.stats, run.timer)
            sums = {label: 0.0 for label in labels}
            base = 0.0
            with torch.inference_mode():
                run.step(0)
                for i in range(warmup + steps):
                    times = {"ar": run.step(0)[0]}
                    for label in labels:
                        drafts.one_hot = label[1] == "onehot"
                        k = label[1] if label[0] == "v" else md_draft_len
                        wall, drafter = run.step(k, md_args if label[0] == "md" else None)
                        times[label] = wall - drafter
                    if i >= warmup:
                        base += times["ar"]
                        for label in labels:
                            sums[label] += times[label]
            walls.append(base / steps)
            for label in labels:
                ratios[label].append(sums[label] / base)
        prefill = _prefill_slope(target, target, prompt, sd, max(3, repeats // 3), seed, prefill_lengths)
        load_after = _load()
    med = {label: float(statistics.median(x)) for label, x in ratios.items()}
    overhead = None if greedy else {kind: max(0.0, (med[("md", kind)] - med[("sd", kind)]) / md_draft_len)
                                    for kind in ("dense", "onehot")}
    md_part = "" if greedy else (f", and {md_draft_len} drafts with MD ({divergence} <= {max_divergence:g}, every "
                                 f"position solved) vs SD, dense and one-hot")
    method = (f"engine steps{' (greedy path, temperature 0)' if greedy else ''}: {repeats} repeats (fresh "
              f"generations), each {steps} rounds after {warmup} warm-up of an undrafted step and steps verifying "
              f"1..{gamma_max} fixed random drafts (SD){md_part}; wall "
              f"time over the undrafted step's, prompt {context_len} tokens, prefill slope over prompts of "
              f"{list(prefill_lengths)} tokens; {device.type}, {used} threads, 1-min load "
              f"{load_before:.2f} -> {load_after:.2f}")
    return EngineProfile([1.0] + [med[("v", k)] for k in range(1, gamma_max + 1)],
                         [[1.0] * repeats] + [ratios[("v", k)] for k in range(1, gamma_max + 1)],
                         overhead, prefill, float(statistics.median(walls)), method, used, load_before, load_after)
