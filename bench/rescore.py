"""Benchmark: re-ranking a finished ranking with a cost profile (``mdboost rank --costs``) against a full re-run.

On a config whose caches are finished (default: ``configs/default.yaml``), in a scratch folder:

1. copy the config's cache folder there (the source is only read: a rank that found something
   missing would build into the copy, never into the source);
2. ``mdboost rank`` with this machine's speed file (the full re-run: caches opened, verified,
   every pair scored), timed;
3. ``mdboost profile --out`` (the pool's costs as a portable profile: nothing to measure when the
   speed file is complete);
4. ``mdboost rank --costs`` with that profile into another output folder, timed;

then prints each command's wall time (process start and imports included) and ``summary.json``'s
``seconds_total``, ``seconds_cache`` and ``seconds_scoring``, and whether the two ``ranking.csv``
are byte-identical. Tracking is off in both runs (MLflow's logging is not re-scoring).

Usage: ``.venv/bin/python bench/rescore.py [--config configs/default.yaml] [--cache DIR] [--work DIR]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.config import RankConfig  # noqa: E402
from pipelines.loader import load_yaml, to_dict  # noqa: E402


def _timed(argv: list[str]) -> float:
    """Run ``python -m mdboost.cli argv`` from the repository root; its wall seconds (it must succeed)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mdboost.cli", *argv], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def scratch_config(config: str, cache: Path, work: Path) -> Path:
    """The config with its cache in ``work`` (a copy of ``cache``), its output there, tracking off."""
    data = to_dict(load_yaml(config, RankConfig))
    shutil.copytree(cache, work / "cache", ignore=shutil.ignore_patterns(".*.lock"))
    data["cache"]["dir"] = str(work / "cache")
    data["output_dir"] = str(work / "full")
    data["tracking"]["enabled"] = False
    data["progress"] = False
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _seconds(summary: Path) -> str:
    s = json.loads(summary.read_text())
    return (f"seconds_total {s['seconds_total']:.1f} (cache {s['seconds_cache']:.1f}, scoring "
            f"{s['seconds_scoring']:.1f}), cache_reused {s['cache_reused']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/default.yaml")
    parser.add_argument("--cache", default=None, help="finished cache folder (default: the config's cache.dir)")
    parser.add_argument("--work", default=None, help="scratch folder (default: a new temporary one)")
    args = parser.parse_args()
    cache = Path(args.cache or load_yaml(args.config, RankConfig).cache.dir).resolve()
    work = Path(args.work or tempfile.mkdtemp(prefix="mdboost-rescore-"))
    config = scratch_config(args.config, cache, work)
    full = _timed(["rank", "--config", str(config)])
    _timed(["profile", "--config", str(config), "--out", str(work / "profile.json")])
    rescored = _timed(["rank", "--config", str(config), "--costs", str(work / "profile.json"),
                       "--set", f"output_dir={work / 'rescored'}"])
    same = (work / "full" / "ranking.csv").read_bytes() == (work / "rescored" / "ranking.csv").read_bytes()
    print(f"config {args.config}, cache {cache} (copied to {work / 'cache'})")
    print(f"full re-run:       {full:.1f} s wall; {_seconds(work / 'full' / 'summary.json')}")
    print(f"rank --costs:      {rescored:.1f} s wall; {_seconds(work / 'rescored' / 'summary.json')}")
    print(f"ranking.csv identical: {same}")


if __name__ == "__main__":
    main()
