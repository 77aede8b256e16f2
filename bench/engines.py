"""The engines' rules on the default pool: SGLang's mapped thresholds, the heuristics' gap to MD, block verification.

Reads the default pool's cached positions (``configs/full.yaml``'s acceptance cache: text
sampled from the target, the rows the ranking scores acceptance on) without loading a model, and
reports, per drafter and temperature:

1. **SGLang at each budget's mapped threshold** (``mdboost.md.rules.Threshold.for_budget``, greedy
   drafts): the achieved ``D_f(pi || q)`` at every cached position (max <= the budget: the goal),
   its mean acceptance, and MD's on the same greedy drafts at the same per-position divergence
   (the optimality gap of ``mdboost.ranking.frontier``), and at the budget itself;
2. **the field's heuristics** (``mdboost.ranking.frontier``): the largest and the median gap;
3. **block verification** (vLLM's ``"block"``): expected accepted drafts per block of ``K``
   consecutive positions of a sequence, ``mdboost.md.block.block_acceptance_estimate`` against
   token-wise rejection's product of ``1 - TV`` (positions read off the text, as the ranking
   does), sampled drafts; greedy drafts have token-wise rejection's law exactly (theory section 5b).

Rows are each member's cached top-k renormalised (``tail="drop"``,
``mdboost.ranking.frontier.cached_positions``): one token a column, as the thresholds' and the
heuristics' tests need. Run: ``python bench/engines.py [--rows N] [--no-write]``
(writes the section ``engines`` of ``bench/RESULTS.md``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import machine_line, update_section  # noqa: E402

DIVERGENCES = ("kl", "tv", "hellinger")
BUDGETS = (0.05, 0.2, 1.0)
BLOCK_K = (2, 4, 8)


def _sglang(p, q, divergence: str, budget: float) -> dict:
    from mdboost.md.rules import Mentored, Threshold
    from mdboost.md.solve import solve

    rule = Threshold.for_budget(budget, divergence)
    law = rule.law(p, q)
    achieved = rule.achieved_divergence(p, q, divergence)
    at_equal = solve(rule.proposal(p), q, max_divergence=achieved.clamp(min=0.0), divergence=divergence,
                     validate=False)
    at_budget = Mentored(max_divergence=budget, divergence=divergence, drafting="greedy").law(p, q)
    return {"c": rule.accept, "max_div": float(achieved.max()), "mean_div": float(achieved.mean()),
            "acc": float(law.acceptance.mean()), "md_equal": float(at_equal.acceptance.double().mean()),
            "md_budget": float(at_budget.acceptance.mean()),
            "within": bool(float(achieved.max()) <= budget * (1 + 1e-9))}


def _blocks(p, q, seq, k: int, limit: int = 4000):
    """Blocks of ``k`` consecutive valid rows of one sequence, starting every ``max(BLOCK_K)`` rows
    (the same starts for every ``k``: a shorter block is a prefix of a longer one): ``[M, k, S]`` x2."""
    width = max(BLOCK_K)
    import torch

    starts = []
    n = p.shape[0]
    for s in range(0, n - width + 1, width):
        window = slice(s, s + width)
        if bool((seq[window] == seq[s]).all()):
            starts.append(s)
        if len(starts) >= limit:
            break
    idx = torch.tensor(starts)[:, None] + torch.arange(k)[None, :]
    return p[idx], q[idx]


def _block_gain(p, q, seq, k: int) -> dict:
    import torch

    from mdboost.md.block import block_acceptance_estimate

    pb, qb = _blocks(p, q, seq, k)
    est, err = block_acceptance_estimate(pb, qb, num_samples=512, generator=torch.Generator().manual_seed(0),
                                         validate=False)
    token = torch.minimum(pb, qb).sum(-1).cumprod(-1)  # P(accepted >= j) token-wise, [M, k]
    block_mean, token_mean = float(est.sum(-1).mean()), float(token.sum(-1).mean())
    return {"blocks": pb.shape[0], "block": block_mean, "token": token_mean, "gain": block_mean / token_mean - 1,
            "se": float(err.sum(-1).pow(2).mean().sqrt() / math.sqrt(pb.shape[0]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/full.yaml")
    parser.add_argument("--rows", type=int, default=3000, help="cached positions per pair (the first N)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    from mdboost.cache import open_or_build_cache
    from mdboost.ranking.frontier import cached_positions, frontier
    from pipelines.config import RankConfig
    from pipelines.loader import load_yaml

    cfg = dataclasses.replace(load_yaml(ROOT / args.config, RankConfig), progress=False)
    sglang_rows, heuristic_rows, block_rows = [], [], []
    all_within = True
    for temperature in cfg.md.temperatures:
        pc, _ = open_or_build_cache(cfg.cache_spec(temperature))
        for drafter in [m for m in pc.names if m != pc.target and pc.kind(m) != "ngram"]:
            pv, qv, seq = cached_positions(pc, drafter, pc.target, temperature, args.rows)
            for divergence in DIVERGENCES:
                for budget in BUDGETS:
                    r = _sglang(pv, qv, divergence, budget)
                    all_within &= r["within"]
                    sglang_rows.append(f"| {drafter} | {temperature:g} | {divergence} | {budget:g} | {r['c']:.4g} | "
                                       f"{r['max_div']:.4f} | {r['mean_div']:.4f} | {r['acc']:.4f} | "
                                       f"{r['md_equal']:.4f} ({r['md_equal'] - r['acc']:+.4f}) | "
                                       f"{r['md_budget']:.4f} ({r['md_budget'] - r['acc']:+.4f}) |")
                fr = frontier(pv, qv, divergence)
                gaps = [pt.gap for pt in fr.points if math.isfinite(pt.gap)]
                worst = max(fr.points, key=lambda pt: pt.gap if math.isfinite(pt.gap) else -1)
                heuristic_rows.append(f"| {drafter} | {temperature:g} | {divergence} | {len(fr.points)} | "
                                      f"{min(gaps):+.4f} | {statistics.median(gaps):+.4f} | {max(gaps):+.4f} "
                                      f"({worst.rule} {worst.drafting} {worst.parameter}={worst.value:g}) |")
            for k in BLOCK_K:
                g = _block_gain(pv, qv, seq, k)
                block_rows.append(f"| {drafter} | {temperature:g} | {k} | {g['blocks']} | {g['token']:.4f} | "
                                  f"{g['block']:.4f} +- {g['se']:.4f} | {100 * g['gain']:+.1f}% |")
    lines = [
        "## engines: SGLang's thresholds, the heuristics' gap and block verification on the default pool", "",
        machine_line(), "",
        f"`bench/engines.py`: the first {args.rows} cached positions of each (drafter, temperature) of "
        f"`{args.config}` (acceptance cache: text sampled from the target), each member's top-k renormalised.", "",
        "### SGLang at each budget's mapped threshold (greedy drafts)", "",
        f"Every position within its budget: **{'yes' if all_within else 'NO'}**. MD columns: MD on the same greedy "
        "drafts at each position's achieved divergence (the optimality gap), then at the budget itself.", "",
        "| drafter | T | f | budget D | c | max D_f | mean D_f | SGLang acc | MD acc, same D_f per position "
        "| MD acc at D |", "|---|---|---|---|---|---|---|---|---|---|", *sglang_rows, "",
        "### The heuristics' optimality gap (MD at each point's per-position divergence minus the point)", "",
        "| drafter | T | f | points | min gap | median gap | max gap (at) |", "|---|---|---|---|---|---|---|",
        *heuristic_rows, "",
        "### Block verification vs token-wise rejection (sampled drafts; expected accepted drafts per block)", "",
        "| drafter | T | K | blocks | token-wise | block (+- s.e.) | gain |", "|---|---|---|---|---|---|---|",
        *block_rows,
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        update_section("engines", text)


if __name__ == "__main__":
    main()
