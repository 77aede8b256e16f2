"""The fuzz run of the mentored decoding core (section ``fuzz_core`` of bench/RESULTS.md).

Runs the seeded harness of ``tests/_fuzz_core.py`` on ``--cases`` generated calls per dtype
and seed (``--dtypes``: float64 and float32 by default, float16 too on request; the float64 and
float32 runs draw about 8% of their cases in half precision as well; about a fifth are
malformed calls with one spoiled argument), after its fixed regression cases, over ``solve``,
``Breakpoints`` (every query and ``curve``), ``verify``, ``f_divergence``,
``mentored_distribution``, ``logits_to_probs`` and the estimator's pool mode, and writes the
counts of the three failure kinds per seed and dtype (goal: 0 of each): exceptions other than
a ValueError/TypeError naming the argument, NaN outputs, and contract violations on valid input
(``docs/theory.md``, section 9).

Run: ``.venv/bin/python bench/fuzz_core.py --seeds 11 2026 31337 8675309 --dtypes float64 float32 float16``
(about a minute and a half per 10,000 cases per dtype on one CPU core).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _results import machine_line, update_section  # noqa: E402

from tests import _fuzz_core  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000, help="generated calls per dtype and seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"], choices=["float64", "float32", "float16"])
    parser.add_argument("--no-write", action="store_true", help="print only, leave bench/RESULTS.md alone")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # numpy overflow warnings of extreme inputs are expected
    rows, failures = [], []
    for seed in args.seeds:
        for name in args.dtypes:
            report = _fuzz_core.run(seed, args.cases, (getattr(torch, name),))
            counts = {kind: report.count(kind) for kind in _fuzz_core.KINDS}
            rows.append((seed, name, report, counts))
            for kind in _fuzz_core.KINDS:
                failures += [(seed, name, kind, api, msg) for api, _, msg in report.failures[kind]]
            print(f"seed {seed}", name, report.total, "cases", f"{report.seconds:.0f} s", counts, flush=True)
    per_api = Counter()
    for *_, report, _ in rows:
        per_api.update(report.cases)
    lines = [
        "## fuzz_core: the core over the whole float range",
        "",
        machine_line(),
        "",
        f"`python bench/fuzz_core.py --cases {args.cases} --seeds {' '.join(map(str, args.seeds))} --dtypes "
        f"{' '.join(args.dtypes)}`: the seeded harness of `tests/_fuzz_core.py` (the fast suite runs it too, on "
        "fewer cases; `make test-slow` at the same seeds). Each run starts with the harness's fixed regression "
        "cases. Goal: 0 in every count column.",
        "",
        "| seed | dtype | cases | of which malformed | exceptions other than ValueError/TypeError naming the argument "
        "| NaN outputs | contract violations | time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for seed, name, report, counts in rows:
        lines.append(f"| {seed} | {name} | {report.total} | {report.malformed} | {counts['bad_exception']} "
                     f"| {counts['nan']} | {counts['violation']} | {report.seconds:.0f} s |")
    lines += ["", "Cases per entry point (all runs): " + ", ".join(f"{k} {v}" for k, v in sorted(per_api.items())) + "."]
    if failures:
        lines += ["", "First failures:", ""] + [f"- seed {sd} {d} {k} {api}: {msg[:160]}"
                                                  for sd, d, k, api, msg in failures[:20]]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        update_section("fuzz_core", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
