"""Do llama.cpp's cost ratios hold from the cost measurement to the runs they predict? Side by side, one process.

The llama.cpp validation (``bench/llamacpp_validation.py``) missed low: drafted cells ran slower against
plain decoding than the ranking's costs, measured minutes before, predicted. This script puts both
measurements in one process and repeats them, in rounds. Each round:

1. the target's profile as the ranking measures it (:func:`mdboost.engine.costs.measure_engine_profile`
   on the shipped GGUF through :class:`~mdboost.engine.llamacpp.LlamaCppModel`, one thread, ``--repeats``
   repeats, no early stop): ``T_ar``, ``v(1)``, ``v(2)``, the prefill slope ``beta``;
2. the held-out generations as ``mdboost validate`` runs them (:func:`mdboost.validation.runs.run_modes`:
   plain decoding and ``ngram:3`` SD at gamma 1 on greedy drafts, the validation's recommendation,
   interleaved per prompt, ``--prompts`` held-out HumanEval prompts, 64 new tokens, T = 0.7).

Every target forward of both is timed (width and seconds). The generations are seeded, so every round
generates the same tokens: a change of the realized speedup between rounds is the machine's alone.
Reported per round: the profile's figures, the same ratios read off the generations' forwards (the
median 2-token forward over the median 1-token forward; a prompt's prefill over its length, in 1-token
forwards), and the realized speedup. The section ``llamacpp_drift`` of ``bench/RESULTS.md``.

Run: ``python bench/llamacpp_drift.py [--rounds 3] [--repeats 7] [--prompts 10] [--no-write]``
(needs ``pip install 'mdboost[llamacpp]'``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._llamacpp_timing import NEW_TOKENS, TEMPERATURE, held_out_setup, machine  # noqa: E402
from bench._results import load_line, update_section  # noqa: E402
from mdboost.engine.costs import measure_engine_profile  # noqa: E402
from mdboost.engine.settings import GenerationSettings  # noqa: E402
from mdboost.validation.runs import run_modes  # noqa: E402


def _forward_ratios(log: list, phase: str, prompt_lengths: set[int]) -> tuple[float, float, float]:
    """``(median 1-token forward seconds, 2-token over 1-token, prefill per prompt token in 1-token forwards)``
    from the forwards of ``phase`` (a prefill: a forward whose width is a prompt's length, plus a draft)."""
    widths: dict[int, list[float]] = {}
    prefill = []
    for p, width, seconds in log:
        if p != phase:
            continue
        if width in prompt_lengths or width - 1 in prompt_lengths:
            prefill.append((width, seconds))
        else:
            widths.setdefault(width, []).append(seconds)
    one = statistics.median(widths[1])
    two = statistics.median(widths[2]) / one if 2 in widths else float("nan")
    beta = statistics.median(s / one / w for w, s in prefill) if prefill else float("nan")
    return one, two, beta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="profile + generations rounds")
    parser.add_argument("--repeats", type=int, default=7, help="repeats of each round's profile")
    parser.add_argument("--prompts", type=int, default=10, help="held-out prompts of each round's generations")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    log, target, tokenizer, prompts, modes = held_out_setup(args.prompts)
    plain, lookup = modes
    lengths = {int(p.numel()) for p in prompts}
    start = os.getloadavg()[0]
    rows = []
    for r in range(args.rounds):
        target.phase = f"profile{r}"
        profile = measure_engine_profile(target, 2, repeats=args.repeats, rel_tol=0,
                                         settings=GenerationSettings(temperature=TEMPERATURE))
        target.phase = f"gen{r}"
        runs = run_modes(target, prompts, modes, seed=0, max_new_tokens=NEW_TOKENS, temperature=TEMPERATURE,
                         eos_token_id=tokenizer.eos_token_id)
        speedup = runs[lookup].stats.tokens_per_second / runs[plain].stats.tokens_per_second
        p_one, p_two, p_beta = _forward_ratios(log, f"profile{r}", {128, 129})
        g_one, g_two, g_beta = _forward_ratios(log, f"gen{r}", lengths)
        rows.append((r, profile, p_one, p_two, p_beta, g_one, g_two, g_beta, speedup, os.getloadavg()[0]))
        print(f"round {r}: profile v(1) {profile.verify_cost[1]:.3f}, the generations' 2/1 forwards {g_two:.3f}, "
              f"realized speedup {speedup:.3f}", flush=True)
    table = ["| round | profile T_ar ms | v(1) | beta | profile forwards: 1-token ms, 2/1, prefill/token | "
             "generations' forwards: 1-token ms, 2/1, prefill/token | realized speedup (ngram:3, gamma 1) | load |",
             "|---|---|---|---|---|---|---|---|"]
    for r, prof, p_one, p_two, p_beta, g_one, g_two, g_beta, speedup, load in rows:
        table.append(f"| {r} | {1e3 * prof.step_seconds:.1f} | {prof.verify_cost[1]:.3f} | {prof.prefill_per_token:.3f} | "
                     f"{1e3 * p_one:.1f}, {p_two:.3f}, {p_beta:.3f} | {1e3 * g_one:.1f}, {g_two:.3f}, {g_beta:.3f} | "
                     f"{speedup:.3f} | {load:.2f} |")
    speedups = [row[8] for row in rows]
    v1 = [row[1].verify_cost[1] for row in rows]
    text = "\n\n".join([
        "## llamacpp_drift: llama.cpp's cost ratios from the cost measurement to the runs they predict "
        "(`bench/llamacpp_drift.py`)",
        f"{machine()} {args.rounds} rounds in one process, each the target's profile "
        f"({args.repeats} repeats, as the ranking measures it) then {args.prompts} held-out prompts x {NEW_TOKENS} "
        f"tokens of plain decoding and ngram:3 SD at gamma 1 (greedy drafts), interleaved per prompt; every round "
        "generates the same tokens (seeded), so a change between rounds is the machine's.",
        "\n".join(table),
        f"Across rounds: realized speedup {min(speedups):.3f}-{max(speedups):.3f}, the profile's v(1) "
        f"{min(v1):.3f}-{max(v1):.3f}.",
        load_line(start),
    ])
    print(text)
    if not args.no_write:
        update_section("llamacpp_drift", text)


if __name__ == "__main__":
    main()
