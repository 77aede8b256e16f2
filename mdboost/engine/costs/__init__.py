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

**Batch size.** With ``batch_size = B`` the prompt is ``B`` rows (each its own repeated
random block, row 0 the prompt of ``B = 1``) and every timed step runs over all ``B`` rows
(the engine's batched step): ``T_ar(B)`` is the undrafted ``B``-row step, ``v(K, B)`` a step
verifying ``K`` drafts in every row over ``T_ar(B)``, ``c(B)`` the drafter's seconds per draft
position of the batch (its draft tokens / ``B``) over ``T_ar(B)``, ``s(B)`` per drafted
position of the batch, ``beta(B)`` the forward seconds per prompt token of a ``B``-row prompt
batch over ``T_ar(B)``. Prompt lookup's per-row CPU work adds up in its ``c(B)``.

**Repeats.** ``repeats`` is a maximum: :class:`StoppingRule` stops once the 90% sign-test
interval of every reported figure's median is tight, or narrow against the single repeats'
spread (:mod:`._stopping`; ``docs/engine.md``, "Costs measured once, well"); ``rel_tol =
spread_ratio = 0`` runs all ``repeats``. :func:`cost_repeats` and
:func:`profile_repeats` are the measurements as generators, one repeat per step:
:func:`run_in_turn` interleaves several (the cache builder measures a pool's costs so, one
repeat of each figure per round), :func:`measure_engine_cost` and :func:`measure_engine_profile`
run one alone.

The results keep every sample with its median and spread, at a fixed torch thread count (the
engine's benchmarks run at 1 thread; with 2 threads on a loaded 2-core CPU the int8
drafter's ratio varied from 0.5 to 1.0 between runs where 1 thread gave 0.34 each time), and
the 1-minute load average before and after.

The package: :mod:`._timing` runs and times single engine steps (a fresh generation, the
prefill slope, the thread count and load), :mod:`._stopping` decides when the repeats stop,
:mod:`.drafter` measures a drafter's ``c``, :mod:`.target` the target's profile.
"""

from mdboost.engine.costs._stopping import (CONFIDENCE, SPREAD_RATIO, StoppingRule, median_interval, median_ranks,
                                             relative_half_width, run_alone, run_in_turn, spread_half_width)
from mdboost.engine.costs._timing import COST_UNIT, ENGINE_THREADS, PERIOD, PREFILL_LENGTHS, torch_threads
from mdboost.engine.costs.drafter import CostMeasurement, cost_repeats, measure_engine_cost
from mdboost.engine.costs.target import EngineProfile, measure_engine_profile, profile_repeats

__all__ = ["CONFIDENCE", "COST_UNIT", "SPREAD_RATIO", "ENGINE_THREADS", "PERIOD", "PREFILL_LENGTHS", "CostMeasurement", "EngineProfile",
           "StoppingRule", "cost_repeats", "measure_engine_cost", "measure_engine_profile", "median_interval",
           "median_ranks", "profile_repeats", "relative_half_width", "run_alone", "run_in_turn", "spread_half_width",
           "torch_threads"]
