"""The fixed cost of one ``solve`` call: single rows at V in {50, 1000, 49152}, one thread.

Prints (does not write bench/RESULTS.md; the figures of record are ``bench/md_core.py``'s):

1. median time of ``solve(p, q, max_divergence=0.05)`` on one float32 row (KL; validation on
   and off), and of the notebook port (``bench/_notebook.py``, rkl as in ``md_baseline``) at
   the same V, the calls interleaved;
2. with ``--profile``: a cProfile of many calls per V, the top functions by own time (where
   the per-call overhead sits).

Run: ``python bench/solve_tax.py [--profile] [--repeats N]``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _notebook import notebook_solve  # noqa: E402
from md_core import BUDGET, llm_like_pair  # noqa: E402

from mdboost.md.solve import solve  # noqa: E402

VOCABS = (50, 1000, 49152)


def _calls(vocab):
    p, q = llm_like_pair(1, vocab, torch.float32, seed=3)
    p, q = p[0], q[0]
    return {
        "solve": lambda: solve(p, q, max_divergence=BUDGET),
        "solve(validate=False)": lambda: solve(p, q, max_divergence=BUDGET, validate=False),
        "solve rkl": lambda: solve(p, q, max_divergence=BUDGET, divergence="rkl"),
        "notebook rkl": lambda: notebook_solve(p, q, BUDGET),
    }


def timings(repeats: int):
    """Median per-call seconds per (V, call), the calls of one V interleaved in blocks."""
    out = {}
    for vocab in VOCABS:
        calls = _calls(vocab)
        inner = 20 if vocab < 4096 else 3
        for fn in calls.values():  # warm-up
            for _ in range(3):
                fn()
        times = {name: [] for name in calls}
        for _ in range(repeats):
            for name, fn in calls.items():
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                times[name].append((time.perf_counter() - t0) / inner)
        out[vocab] = {name: statistics.median(t) for name, t in times.items()}
    return out


def profile(vocab: int, calls: int = 300, top: int = 25):
    fn = _calls(vocab)["solve"]
    for _ in range(5):
        fn()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    print(f"\n=== cProfile, solve at V = {vocab}, {calls} calls (times are totals) ===")
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    res = timings(args.repeats)
    names = list(next(iter(res.values())))
    print("| V | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for vocab, row in res.items():
        print(f"| {vocab} | " + " | ".join(f"{row[n] * 1e3:.3f} ms" for n in names) + " |")
    if args.profile:
        for vocab in VOCABS:
            profile(vocab, 300 if vocab < 4096 else 40)


if __name__ == "__main__":
    main()
