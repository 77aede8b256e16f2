"""Benchmark: re-ranking a finished ranking with a cost profile (``mdboost rank --costs``) against a full re-run.

On a config whose caches are finished (default: ``configs/full.yaml``), in a scratch folder:

1. copy the config's cache folder there, without its kept work (``scores/``, :mod:`mdboost.cache.scores`;
   the source is only read: a rank that found something missing would build into the copy,
   never into the source);
2. ``mdboost rank`` with this machine's speed file (the full re-run: caches opened, verified,
   every pair scored, its cost-free work kept), timed;
3. ``mdboost profile --out`` (the pool's costs as a portable profile: nothing to measure when the
   speed file is complete);
4. ``mdboost rank --costs`` with that profile into another output folder (it prices the kept
   work), timed;

then prints each command's wall time (process start and imports included) and ``summary.json``'s
``seconds_total``, ``seconds_cache`` and ``seconds_scoring``, whether the two ``ranking.csv``
are byte-identical, and the size of the kept work; and writes its section of ``bench/RESULTS.md``
(``--no-write``: print only). Tracking is off in both runs (MLflow's logging is not re-scoring).

Usage: ``.venv/bin/python bench/rescore.py [--config configs/full.yaml] [--cache DIR] [--work DIR]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import load_line, update_section  # noqa: E402
from mdboost.cache.profile import hardware_label  # noqa: E402
from mdboost.cache.scores import FOLDER  # noqa: E402
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
    shutil.copytree(cache, work / "cache", ignore=shutil.ignore_patterns(".*.lock", FOLDER))
    data["cache"]["dir"] = str(work / "cache")
    data["output_dir"] = str(work / "full")
    data["tracking"]["enabled"] = False
    data["progress"] = False
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/full.yaml")
    parser.add_argument("--cache", default=None, help="finished cache folder (default: the config's cache.dir)")
    parser.add_argument("--work", default=None, help="scratch folder (default: a new temporary one)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    cache = Path(args.cache or load_yaml(args.config, RankConfig).cache.dir).resolve()
    work = Path(args.work or tempfile.mkdtemp(prefix="mdboost-rescore-"))
    start = os.getloadavg()[0]
    config = scratch_config(args.config, cache, work)
    full = _timed(["rank", "--config", str(config)])
    _timed(["profile", "--config", str(config), "--out", str(work / "profile.json")])
    rescored = _timed(["rank", "--config", str(config), "--costs", str(work / "profile.json"),
                       "--set", f"output_dir={work / 'rescored'}"])
    same = (work / "full" / "ranking.csv").read_bytes() == (work / "rescored" / "ranking.csv").read_bytes()
    kept = sum(p.stat().st_size for p in (work / "cache" / FOLDER).iterdir())
    summary = json.loads((work / "rescored" / "summary.json").read_text())
    text = render(args.config, summary, full, rescored, same, kept, work) + f"\n\n{load_line(start)}"
    print(text)
    if not args.no_write:
        update_section("rescore", text)


def render(config: str, summary: dict, full: float, rescored: float, same: bool, kept: int, work: Path) -> str:
    rows = ["| run | wall | scoring |", "|---|---|---|",
            f"| full re-run (`mdboost rank`, this machine's speed file, its work computed and kept) | {full:.1f} s | "
            f"{_scoring(work / 'full' / 'summary.json')} |",
            f"| `mdboost rank --costs profile.json` (the same costs as a portable profile; the kept work priced) | "
            f"{rescored:.1f} s | {_scoring(work / 'rescored' / 'summary.json')} |"]
    return "\n\n".join([
        "## rescore: `mdboost rank --costs` against a full re-run (`bench/rescore.py`)",
        f"Costs and runs: {hardware_label(summary['hardware'])}, {os.cpu_count()} cores. Run by `python bench/rescore.py "
        f"--config {config}` (the cache copied to a scratch folder without its kept work, tracking off in both runs).",
        "\n".join(rows),
        f"`ranking.csv` byte-identical: **{'yes' if same else 'no'}**. Time of `rank --costs`: **{rescored:.1f} s** "
        f"(goal: at most 60 s, process start and imports included): {'met' if rescored <= 60 and same else 'not met'}. "
        f"Kept work (`<cache.dir>/scores/`, `docs/ranking.md` \"Kept work\"): {kept / 1e6:.1f} MB."])


def _scoring(path: Path) -> str:
    return f"{json.loads(path.read_text())['seconds_scoring']:.1f} s"


if __name__ == "__main__":
    main()
