"""Every verification rule run for real: the default ranking's cells validated by ``mdboost validate``.

Runs ``mdboost validate --config configs/validate_default.yaml`` (held-out prompts, each cell
interleaved with plain decoding per prompt; the engine runs each cell's rule, draft floor
included, ``GenerationSettings.rule``) unless ``--summary`` names a finished validation, then writes
the section ``validation_rules`` of ``bench/RESULTS.md``: the verdict, one row per cell (predicted
speedup and acceptance with their 90% intervals, realized, inside or not), the rules the cells
span, and the goal of the engines issue (at least 12 cells over at least 4 rules, speedup coverage
80-97%, each rule's realized acceptance inside its interval).

Run: ``python bench/validation_rules.py [--summary outputs/validate/summary.json] [--no-write]``
(needs the default ranking, ``mdboost rank --config configs/full.yaml``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import load_line, update_section  # noqa: E402
from mdboost.cache.profile import hardware_fingerprint, hardware_label  # noqa: E402
from mdboost.ranking.report import row_draft_p_min  # noqa: E402


def _point(cell: dict) -> str:
    budget = float(cell["max_divergence"])
    return "lossless" if budget == 0 else f"{cell['divergence']} <= {budget:g}"


def _rule(cell: dict) -> str:
    floor = row_draft_p_min(cell)
    return f"{cell['rule']}:{cell['drafting']}" + (f":p{floor:g}" if floor else "")


def _num(x, fmt: str = ".3f") -> str:
    return "nan" if x is None or not math.isfinite(float(x)) else format(float(x), fmt)


def render(summary: dict) -> str:
    """The section's markdown for a validation ``summary.json``."""
    cells = summary["cells"]
    rows = ["| # | drafter | T | point | rule | gamma | predicted speedup [90%] | realized | "
            "acceptance predicted [90%] | realized | inside (speedup, acceptance) |", "|" + "---|" * 11]
    for c in cells:
        rows.append(f"| {c['cell']} | {c['drafter']} | {float(c['temperature']):g} | {_point(c)} | {_rule(c)} | "
                    f"{c['gamma']} | {_num(c['predicted_speedup'])} [{_num(c['predicted_speedup_lo'])}, "
                    f"{_num(c['predicted_speedup_hi'])}] | {_num(c['realized_speedup'])} | "
                    f"{_num(c['predicted_acceptance'])} [{_num(c['predicted_acceptance_lo'])}, "
                    f"{_num(c['predicted_acceptance_hi'])}] | {_num(c['realized_acceptance'])} | "
                    f"{c['speedup_inside']}, {c['acceptance_inside']} |")
    speed, acc = summary["metrics"]["speedup"], summary["metrics"]["acceptance"]
    rules = sorted({_rule(c) for c in cells})
    families = sorted({c["rule"] for c in cells})
    by_rule = {}
    for c in cells:
        by_rule.setdefault(c["rule"], []).append(bool(c["acceptance_inside"]))
    coverage = speed["coverage"]
    met = (len(cells) >= 12 and len(families) >= 4 and coverage is not None and 0.80 <= coverage <= 0.97
           and all(all(v) for v in by_rule.values()))
    gen = summary["generation"]
    head = (f"Machine: {hardware_label(hardware_fingerprint('cpu'))}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}. Ranking: `configs/full.yaml` with the default `md.rules`; "
            f"`configs/validate_default.yaml`: held-out prompts {gen['first_prompt']}-"
            f"{gen['first_prompt'] + gen['prompts'] - 1}, {gen['max_new_tokens']} new tokens, {len(cells)} cells, "
            f"each interleaved with plain decoding per prompt; the engine ran each cell's rule.")
    tail = (f"Speedup intervals cover {speed['covered']} of {speed['with_interval']} cells; acceptance intervals "
            f"{acc['covered']} of {acc['with_interval']}. The cells span {len(families)} rules "
            f"({len(rules)} with their drafting and draft floor: {', '.join(rules)}). Goal (engines issue): at least 12 cells over at least 4 rules, coverage "
            f"80-97%, each rule's realized acceptance inside its interval: {'met' if met else 'not met'} on this run "
            f"(one run: with {len(cells)} cells the coverage's binomial spread is about "
            f"+-{100 * math.sqrt(0.9 * 0.1 / len(cells)):.0f} points).")
    return "\n\n".join(["## validation_rules: every verification rule run for real (`mdboost validate`)", head,
                        f"**{summary['verdict']}**", "\n".join(rows), tail])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", type=Path, help="a finished validation's summary.json (default: run one)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    path, load = args.summary, ""
    if path is None:
        start = os.getloadavg()[0]
        subprocess.run([sys.executable, "-m", "mdboost", "validate", "--config", "configs/validate_default.yaml",
                        "--set", "ranking.ranking_dir=outputs/rank-full"],
                       cwd=ROOT, check=True)
        path = ROOT / "outputs" / "validate" / "summary.json"
        load = load_line(start)
    text = render(json.loads(Path(path).read_text())) + (f"\n\n{load}" if load else "")
    print(text)
    if not args.no_write:
        update_section("validation_rules", text)


if __name__ == "__main__":
    main()
