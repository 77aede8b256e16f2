"""Where a prompt-lookup cell's time goes in llama.cpp, part by part, against plain decoding's.

The llama.cpp validation's low misses are prompt lookup's (``bench/llamacpp_validation.py``). This
script runs the recommendation's cell (``ngram:3`` SD at gamma 1 on greedy drafts, T = 0.7) and
plain decoding on the validation's held-out prompts through :class:`~mdboost.engine.llamacpp.LlamaCppModel`,
interleaved per prompt, ``--passes`` times, with end-of-text ignored (every generation makes
exactly 64 tokens, so both modes do the same work), every target forward timed. Per mode: the
prefill, then per decoding call the forward, the target's ``q`` (:class:`GenerationStats`
``time_target`` less the forward), verification, the lookup (``time_drafter``) and the rest;
the share of calls that drafted; the speedup per pass and over all passes. The section
``llamacpp_step_parts`` of ``bench/RESULTS.md``.

Run: ``python bench/llamacpp_step_parts.py [--passes 3] [--prompts 10] [--no-write]`` (needs
``pip install 'mdboost[llamacpp]'``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._llamacpp_timing import NEW_TOKENS, TEMPERATURE, held_out_setup, machine  # noqa: E402
from bench._results import load_line, update_section  # noqa: E402
from mdboost.validation.runs import run_modes  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=3, help="passes over the prompts")
    parser.add_argument("--prompts", type=int, default=10, help="held-out prompts (the validation's first ones)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    log, target, _, prompts, modes = held_out_setup(args.prompts)
    parts = {name: dict(total=0.0, prefill=0.0, forward=0.0, target=0.0, verify=0.0, drafter=0.0, calls=0,
                        drafted=0, tokens=0) for name in modes}
    per_pass = []
    start = os.getloadavg()[0]
    for p in range(args.passes):
        rates = {name: [0, 0.0] for name in modes}
        for i, prompt in enumerate(prompts):
            for name, mode in modes.items():
                first = len(log)
                stats = run_modes(target, [prompt], {name: mode}, seed=i, max_new_tokens=NEW_TOKENS,
                                  temperature=TEMPERATURE, eos_token_id=None)[name].stats
                forwards = log[first:]
                part = parts[name]
                part["total"] += stats.time_total
                part["prefill"] += forwards[0][2]
                part["forward"] += sum(seconds for _, _, seconds in forwards[1:])
                part["target"] += stats.time_target - forwards[0][2]
                part["verify"] += stats.time_verify
                part["drafter"] += stats.time_drafter
                part["calls"] += stats.num_target_calls - 1
                part["drafted"] += stats.num_drafts
                part["tokens"] += stats.num_new_tokens
                rates[name][0] += stats.num_new_tokens
                rates[name][1] += stats.time_total
        plain, cell = ((n / s) for n, s in rates.values())
        per_pass.append(cell / plain)
    rows = ["| mode | tokens | prefill s | decoding calls | drafted | ms per call | forward | q | verification | "
            "lookup | rest |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    per_call = {}
    for name, part in parts.items():
        calls = part["calls"]
        decode = part["total"] - part["prefill"]
        per_call[name] = decode / calls
        q = part["target"] - part["forward"]
        rest = decode - part["target"] - part["verify"] - part["drafter"]
        rows.append(f"| {name} | {part['tokens']} | {part['prefill']:.1f} | {calls} | {part['drafted'] / calls:.0%} | "
                    f"{1e3 * decode / calls:.2f} | {1e3 * part['forward'] / calls:.2f} | {1e3 * q / calls:.2f} | "
                    f"{1e3 * part['verify'] / calls:.2f} | {1e3 * part['drafter'] / calls:.2f} | {1e3 * rest / calls:.2f} |")
    plain_rate, cell_rate = ((p["tokens"] / p["total"]) for p in parts.values())
    ratio = per_call["ngram:3 SD, gamma 1"] / per_call["plain decoding"]
    text = "\n\n".join([
        "## llamacpp_step_parts: a prompt-lookup cell's time in llama.cpp, part by part "
        "(`bench/llamacpp_step_parts.py`)",
        f"{machine()} {args.passes} passes over {len(prompts)} held-out prompts (the "
        f"validation's), {NEW_TOKENS} tokens each with end-of-text ignored, T = {TEMPERATURE:g}, the two modes "
        "interleaved per prompt; per decoding call (the prefill apart): the target's forward, its `q`, "
        "verification, the lookup and the rest.",
        "\n".join(rows),
        f"A lookup call costs {ratio:.3f} plain calls. Speedup over all passes {cell_rate / plain_rate:.3f}; per pass "
        + ", ".join(f"{s:.3f}" for s in per_pass) + ".",
        load_line(start),
    ])
    print(text)
    if not args.no_write:
        update_section("llamacpp_step_parts", text)


if __name__ == "__main__":
    main()
