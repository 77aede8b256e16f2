"""Benchmark: how stale is the MD solve cost ``s`` in the default pool's speed file?

The speed file (``mdboost.cache.speed``) keeps the target's profile measured when it was first
built: ``v(K)``, the prefill slope and ``s``, the MD solve's extra time per solved position
(``docs/theory.md`` section 8), dense and one-hot. The core's solver has since become faster, and
``s`` is only re-measured when the cost unit changes (which moves every speed file). This script
measures the profile again with the current code in the same process conditions (one torch
thread, the spec's context and repeats), prints the stored and fresh ``s``, and re-scores the
default pool at the generation grid's points with the fresh ``s`` patched in: how much each MD
prediction moves, and the grid comparison of ``bench/predictions.py`` with it. Both sides of that
comparison are stated: grid cells measured before the solver changed ran the old engine.

Usage: ``.venv/bin/python bench/md_overhead.py [--config configs/full.yaml] [--no-write]``
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import machine_line, update_section  # noqa: E402
from bench.predictions import (GRID_SETTINGS, TABLE_HEAD, _line, compare, grid_arguments, grid_cells,  # noqa: E402
                               predicted_rows)
from mdboost.validation.calibration import predictive_scale  # noqa: E402
from pipelines.config import RankConfig  # noqa: E402
from pipelines.loader import load_yaml  # noqa: E402


def fresh_profile(cfg: RankConfig, temperature: float = 1.0) -> dict:
    """The target's profile measured now (the speed file's own measurement, not stored)."""
    from mdboost.cache.pool_cache import speed_profile_repeats
    from mdboost.engine.costs import run_alone
    from mdboost.models.pool import build_pool

    spec = cfg.cache_spec(temperature)
    target = build_pool(spec.target, [], device=spec.device, home=spec.home).target.model
    return run_alone(speed_profile_repeats(target, spec.gamma_max, spec.cost_context, spec.cost_repeats,
                                           temperature)).to_dict()


def rows_with_overhead(cfg: RankConfig, overhead: dict | None) -> list[dict]:
    """The grid-point ranking rows, with the speed file's ``md_overhead`` replaced (None: as stored)."""
    from mdboost.cache import pool_cache

    real = pool_cache.PoolCache.speed_profile_info

    def patched(self, target):
        info = real(self, target)
        return info if info is None or overhead is None else {**info, "md_overhead": overhead}

    pool_cache.PoolCache.speed_profile_info = patched
    try:
        return predicted_rows(cfg)["rows"]
    finally:
        pool_cache.PoolCache.speed_profile_info = real


def main() -> None:
    args = grid_arguments(__doc__.splitlines()[0])
    import torch

    torch.set_num_threads(1)
    cfg = load_yaml(ROOT / args.config, RankConfig)
    cfg = dataclasses.replace(cfg, progress=False)
    from mdboost.cache import open_or_build_cache

    pc, _ = open_or_build_cache(cfg.cache_spec(1.0))
    stored = pc.speed_profile_info(cfg.pool.target)["md_overhead"]
    fresh = fresh_profile(cfg)["md_overhead"]
    old_rows, new_rows = rows_with_overhead(cfg, None), rows_with_overhead(cfg, fresh)
    cells = grid_cells(args.cells)
    scale = predictive_scale(cfg.data.limit, GRID_SETTINGS["prompts"])
    old_cells, new_cells = compare(old_rows, cells, scale), compare(new_rows, cells, scale)
    moved = [n["predicted"] - o["predicted"] for o, n in zip(old_cells, new_cells) if o["budget"] > 0]
    lines = [
        "## md_overhead: the MD solve cost in the speed file, stored vs measured now",
        "", machine_line(), "",
        f"`bench/md_overhead.py`: the target's profile measured again with the current code (one thread, "
        f"context {cfg.cache.cost_context}, {cfg.cache.cost_repeats} repeats), then the default pool re-scored at the "
        "generation grid's points with it.", "",
        "| `s` per solved position | stored (speed file) | measured now |", "|---|---|---|",
        *(f"| {k} | {stored[k]:.4f} | {fresh[k]:.4f} |" for k in ("dense", "onehot")), "",
        f"MD predictions at the grid's points move by {statistics.median(moved):+.4f} (median) "
        f"[{min(moved):+.4f}, {max(moved):+.4f}] with the fresh `s` ({len(moved)} MD cells).", "",
        *TABLE_HEAD[1:], _line("all, `s` as stored", old_cells), _line("all, `s` measured now", new_cells),
        "",
        "Grid cells measured before the solver changed ran the old engine; a like-for-like comparison with "
        "the fresh `s` needs those MD cells measured again (`bench/generation.py`).",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        update_section("md_overhead", text)


if __name__ == "__main__":
    main()
