"""Benchmark: how often the ranking's intervals cover the truth, by number of prompts.

Every predicted figure is a ratio of sums over prompts (``mdboost.ranking.uncertainty``). This
script simulates prompts whose truth is known -- per prompt ``L ~ U{40..80}`` tokens at a cost
``L f``, with a lognormal prompt difficulty ``f`` (sigma 0.35), so the figure is
``sum L / sum L f`` and its truth ``E[L] / E[L f]`` (one two-million-prompt draw) -- and, for
``B`` prompts, counts how often the library's interval at the default level 0.9 contains the
truth: the plain percentile interval (``percentile_interval(samples, level)``) and the expanded
one the ranking reports (``num_prompts=B``, Hesterberg 2015). The same resamples serve both.

Usage: ``.venv/bin/python bench/interval_coverage.py [--trials 1500] [--no-write]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import machine_line, update_section  # noqa: E402
from mdboost.ranking.uncertainty import (DEFAULT_LEVEL, BootstrapSettings, expanded_tail,  # noqa: E402
                                         percentile_interval, prompt_weights, resample_sums)

PROMPTS = (3, 4, 8, 16, 32, 64)
SIGMA = 0.35  # spread of the prompts' difficulty (log scale)


def draw_prompts(n: int, gen: torch.Generator):  # -> tokens [n], cost [n]
    tokens = torch.randint(40, 81, (n,), generator=gen).double()
    difficulty = torch.exp(SIGMA * torch.randn(n, generator=gen, dtype=torch.float64))
    return tokens, tokens * difficulty


def coverage(num_prompts: int, trials: int, truth: float, resamples: int = 1000, level: float = DEFAULT_LEVEL,
             seed: int = 0) -> tuple[float, float]:
    """``(plain, expanded)``: the fraction of ``trials`` simulated rankings whose interval covers ``truth``."""
    gen = torch.Generator().manual_seed(seed + num_prompts)
    hits = torch.zeros(2)
    for t in range(trials):
        tokens, cost = draw_prompts(num_prompts, gen)
        weights = prompt_weights(num_prompts, BootstrapSettings(num_resamples=resamples, seed=seed * 100003 + t))
        ratio = resample_sums(tokens, weights) / resample_sums(cost, weights)  # [R]
        for i, n in enumerate((None, num_prompts)):
            lo, hi = percentile_interval(ratio[:, None], level, num_prompts=n)
            hits[i] += float(lo[0]) <= truth <= float(hi[0])
    return float(hits[0]) / trials, float(hits[1]) / trials


def main(trials: int = 1500, write: bool = True) -> str:
    start = time.perf_counter()
    tokens, cost = draw_prompts(2_000_000, torch.Generator().manual_seed(1))
    truth = float(tokens.sum() / cost.sum())
    lines = [
        "## interval_coverage: how often the ranking's 90% intervals cover the truth",
        "",
        machine_line(),
        "",
        f"Simulated prompts with a known truth (module docstring of `bench/interval_coverage.py`), {trials} "
        f"rankings per row, 1000 resamples each. Plain: the percentile interval; expanded: the one the ranking "
        f"reports (`num_prompts=B`, Hesterberg 2015), whose tail is `alpha'/2`. A binomial proportion over "
        f"{trials} trials has a standard error of about {100 * (0.9 * 0.1 / trials) ** 0.5:.1f} points.",
        "",
        "| prompts B | alpha'/2 | plain percentile | expanded (reported) |",
        "|---|---|---|---|",
    ]
    for n in PROMPTS:
        plain, expanded = coverage(n, trials, truth)
        lines.append(f"| {n} | {expanded_tail(DEFAULT_LEVEL, n):.4f} | {plain:.3f} | {expanded:.3f} |")
        print(lines[-1], flush=True)
    lines += ["", f"_Total {time.perf_counter() - start:.0f} s; `python bench/interval_coverage.py`._"]
    text = "\n".join(lines)
    if write:
        update_section("interval_coverage", text)
    return text


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1500)
    parser.add_argument("--no-write", action="store_true", help="print only, leave bench/RESULTS.md alone")
    args = parser.parse_args()
    print(main(args.trials, write=not args.no_write))
