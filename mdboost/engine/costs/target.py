"""The target's engine-step profile: ``v(K)``, the MD overhead ``s`` and its prefill slope (:mod:`mdboost.engine.costs`)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

import torch

from mdboost.engine.costs._stopping import SPREAD_RATIO, StoppingRule, median_interval, run_alone
from mdboost.engine.costs._timing import (COST_UNIT, ENGINE_THREADS, PREFILL_LENGTHS, _check_common, _check_lengths,
                                          _check_positive, _load, _prefill_slope, _prompt, _Run, torch_threads)
from mdboost.engine.drafting import DraftSession, Drafter
from mdboost.engine.kv import model_device, model_vocab_size
from mdboost.engine.settings import GenerationSettings


@dataclass(frozen=True)
class EngineProfile:
    """The target's side of the speed model, measured in its engine steps at one batch size (module docstring).

    Attributes
    ----------
    verify_cost : list of float
        ``v(K)`` (``v(K, B)``) for ``K = 0..gamma_max`` (``v(0) = 1``: the undrafted step
        itself), the medians over repeats of each repeat's ratio; not forced to be monotone.
    verify_samples : list of list of float
        Per ``K``, the repeats' ratios (``repeats_run`` each).
    md_overhead : dict or None
        ``{"dense": s, "onehot": s}``: the MD solve's extra time per solved position over
        ``T_ar`` (the difference of the MD and SD steps' medians; a negative difference, timing
        noise, is reported as 0); None at temperature 0 (no MD).
    prefill_per_token : float
        The target's prefill cost per prompt token (of each row) in ``T_ar``.
    step_seconds : float
        The median ``T_ar(B)`` itself (seconds).
    method : str
    threads : int
    load_before, load_after : float
    batch_size : int, default=1
        Rows ``B`` of every timed step and prefill forward.
    rule : StoppingRule or None, default=None
        How many repeats ran (``docs/engine.md``, "Costs measured once, well"); None: not recorded.
    stopped : {"tight", "spread", "max_repeats"} or None, default=None
        Why the repeats stopped.
    verify_interval : list, default=[]
        Per ``K``, the 90% sign-test interval ``[lo, hi]`` of the median ``v(K)`` (``[1, 1]``
        at ``K = 0``; None below 5 repeats).
    md_overhead_interval : dict or None, default=None
        ``{"dense": [lo, hi], "onehot": [lo, hi]}``: the interval of the median of the repeats'
        own ``(MD - SD) / md_draft_len`` differences (None below 5 repeats, or greedy).
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
    batch_size: int = 1
    rule: StoppingRule | None = None
    stopped: str | None = None
    verify_interval: list = field(default_factory=list)
    md_overhead_interval: dict | None = None

    @property
    def repeats_run(self) -> int:
        return len(self.verify_samples[0]) if self.verify_samples else 0

    def to_dict(self) -> dict:
        """The JSON form stored with the cache (:mod:`mdboost.cache.pool_cache`)."""
        return {"unit": COST_UNIT, "verify_cost": self.verify_cost, "verify_samples": self.verify_samples,
                "md_overhead": self.md_overhead, "prefill_per_token": self.prefill_per_token,
                "step_seconds": self.step_seconds, "method": self.method, "threads": self.threads,
                "load_before": self.load_before, "load_after": self.load_after, "batch_size": self.batch_size,
                "repeats_run": self.repeats_run, "stopped": self.stopped, "verify_interval": self.verify_interval,
                "md_overhead_interval": self.md_overhead_interval,
                **(self.rule.to_dict() if self.rule is not None else {})}


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


def _profile_repeat(target, prompt, sd, md, labels, md_draft_len: int, steps: int, warmup: int,
                    seed: int) -> tuple[float, dict]:
    """One fresh generation of ``prompt``'s rows: ``(mean undrafted step seconds, {label: step / undrafted})``."""
    device = model_device(target)
    drafts = _FixedDrafts(model_vocab_size(target), device, seed)
    run = _Run(target, drafts, prompt, sd, seed)
    md_args = (md.sampling, md.verify_args, run.generator, run.stats, run.timer)
    sums = {label: 0.0 for label in labels}
    base = 0.0
    with torch.inference_mode():
        run.step(0)
        for i in range(warmup + steps):
            times = {"ar": run.plain_step()}
            for label in labels:
                drafts.one_hot = label[1] == "onehot"
                k = label[1] if label[0] == "v" else md_draft_len
                wall, drafter = run.step(k, md_args if label[0] == "md" else None)
                times[label] = wall - drafter
            if i >= warmup:
                base += times["ar"]
                for label in labels:
                    sums[label] += times[label]
    return base / steps, {label: sums[label] / base for label in labels}


def _overhead_samples(ratios: dict, md_draft_len: int) -> dict:
    """Per kind, each repeat's own ``(MD - SD) / md_draft_len`` (``[]`` greedy: no MD labels)."""
    return {kind: [(m - s) / md_draft_len for m, s in zip(ratios[("md", kind)], ratios[("sd", kind)])]
            for kind in ("dense", "onehot") if ("md", kind) in ratios}


def _figures(ratios: dict, md_draft_len: int) -> list:
    """The stopping rule's figures: every ``v(K)`` (relative to its median) and both ``s`` (in ``T_ar``)."""
    figures = [(x, None) for label, x in ratios.items() if label[0] == "v"]
    return figures + [(x, 1.0) for x in _overhead_samples(ratios, md_draft_len).values()]


def profile_repeats(
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
    batch_size: int = 1,
    min_repeats: int = 5,
    rel_tol: float = 0.02,
    spread_ratio: float = SPREAD_RATIO,
):
    """Measure the target's ``v(K)``, ``s`` and prefill slope in its engine steps (module docstring),
    one repeat per step of the generator.

    :func:`measure_engine_profile` runs it to the end; :func:`mdboost.engine.costs.run_in_turn`
    interleaves its repeats with other measurements'.

    Each fresh generation (repeat) runs, after an untimed prefill, ``warmup + steps`` rounds
    of: an undrafted step (after an untimed one, as plain decoding runs it:
    :meth:`~mdboost.engine.costs._timing._Run.plain_step`), a step verifying ``K`` fixed random dense drafts for every ``K =
    1..gamma_max`` (SD), then ``md_draft_len`` drafts dense and one-hot, each with SD and with
    MD at ``max_divergence`` solving every position (``md_solve="all"``), every step over all
    ``batch_size`` rows. A repeat's ``v(K)`` is its mean ``K``-draft step over its mean
    undrafted step; ``s`` is (MD step - SD step) / ``md_draft_len`` over the undrafted step.

    Parameters
    ----------
    target : transformers causal LM
    gamma_max : int, default=8
        Largest draft length measured, ``>= 1``.
    context_len, repeats, steps, warmup, settings, threads, seed, prefill_lengths, batch_size :
        As in :func:`measure_engine_cost` (``settings``: sampling of the steps; its budget is
        ignored; ``batch_size``: ``K`` drafts in every row of the ``B``-row steps, ``v(K, B)``
        over ``T_ar(B)``).
    md_draft_len : int, default=4
        Drafts of the MD overhead steps, ``>= 1``.
    max_divergence, divergence :
        The MD budget of those steps (``> 0``).
    min_repeats, rel_tol, spread_ratio : int, float, float, default=5, 0.02, SPREAD_RATIO
        The stopping rule (:class:`StoppingRule`) over every ``v(K)`` (half-width ``<= rel_tol
        * v(K)``) and both ``s`` (half-width ``<= rel_tol``, in ``T_ar``), or each figure's
        half-width ``<= spread_ratio`` times half its single repeats' central 90% range;
        ``rel_tol = spread_ratio = 0``: always run ``repeats``.

    Yields
    ------
    tuple
        ``(repeats run, max repeats, widest relative half-width)`` after each repeat.

    Returns
    -------
    EngineProfile
        The generator's return value (``StopIteration.value``).
    """
    settings = _check_common(context_len, repeats, steps, warmup, threads, settings, batch_size)
    rule = StoppingRule(repeats, min_repeats, rel_tol, spread_ratio)
    _check_lengths(prefill_lengths)
    _check_positive("gamma_max", gamma_max)
    _check_positive("md_draft_len", md_draft_len)
    if not max_divergence > 0:
        raise ValueError(f"max_divergence must be > 0, got {max_divergence!r}")
    sd = replace(settings, max_divergence=0.0, min_acceptance=None)
    md = replace(sd, max_divergence=max_divergence, divergence=divergence, md_solve="all")
    device = model_device(target)
    prompt = _prompt(model_vocab_size(target), context_len, seed, batch_size).to(device)
    greedy = sd.temperature == 0
    labels = [("v", k) for k in range(1, gamma_max + 1)] + ([] if greedy else [
        (m, kind) for kind in ("dense", "onehot") for m in ("sd", "md")])

    def run():  # the repeats, then the profile: checked above, at the call, not at the first repeat
        ratios = {label: [] for label in labels}
        walls, load = [], []

        def one_repeat(r: int) -> None:
            with torch_threads(threads):
                load.append((_load(), torch.get_num_threads()))
                wall, ratio = _profile_repeat(target, prompt, sd, md, labels, md_draft_len, steps, warmup, seed + r)
            walls.append(wall)
            for label in labels:
                ratios[label].append(ratio[label])

        stopped = yield from rule.repeats(one_repeat, lambda: _figures(ratios, md_draft_len))
        with torch_threads(threads):
            prefill = _prefill_slope(target, target, prompt, sd, max(3, len(walls) // 3), seed, prefill_lengths)
            load_after = _load()
        load_before, used = load[0]
        n = len(walls)
        med = {label: float(statistics.median(x)) for label, x in ratios.items()}
        overhead = None if greedy else {kind: max(0.0, (med[("md", kind)] - med[("sd", kind)]) / md_draft_len)
                                        for kind in ("dense", "onehot")}
        md_part = "" if greedy else (f", and {md_draft_len} drafts with MD ({divergence} <= {max_divergence:g}, every "
                                     f"position solved) vs SD, dense and one-hot")
        rows = (f"{batch_size} rows x {context_len} tokens (each row its own block; K drafts in every row)"
                if batch_size > 1 else f"{context_len} tokens")
        method = (f"engine steps{' (greedy path, temperature 0)' if greedy else ''}: {n} repeats (fresh "
                  f"generations; {rule.describe()}, stopped: {stopped}), each {steps} rounds after {warmup} warm-up of "
                  f"an undrafted step (after an untimed one, as plain decoding runs) and steps verifying "
                  f"1..{gamma_max} fixed random drafts (SD){md_part}; wall "
                  f"time over the undrafted step's, prompt {rows}, prefill slope over prompts of "
                  f"{list(prefill_lengths)} tokens; {device.type}, {used} threads, 1-min load "
                  f"{load_before:.2f} -> {load_after:.2f}")
        intervals = [[1.0, 1.0]] + [_listed(median_interval(ratios[("v", k)])) for k in range(1, gamma_max + 1)]
        overhead_intervals = None if greedy else {kind: _listed(median_interval(x))
                                                  for kind, x in _overhead_samples(ratios, md_draft_len).items()}
        return EngineProfile([1.0] + [med[("v", k)] for k in range(1, gamma_max + 1)],
                             [[1.0] * n] + [ratios[("v", k)] for k in range(1, gamma_max + 1)],
                             overhead, prefill, float(statistics.median(walls)), method, used, load_before, load_after,
                             batch_size, rule, stopped, intervals, overhead_intervals)

    return run()


def measure_engine_profile(target, gamma_max: int = 8, *, progress=None, **options) -> EngineProfile:
    """Measure the target's ``v(K)``, ``s`` and prefill slope: :func:`profile_repeats` run alone, to the end.

    ``options``: :func:`profile_repeats`'s keyword arguments; ``progress``, when given, is called
    after each repeat with ``(repeats run, max repeats, widest relative half-width)``.
    """
    return run_alone(profile_repeats(target, gamma_max, **options), progress)


def _listed(interval) -> list[float] | None:
    return None if interval is None else list(interval)
