"""Benchmark of the ranking pipeline: wall time of the default run, first and cached.

Runs ``mdboost rank`` twice as subprocesses on one config (default ``configs/default.yaml``)
with a fresh cache folder, output folder and MLflow store under a temp dir: the first run
builds the logit cache (and, with ``--fresh-home``, converts the SmolLM2 GGUF and fits the
tuned-lens translators in an empty ``MDBOOST_HOME``), the second reuses it. Reports both wall
times (process start to exit), their ratio, the scoring time per pair after caching, and the
top rows of the ranking. Writes the ``ranking`` section of ``bench/RESULTS.md``.

Usage: ``.venv/bin/python bench/ranking.py [--config configs/default.yaml] [--fresh-home]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import machine_line, update_section  # noqa: E402
from pipelines.loader import load_yaml, to_dict  # noqa: E402
from pipelines.config import RankConfig  # noqa: E402
from mdboost.ranking.report import format_table, read_csv  # noqa: E402


def _run(config: Path, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mdboost.cli", "rank", "--config", str(config)], cwd=ROOT, env=env,
                   check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def _typed(row: dict) -> dict:
    out = {}
    for k, v in row.items():
        try:
            out[k] = int(v) if k in ("rank", "best_gamma", "gamma") else float(v)
        except ValueError:
            out[k] = {"True": True, "False": False}.get(v, v)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/default.yaml")
    parser.add_argument("--fresh-home", action="store_true", help="empty MDBOOST_HOME: include model conversion")
    parser.add_argument("--section", default="ranking")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="mdboost-bench-rank-"))
    cfg = to_dict(load_yaml(ROOT / args.config, RankConfig))
    cfg["cache"]["dir"] = str(tmp / "cache")
    cfg["output_dir"] = str(tmp / "out")
    cfg["progress"] = False
    cfg["tracking"].update(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}", artifact_root=str(tmp / "artifacts"))
    config = tmp / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TQDM_DISABLE="1")
    if args.fresh_home:
        env["MDBOOST_HOME"] = str(tmp / "home")

    first = _run(config, env)
    first_summary = json.loads((tmp / "out" / "summary.json").read_text())
    cached = _run(config, env)
    summary = json.loads((tmp / "out" / "summary.json").read_text())
    rows = [_typed(r) for r in read_csv(tmp / "out" / "ranking.csv")]

    md = "\n".join([
        f"`{args.config}` ({summary['n_pairs']} pairs, {summary['n_points']} operating points, "
        f"{summary['n_rows']} rows with every gamma; "
        f"fresh MDBOOST_HOME: {'yes' if args.fresh_home else 'no, models already converted'}).",
        machine_line(),
        "",
        "| measure | seconds |",
        "|---|---|",
        f"| first run (wall, process), cache built | {first:.1f} |",
        f"| &nbsp; of which cache build (pool, costs, logits) | {first_summary['seconds_cache']:.1f} |",
        f"| cached re-run (wall, process) | {cached:.1f} |",
        f"| &nbsp; of which opening the cache | {summary['seconds_cache']:.1f} |",
        f"| scoring per pair, after caching | {summary['seconds_per_pair']:.2f} |",
        f"| ratio cached / first | {cached / first:.3f} |",
        "",
        f"| scoring with the bootstrap ({summary['bootstrap']['resamples']} resamples over "
        f"{summary['bootstrap']['prompts']} prompts), cached run | {summary['seconds_scoring']:.1f} |",
        "",
        "Top of the ranking (cached run; each point at its best gamma), then its recommendation:",
        "",
        "```",
        format_table([r for r in rows if r["is_best_gamma"] is True], 12),
        "",
        summary["verdict"],
        "```",
    ])
    update_section(args.section, md)
    print(md)


if __name__ == "__main__":
    main()
