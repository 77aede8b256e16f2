"""Benchmark the model pool and the logit cache on the offline default (SmolLM2-135M).

Measures, side by side in one process:
- SmolLM2 load time: first load (GGUF dequantize + safetensors conversion, into a fresh
  MDBOOST_HOME) vs a cached load of the converted folder;
- cost ratios c of the default drafters at 1 torch thread (the engine's setting), measured in
  the engine's own steps (``mdboost.engine.costs.measure_engine_cost``: median and 5-95% range
  of the repeats, with the threads and the 1-minute load), beside the bare single-token forward
  ratio (``measure_cost_ratio``) that misses the engine's per-draft-token work;
- caching throughput vs a bare forward loop over the same sequences and members;
- bytes per cached token per member;
- SD acceptance ``1 - TV(p, q)`` at temperature 1 on sampled positions for each default
  drafter: exact (full-vocabulary logits) and from the top-k cache with its error bound.

Writes the ``cache`` section of ``bench/RESULTS.md``.
Usage: ``.venv/bin/python bench/cache.py [--records 16] [--positions 240] [--device cpu]``;
``--costs-only`` prints the cost table alone (no cache build, ``RESULTS.md`` untouched).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from _results import machine_line, update_section  # noqa: E402
from mdboost.cache import LogitCache, SequenceSettings, StoreSettings, build_cache  # noqa: E402
from mdboost.cache.build import member_logits, split_sequences  # noqa: E402
from mdboost.data import load_texts  # noqa: E402
from mdboost.engine.costs import measure_engine_cost  # noqa: E402
from mdboost.models.cost import measure_cost_ratio  # noqa: E402
from mdboost.models.loading import load_model  # noqa: E402
from mdboost.models.pool import build_pool, default_drafters  # noqa: E402
from mdboost.ranking.support import pair_probs  # noqa: E402

TARGET = "smollm2-135m"


def load_times() -> dict:
    with tempfile.TemporaryDirectory() as home:
        start = time.perf_counter()
        load_model(TARGET, device="cpu", home=home)
        first = time.perf_counter() - start
        start = time.perf_counter()
        load_model(TARGET, device="cpu", home=home)
        cached = time.perf_counter() - start
    return {"first": first, "cached": cached}


def cost_table(pool, repeats: int) -> tuple[list[str], dict]:
    """Markdown rows of the cost ratios at 1 torch thread, and ``{drafter: CostMeasurement}``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results, lines = {}, ["| drafter | c (engine, median) | 5-95% | IQR | c (bare forward) | 1-min load |",
                              "|---|---|---|---|---|---|"]
        for member in pool.drafters:
            r = measure_engine_cost(member.ngram if member.kind == "ngram" else member.model, pool.target.model,
                                    context_len=128, repeats=repeats, threads=1)
            bare = measure_cost_ratio(member, pool.target, context_len=128, repeats=21)[0]
            (lo, hi), (q1, q3) = r.spread(0.9), r.spread(0.5)
            results[member.name] = r
            lines.append(f"| {member.name} | {r.median:.3f} | [{lo:.3f}, {hi:.3f}] | [{q1:.3f}, {q3:.3f}] | "
                         f"{bare:.3f} | {r.load_before:.2f} -> {r.load_after:.2f} |")
    finally:
        torch.set_num_threads(before)
    return lines, results


def throughput(pool, records, out_dir, k: int) -> dict:
    """Wall time of the cache build vs a bare forward loop (same sequences, same members)."""
    from safetensors.torch import load_file

    build_cache(pool, records[:1], Path(out_dir) / "warm", StoreSettings(k=k))  # warm-up (allocations, caches)
    start = time.perf_counter()
    build_cache(pool, records, Path(out_dir) / "main", StoreSettings(k=k))
    cache_time = time.perf_counter() - start
    seqs = split_sequences(load_file(str(Path(out_dir) / "main" / "tokens.safetensors")))
    start = time.perf_counter()
    for member in pool.members:
        for ids, first in seqs:
            if member.kind == "ngram":
                member.ngram.propose_all(ids, 4)
            else:
                member_logits(member.model, ids, first)
    bare_time = time.perf_counter() - start
    cache = LogitCache.open(Path(out_dir) / "main")
    sizes = {}
    for name in cache.members:
        slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        sizes[name] = sum(p.stat().st_size for p in (Path(out_dir) / "main").glob(f"{slug}-*.safetensors")) / cache.num_rows
    tokens = sum(ids.numel() for ids, _ in seqs)
    return {"cache": cache_time, "bare": bare_time, "rows": cache.num_rows, "tokens": tokens, "bytes": sizes}


def acceptance(pool, records, out_dir, new_tokens: int) -> dict:
    build_cache(pool, records, out_dir, StoreSettings(k=32, keep_full=True),
                SequenceSettings(source="sampled", max_new_tokens=new_tokens))
    cache = LogitCache.open(out_dir)
    target = cache.probs(TARGET, tail="full")
    result = {}
    for name in cache.members[1:]:
        pair = pair_probs(cache, name, TARGET, tail="uniform")
        if cache.kind(name) == "ngram":
            exact = pair.acceptance() * pair.valid  # no proposal: nothing accepted
            result[name] = (exact.mean().item(), exact.mean().item(), 0.0, pair.valid.float().mean().item())
            continue
        exact = torch.minimum(cache.probs(name, tail="full"), target).sum(-1)
        tails = cache.kept_probs(name, tail="uniform")[2] + cache.kept_probs(TARGET, tail="uniform")[2]
        result[name] = (exact.mean().item(), pair.acceptance().mean().item(), tails.mean().item(), 1.0)
    return {"rows": cache.num_rows, "acc": result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=16, help="cache-split HumanEval records for throughput")
    parser.add_argument("--positions", type=int, default=240, help="sampled positions for acceptance")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--cost-repeats", type=int, default=21, help="repeats of the engine cost measurement")
    parser.add_argument("--costs-only", action="store_true", help="print the cost table only")
    args = parser.parse_args()

    if args.costs_only:
        pool = build_pool(TARGET, list(default_drafters(args.device)), device=args.device)
        rows, costs = cost_table(pool, args.cost_repeats)
        print("\n".join(rows + ["", f"Method: {next(iter(costs.values())).method}."]))
        return
    loads = load_times()
    pool = build_pool(TARGET, list(default_drafters(args.device)), device=args.device)
    cost_rows, costs = cost_table(pool, args.cost_repeats)
    records = load_texts(split="cache", limit=args.records)
    held = load_texts(split="heldout", limit=8)
    with tempfile.TemporaryDirectory() as tmp:
        speed = throughput(pool, records, Path(tmp) / "speed", args.k)
        acc = acceptance(pool, held, Path(tmp) / "acc", max(1, args.positions // len(held)))

    lines = [f"### Model pool and logit cache (`bench/cache.py`, target {TARGET}, device {args.device})", "",
             machine_line(), "",
             f"- SmolLM2 load: first (GGUF dequantize + convert) {loads['first']:.1f} s, cached {loads['cached']:.2f} s "
             f"({loads['first'] / loads['cached']:.0f}x faster).",
             f"- Cache build vs bare forward loop over the same {len(records)} sequences ({speed['tokens']} tokens, "
             f"{speed['rows']} cached rows, {len(pool)} members, k={args.k}, fp16): {speed['cache']:.1f} s vs "
             f"{speed['bare']:.1f} s, overhead **{100 * (speed['cache'] / speed['bare'] - 1):+.1f}%**; "
             f"{speed['rows'] * len(pool) / speed['cache']:.0f} member-rows/s.", "",
             f"SD acceptance 1 - TV(p, q) at temperature 1 on {acc['rows']} positions sampled from the target "
             "(held-out prompts): exact from full logits, and from the top-k cache (uniform tail) with the mean "
             "error bound tail_p + tail_q. Cost ratio c: the engine's drafter time per draft token over its "
             "single-token target step (median of the repeats; table below).", "",
             "| drafter | cost ratio c | acceptance (exact) | acceptance (top-k) | bound | bytes/token |",
             "|---|---|---|---|---|---|"]
    for member in pool.drafters:
        exact, approx, bound, coverage = acc["acc"][member.name]
        note = f" (draft on {100 * coverage:.0f}% of positions)" if member.kind == "ngram" else ""
        lines.append(f"| {member.name} | {costs[member.name].median:.3f} | {exact:.3f}{note} | {approx:.3f} | "
                     f"{bound:.3f} | {speed['bytes'][member.name]:.0f} |")
    lines += ["", f"Target bytes/token: {speed['bytes'][TARGET]:.0f}.", "",
              "Cost ratios at 1 torch thread: the engine's steps (median, 5-95% and interquartile range of the "
              "repeats) and the bare single-token forward, with the 1-minute load before and after.", "",
              *cost_rows, "", f"Cost method: {next(iter(costs.values())).method}."]
    update_section("cache", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
