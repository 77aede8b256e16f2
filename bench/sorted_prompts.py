"""A ranking on a category-sorted prompt file, validated on its held-out prompts: does the sample represent them?

MT-bench's questions come sorted by category; a ranking on the head of such a file ranks for its
first categories only, and its predictions miss on the others. This script builds a sorted file
from the bundled HumanEval prompts by a field, ``category`` (the prompt's length tercile: ``short``,
``medium``, ``long``, written in that order), ranks the default pool on it
(``data.limit: 16``, ``data.sample: random``, ``data.stratify: category``; batch size 1), and
validates 13 cells on 10 held-out prompts taken the same way. Writes the section
``sorted_prompts`` of ``bench/RESULTS.md``: the categories of the ranked and held-out samples, and
the goal of the trustworthy-data issue: regret at most 5%, speedup and acceptance coverage of
the 90% intervals 80-97%.

Run: ``python bench/sorted_prompts.py [--cells 12] [--prompts 10] [--summary S] [--no-write]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import coverage_text, load_line, update_section, write_configs  # noqa: E402
from mdboost._io import atomic_write_text  # noqa: E402
from mdboost.cache.profile import hardware_fingerprint, hardware_label  # noqa: E402
from mdboost.data import load_texts  # noqa: E402

OUT = ROOT / "outputs" / "sorted-prompts"
CATEGORIES = ("short", "medium", "long")


def sorted_file(path: Path) -> Path:
    """HumanEval with a ``category`` field (prompt length tercile), sorted by it (ties: file order)."""
    records = load_texts("humaneval")
    lengths = sorted(len(r["prompt"]) for r in records)
    cuts = [lengths[len(lengths) // 3], lengths[2 * len(lengths) // 3]]

    def category(r: dict) -> str:
        return CATEGORIES[sum(len(r["prompt"]) >= c for c in cuts)]

    rows = [{"task_id": r["id"], "prompt": r["prompt"], "canonical_solution": r["reference"], "category": category(r)}
            for r in records]
    rows.sort(key=lambda r: CATEGORIES.index(r["category"]))  # stable: file order within a category
    return atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def _configs(data: Path, cells: int, prompts: int) -> tuple[Path, Path]:
    rank = yaml.safe_load((ROOT / "configs" / "full.yaml").read_text())
    rank.update(name="sorted-prompts", output_dir=str(OUT / "rank"))
    rank["data"].update(source=str(data), limit=16, sample="random", stratify="category")
    rank.setdefault("speed", {})["batch_sizes"] = [1]
    rank["tracking"]["enabled"] = False
    validate = yaml.safe_load((ROOT / "configs" / "validate_default.yaml").read_text())
    validate.update(name="sorted-prompts", output_dir=str(OUT / "validate"))
    validate["ranking"].update(ranking_dir=str(OUT / "rank"), cells=cells)
    validate["generation"]["prompts"] = prompts
    validate["humaneval"]["tasks"] = 0
    validate["tracking"]["enabled"] = False
    return write_configs(OUT, {"rank": rank, "validate": validate})


def render(ranked: dict, summary: dict) -> str:
    m = summary["metrics"]
    speed, acc = m["speedup"], m.get("acceptance")
    in_band = lambda f: f is not None and f["coverage"] is not None and 0.80 <= f["coverage"] <= 0.97  # noqa: E731
    goal = speed["regret"] <= 0.05 and in_band(speed) and in_band(acc)

    def strata(data: dict) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(data.get("strata", {}).items(),
                                                        key=lambda kv: CATEGORIES.index(kv[0])))

    lines = [
        "## sorted_prompts: a ranking on a category-sorted file, validated on its held-out prompts "
        "(`bench/sorted_prompts.py`)",
        f"Machine: {hardware_label(hardware_fingerprint('cpu'))}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}. Data: HumanEval's 164 prompts with a `category` (prompt length tercile), "
        "the file sorted by it (short, medium, long). Ranking: `configs/full.yaml` with `data.limit: 16`, "
        "`data.sample: random`, `data.stratify: category`, batch size 1; validation: "
        f"{summary['generation']['prompts']} held-out prompts taken the same way, {len(summary['cells'])} cells, "
        f"{summary['generation']['max_new_tokens']} new tokens.",
        f"- ranked on: {strata(ranked['data'])} (the head of the file's cache split would be 16 `short`)",
        f"- validated on: {strata(summary['data'])}",
        f"**{summary['verdict']}**",
        f"- speedup: intervals cover {coverage_text(speed)}, MAE {speed['mae']:.3f}, Spearman {speed['spearman']:.2f}, "
        f"regret {100 * speed['regret']:.1f}%",
        f"- acceptance: intervals cover {coverage_text(acc)}" + (f", MAE {acc['mae']:.3f}" if acc else ""),
        f"Goal (trustworthy-data issue: regret <= 5%, speedup and acceptance coverage 80-97%): "
        f"{'met' if goal else 'not met'} on this run (with {speed['with_interval']} cells one cell moves a "
        f"coverage by {100 / max(speed['with_interval'], 1):.0f} points).",
    ]
    return "\n\n".join(lines[:2] + ["\n".join(lines[2:4])] + lines[4:5] + ["\n".join(lines[5:7])] + lines[7:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=12, help="cells after the recommendation")
    parser.add_argument("--prompts", type=int, default=10, help="held-out prompts")
    parser.add_argument("--summary", type=Path, help="a finished validation's summary.json (default: run both)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    load = ""
    if args.summary is None:
        start = os.getloadavg()[0]
        rank_cfg, validate_cfg = _configs(sorted_file(OUT / "humaneval_by_length.jsonl"), args.cells, args.prompts)
        for command, cfg in (("rank", rank_cfg), ("validate", validate_cfg)):
            subprocess.run([sys.executable, "-m", "mdboost", command, "--config", str(cfg)], cwd=ROOT, check=True)
        load = load_line(start)
    path = args.summary or OUT / "validate" / "summary.json"
    ranked = json.loads((OUT / "rank" / "summary.json").read_text())
    text = render(ranked, json.loads(Path(path).read_text())) + (f"\n\n{load}" if load else "")
    print(text)
    if not args.no_write:
        update_section("sorted_prompts", text)


if __name__ == "__main__":
    main()
