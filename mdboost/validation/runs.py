"""Realized numbers of one operating point: AR / SD / MD generation over held-out prompts.

The ranking predicts per-token acceptance ``alpha`` (f-MD over cached logits,
``docs/theory.md``, "The clamp solution and the curve C(p, q)") and the speed model's speedup
(``docs/theory.md``, "Speed model for ranking"). Real runs of :func:`mdboost.engine.generate`
realize them. Definitions used here (counters summed over the generations; a generation is one
batch of prompts, :func:`run_modes`):

- ``realized_acceptance``: acceptance rate at draft position 0, accepted / proposed. Under the
  speed model's i.i.d. assumption position ``j`` accepts with ``alpha^(j+1)``, so position 0
  estimates ``alpha`` itself (the all-position rate ``accepted / proposed`` does not);
- ``expected_acceptance``: the Rao-Blackwellized version, the mean over all position-0 drafts
  of verify's acceptance probability ``P_acc(pi)`` (``1 - TV`` for SD) instead of the accept /
  reject outcome: same expectation, far lower variance. Defined only when ``P_acc`` was
  computed at every position-0 draft (SD; MD with the engine's ``md_solve="reached"`` or
  ``"all"``), else NaN;
- ``mean_accepted_length``: ``1 + accepted / drafts`` (tokens per target call when drafting);
- ``tokens_per_second`` = new tokens / wall seconds (all rows of a batch); ``speedup`` = MD (or
  SD) tokens/s over AR's at the same batch size;
- ``realized_divergence``: mean realized ``D_f(pi || q)`` over verified positions;
- ``nll_target``: the target's mean negative log-likelihood (natural log, temperature 1) of the
  generated tokens, teacher-forced.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from mdboost.engine import GenerationSettings, as_drafter, generate
from mdboost.engine.kv import model_device
from mdboost.engine.stats import GenerationStats

MODES = ("ar", "sd", "md")

_SUMMED = ("num_new_tokens", "num_target_calls", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
           "num_verified_positions", "num_solved_positions", "divergence_sum", "num_budget_accepted",
           "time_drafter", "time_target", "time_verify", "time_total", "time_first_step")
_PER_POSITION = ("draft_tokens_per_position", "accepted_tokens_per_position",
                 "acceptance_probability_sum_per_position", "acceptance_probability_count_per_position")


def _add_lists(a: list, b: list) -> list:
    width = max(len(a), len(b))
    return [x + y for x, y in zip(list(a) + [0] * (width - len(a)), list(b) + [0] * (width - len(b)))]


def merge_stats(parts: list[GenerationStats]) -> GenerationStats:
    """Sum the counters of several :class:`GenerationStats` (one per prompt)."""
    if not parts:
        raise ValueError("parts must hold at least one GenerationStats, got none")
    out = GenerationStats(mode=parts[0].mode, budget=parts[0].budget)
    for part in parts:
        for name in (n for n in _SUMMED if hasattr(out, n)):
            setattr(out, name, getattr(out, name) + getattr(part, name))
        out.max_divergence = max(out.max_divergence, part.max_divergence)
        for name in (n for n in _PER_POSITION if hasattr(out, n)):
            setattr(out, name, _add_lists(getattr(out, name), getattr(part, name)))
    return out


def expected_acceptance(stats: GenerationStats) -> float:
    """Mean ``P_acc(pi)`` over all position-0 drafts (Rao-Blackwellized position-0 acceptance).

    NaN without drafts, or when ``P_acc`` was not computed at every position-0 draft (the
    engine's ``md_solve="needed"`` skips drafts SD accepts: averaging the rest would be biased).
    """
    sums = getattr(stats, "acceptance_probability_sum_per_position", None)
    counts = getattr(stats, "acceptance_probability_count_per_position", None)
    drafts = stats.draft_tokens_per_position
    if not sums or not drafts or not drafts[0]:
        return float("nan")
    if counts is not None and (not counts or counts[0] != drafts[0]):
        return float("nan")
    return sums[0] / drafts[0]


@dataclass(frozen=True)
class Generation:
    """One :func:`mdboost.engine.generate` call of :func:`run_modes`: its ``stats`` and
    ``longest``, the new tokens of its longest row (the steps the batch ran for)."""

    stats: GenerationStats
    longest: int


def equal_work_speedup(cell: list[Generation], ar: list[Generation]) -> float:
    """A cell's speedup over plain decoding of the same prompts at the cell's own lengths.

    ``cell[g]`` and ``ar[g]`` are the two modes' generations of the same batch of prompts. A
    generation that stops at EOS makes fewer tokens than ``max_new_tokens``, and its prompt's
    prefill is then a larger share of its time: the two modes' tokens per second differ by that
    share as well as by their speed whenever they stop at different lengths (they do: each
    samples its own tokens). So the plain run's time is taken at the cell's length:
    ``T_ar,g(n) = first_g + (n - 1) step_g``, its first step (the prefill) plus ``n - 1`` of its
    steps, ``step_g = (T_g - first_g) / (calls_g - 1)`` (pooled over the plain generations
    that ran a second step where this one ran only its first), and the speedup is

        ``sum_g T_ar,g(n_g) / sum_g T_cell,g``

    with ``n_g`` the cell's longest row in batch ``g`` (the steps the batch ran). Where both
    modes make the same lengths it is the ratio of their tokens per second exactly. NaN where
    the cell ran steps after its first and no plain generation did (no step time to take).

    >>> from mdboost.engine.stats import GenerationStats
    >>> def run(tokens, first, total):
    ...     return Generation(GenerationStats(num_new_tokens=tokens, num_target_calls=tokens,
    ...                                       time_first_step=first, time_total=total), tokens)
    >>> ar = [run(11, 1.0, 2.0)]        # prefill 1 s, then 10 steps of 0.1 s
    >>> cell = [run(6, 1.0, 1.2)]       # stopped at EOS after 6 tokens
    >>> round(equal_work_speedup(cell, ar), 4)  # (1.0 + 5 * 0.1) / 1.2
    1.25
    >>> round((6 / 1.2) / (11 / 2.0), 4)  # the ratio of tokens per second
    0.9091
    """
    if len(cell) != len(ar) or not cell:
        raise ValueError(f"cell and ar must hold the same batches (one generation each), got {len(cell)} and {len(ar)}")
    later = [a for a in ar if a.stats.num_target_calls > 1]
    pooled = (sum(a.stats.time_total - a.stats.time_first_step for a in later)
              / sum(a.stats.num_target_calls - 1 for a in later)) if later else float("nan")
    plain = 0.0
    for c, a in zip(cell, ar):
        calls = a.stats.num_target_calls
        steps = c.longest - 1  # after the first, which feeds the prompt
        if steps:
            plain += steps * ((a.stats.time_total - a.stats.time_first_step) / (calls - 1) if calls > 1 else pooled)
        plain += a.stats.time_first_step
    seconds = sum(c.stats.time_total for c in cell)
    return plain / seconds if seconds > 0 else float("nan")


@dataclass
class ModeRun:
    """Merged stats and the generated token lists (one per prompt and pass, pass after pass) of
    one mode; ``generations`` holds each pass's generations, one :class:`Generation` per batch in
    order, and ``passes`` each pass's merged stats (one entry for a single pass)."""

    stats: GenerationStats
    outputs: list[list[int]] = field(default_factory=list)
    generations: list[list[Generation]] = field(default_factory=list)

    @property
    def passes(self) -> list[GenerationStats]:
        """Each pass's stats, merged over its generations."""
        return [merge_stats([g.stats for g in part]) for part in self.generations]

    def metrics(self) -> dict[str, float]:
        s = self.stats
        first = (s.accepted_tokens_per_position[0] / s.draft_tokens_per_position[0]
                 if s.draft_tokens_per_position and s.draft_tokens_per_position[0] else float("nan"))
        return {"realized_acceptance": first, "expected_acceptance": expected_acceptance(s),
                "acceptance_rate_all_positions": s.acceptance_rate,
                "mean_accepted_length": s.mean_accepted_length, "tokens_per_second": s.tokens_per_second,
                "realized_divergence": s.mean_divergence, "max_realized_divergence": s.max_divergence,
                "num_new_tokens": float(s.num_new_tokens), "num_budget_accepted": float(s.num_budget_accepted)}


def _mode_arguments(kwargs: dict):
    """``(settings, drafter)`` of :func:`mdboost.engine.generate` for one mode's keyword arguments.

    ``mode`` (``"ar"``, ``"sd"`` or ``"md"``) and ``drafter`` (a pool member's model or n-gram
    drafter, or a :class:`~mdboost.engine.drafting.Drafter`); the rest are
    :class:`~mdboost.engine.settings.GenerationSettings` fields. ``ar`` ignores the drafter,
    ``sd`` needs a drafter and no budget, ``md`` a drafter and a budget.
    """
    kwargs = dict(kwargs)
    mode, drafter = kwargs.pop("mode", "ar"), kwargs.pop("drafter", None)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    settings = GenerationSettings(**kwargs)
    if mode == "ar":
        return settings, None
    if drafter is None:
        raise ValueError(f"mode={mode!r} needs a drafter, got drafter=None")
    if mode == "sd" and settings.lossy:
        raise ValueError(f"mode='sd' is lossless: max_divergence must be 0 and min_acceptance None, "
                         f"got {settings.max_divergence!r}, {settings.min_acceptance!r}")
    if mode == "md" and not settings.lossy:
        raise ValueError("mode='md' needs max_divergence > 0 or min_acceptance (use mode='sd' for budget 0)")
    return settings, as_drafter(drafter)


class _Progress:
    """A tqdm bar over generations; its postfix is the new tokens per second so far."""

    def __init__(self, total: int, desc: str, enabled: bool):
        self._clock = time.perf_counter
        self.bar = tqdm(total=total, desc=desc, unit="run", disable=not enabled or bool(os.environ.get("TQDM_DISABLE")))
        self.tokens, self.start = 0, self._clock()

    def step(self, stats: GenerationStats) -> None:
        """One generation done: count its new tokens, advance the bar."""
        self.tokens += int(stats.num_new_tokens)
        rate = self.tokens / max(self._clock() - self.start, 1e-9)
        self.bar.set_postfix_str(f"{rate:.1f} tok/s", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def progress_bar(total: int, desc: str, enabled: bool = True) -> _Progress:
    """A bar over ``total`` generations (``step(stats)`` after each, as :func:`run_modes`'
    ``on_generation``) showing tokens/s, like the cache build's; off when ``enabled`` is false or
    ``TQDM_DISABLE`` is set."""
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise ValueError(f"total must be an integer >= 0, got {total!r}")
    return _Progress(total, desc, enabled)


def run_mode(target, prompts: list[torch.Tensor], *, drafter=None, mode: str = "ar", seed: int = 0,
             **gen_kwargs) -> ModeRun:
    """Generate for every prompt (``[T]`` each, batch 1) in one mode; merge the stats.

    ``gen_kwargs`` are :class:`mdboost.engine.GenerationSettings` fields (gamma, temperature,
    max_new_tokens, max_divergence, divergence, eos_token_id, ...). Prompt ``i`` uses seed ``seed + i``.
    """
    return run_modes(target, prompts, {mode: dict(drafter=drafter, mode=mode)}, seed=seed, **gen_kwargs)[mode]


def _batch_inputs(group: list[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor]:  # -> [B, T] x 2
    """Prompts left-padded to the longest (pad id 0, masked out), as the engine batches them."""
    width = max(ids.numel() for ids in group)
    ids = torch.zeros(len(group), width, dtype=torch.long)
    mask = torch.zeros(len(group), width, dtype=torch.long)
    for b, row in enumerate(group):
        ids[b, width - row.numel():], mask[b, width - row.numel():] = row.view(-1), 1
    return ids.to(device), mask.to(device)


def run_modes(target, prompts: list[torch.Tensor], modes: dict[str, dict], *, seed: int = 0,
              on_generation=None, batch_size: int = 1, passes: int = 1, **common) -> dict[str, ModeRun]:
    """Several modes interleaved per batch of prompts: each batch runs every mode in turn.

    A change of machine load during the run then hits every mode alike, so speedups (ratios
    of tokens/s between modes) stay fair. ``modes`` maps a name to the mode's own arguments
    (``mode``, ``drafter``, ``max_divergence``, ...: see :func:`_mode_arguments`), merged over
    ``common``; a mode ``"ar"`` with ``model`` decodes with that model instead of ``target`` (a
    drafter decoding alone). ``batch_size`` consecutive prompts run as one batch of the engine (left-padded;
    the last batch may be smaller); batch ``i`` uses seed ``seed + i`` in every mode (at batch
    size 1: prompt ``i``, seed ``seed + i``). ``passes`` runs the whole interleaved sequence that
    many times, one pass after another with the same seeds, so every pass does the same work
    and differs from the others only in its timing (``ModeRun.passes``; the merged stats and the
    outputs cover every pass). ``on_generation``, when given, is called after each generation
    with its :class:`GenerationStats` (a progress bar's hook: one call per pass, batch and mode).
    """
    if not prompts:
        raise ValueError("prompts must hold at least one prompt, got none")
    if not modes:
        raise ValueError("modes must name at least one mode, got none")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError(f"passes must be a positive integer, got {passes!r}")
    models = {}
    for name, kwargs in modes.items():
        if "model" in kwargs and kwargs.get("mode", "ar") != "ar":
            raise ValueError(f"modes[{name!r}]: model decodes alone, in mode 'ar' only, got mode {kwargs['mode']!r}")
        models[name] = kwargs.get("model", target)
    arguments = {name: _mode_arguments({**common, **{k: v for k, v in kwargs.items() if k != "model"}})
                 for name, kwargs in modes.items()}
    device = model_device(target)  # the CPU for llama.cpp (mdboost.engine.kv.LMBackend)
    runs = {name: [[] for _ in range(passes)] for name in modes}
    outputs = {name: [] for name in modes}
    for k in range(passes):
        for i, start in enumerate(range(0, len(prompts), batch_size)):
            group = prompts[start:start + batch_size]
            ids, mask = _batch_inputs(group, device)
            for name, (settings, drafter) in arguments.items():
                gen = torch.Generator(device=device).manual_seed(seed + i)
                out = generate(models[name], ids, settings, drafter=drafter, attention_mask=mask, generator=gen)
                lengths = [int(out.num_new_tokens[b]) for b in range(len(group))]
                for b, n in enumerate(lengths):
                    outputs[name].append(out.sequences[b, ids.shape[1]: ids.shape[1] + n].tolist())
                runs[name][k].append(Generation(out.stats, max(lengths)))
                if on_generation is not None:
                    on_generation(out.stats)
    return {name: ModeRun(merge_stats([g.stats for part in runs[name] for g in part]), outputs[name], runs[name])
            for name in modes}


@torch.no_grad()
def target_nll(target, prompts: list[torch.Tensor], continuations: list[list[int]]) -> float:
    """Mean NLL (nats/token) of ``continuations`` under ``target``, teacher-forced after each prompt.

    A (prompt, continuation) pair that occurs again (the same tokens of another pass) is scored once
    and counted as often as it occurs."""
    if len(prompts) != len(continuations):
        raise ValueError(f"prompts and continuations must pair up, got {len(prompts)} and {len(continuations)}")
    device = next(target.parameters()).device
    counts: dict[tuple, list] = {}  # (prompt tokens, continuation) -> [prompt, continuation, occurrences]
    for ids, cont in zip(prompts, continuations):
        if cont:
            entry = counts.setdefault((tuple(ids.tolist()), tuple(cont)), [ids, cont, 0])
            entry[2] += 1
    total, count = 0.0, 0
    for ids, cont, times in counts.values():
        seq = torch.cat([ids.to(device), torch.tensor(cont, dtype=torch.long, device=device)]).view(1, -1)
        logits = target(seq).logits[0, ids.numel() - 1: -1].float()  # [N, V]
        logp = torch.log_softmax(logits, dim=-1)
        total += times * float(-logp.gather(1, seq[0, ids.numel():].view(-1, 1)).sum())
        count += times * len(cont)
    return total / count if count else float("nan")


HUMANEVAL_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")


def truncate_completion(text: str, stops=HUMANEVAL_STOPS) -> str:
    """Cut generated code at the first HumanEval stop sequence (Chen et al. 2021's convention)."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]
