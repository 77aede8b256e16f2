"""Batch size as an axis, run for real: the default ranking's cells validated at every ranked batch size.

Runs ``mdboost validate`` on the default ranking (``configs/full.yaml``, which ranks
``speed.batch_sizes: [1, 4]``) unless ``--summary`` names a finished validation: at each batch size
the recommendation's cell and ``--cells`` more, on held-out prompts batched ``B`` at a time, each
batch interleaved with batched plain decoding. Writes the section ``batch_validation`` of
``bench/RESULTS.md``: per batch size the speedup coverage of the 90% intervals, the cells
(predicted with interval, realized), and the predicted and realized crossover (the batch size from
which plain decoding wins, over each batch size's best cell); the goal of the hardware-and-load
issue: at least 12 cells in all, coverage 80-97% at each batch size, crossover within one listed
batch size.

Run: ``python bench/batch_validation.py [--cells 6] [--prompts 8] [--summary S] [--no-write]``.
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


def _num(x, fmt: str = ".3f") -> str:
    return "nan" if x is None or not math.isfinite(float(x)) else format(float(x), fmt)


def _point(cell: dict) -> str:
    budget = float(cell["max_divergence"])
    floor = row_draft_p_min(cell)
    rule = "" if (cell["rule"], cell["drafting"]) == ("mentored", "sampled") else f" {cell['rule']}:{cell['drafting']}"
    return ("lossless" if budget == 0 else f"{cell['divergence']} <= {budget:g}") + rule + (f":p{floor:g}" if floor else "")


def cost_table(speed: dict) -> str:
    """The ranking's costs at each batch size (its speed file): ``T_ar(B)``, ``v(K, B)``, ``c(B)``."""
    blocks = [("1", speed)] + sorted((speed.get("batches") or {}).items(), key=lambda kv: int(kv[0]))
    names = sorted(speed["drafters"])
    # an entry kept from before its kind's kernel changed (``int8`` beside ``int8#<revision>``): the revised one
    names = [n for n in names if "#" in n or not any(m.startswith(f"{n}#") for m in names)]
    head = ["| B | T_ar (ms) | v(1..8) | " + " | ".join(n.split("#")[0] for n in names) + " | load (1 min) |",
            "|" + "---|" * (4 + len(names))]
    for b, block in blocks:
        prof = block["profile"]
        head.append(f"| {b} | {1000 * prof['step_seconds']:.1f} | {', '.join(f'{v:.2f}' for v in prof['verify_cost'][1:])} | "
                    + " | ".join(f"{block['drafters'][n]['median']:.3f}" for n in names)
                    + f" | {prof['load_before']:.2f}-{prof['load_after']:.2f} |")
    return "\n".join(head)


def render(summary: dict, speed: dict | None = None) -> str:
    """The section's markdown for a validation ``summary.json`` (and the ranking's speed file)."""
    cells = summary["cells"]
    by_batch = summary["metrics"].get("by_batch_size") or {}
    rows = ["| B | # | drafter | T | point | gamma | predicted speedup [90%] | realized | inside |", "|" + "---|" * 9]
    for c in sorted(cells, key=lambda c: (int(c["batch_size"]), c["cell"])):
        rows.append(f"| {c['batch_size']} | {c['cell']} | {c['drafter']} | {float(c['temperature']):g} | {_point(c)} | "
                    f"{c['gamma']} | {_num(c['predicted_speedup'])} [{_num(c['predicted_speedup_lo'])}, "
                    f"{_num(c['predicted_speedup_hi'])}] | {_num(c['realized_speedup'])} | {c['speedup_inside']} |")
    lines, ok = [], len(cells) >= 12
    for b, m in sorted(by_batch.items(), key=lambda kv: int(kv[0])):
        s = m["speedup"]
        cov = s["coverage"]
        ok = ok and cov is not None and 0.80 <= cov <= 0.97
        lines.append(f"- B={b}: {m['cells']} cells, intervals cover {s['covered']} of {s['with_interval']} "
                     f"({_num(100 * cov if cov is not None else None, '.0f')}%), MAE {_num(s['mae'])}, Spearman "
                     f"{_num(s['spearman'], '.2f')}; best cell predicted {_num(m['best_predicted_speedup'])}x, best "
                     f"realized {_num(m['best_realized_speedup'])}x")
    cross = summary["metrics"].get("crossover") or {}
    ok = ok and bool(cross.get("within_one"))
    per_size = min((m["cells"] for m in by_batch.values()), default=len(cells))
    gen = summary["generation"]
    head = (f"Machine: {hardware_label(hardware_fingerprint('cpu'))}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}. Ranking: `configs/full.yaml` (`speed.batch_sizes: [1, 4]`, every cost "
            f"measured at both batch sizes); validation on held-out prompts {gen['first_prompt']}-"
            f"{gen['first_prompt'] + gen['prompts'] - 1}, {gen['max_new_tokens']} new tokens, batched B at a time, "
            f"each batch interleaved with batched plain decoding.")
    tail = (f"Crossover (the batch size from which plain decoding wins, each batch size's best cell): predicted "
            f"{cross.get('predicted')}, realized {cross.get('realized')} (None: speculation still wins at the largest "
            f"size listed). Goal (hardware-and-load issue): at least 12 cells, coverage 80-97% at each batch size, "
            f"crossover within one listed batch size: {'met' if ok else 'not met'} on this run (with {per_size} cells "
            f"per batch size one cell moves the coverage by {100 / max(per_size, 1):.0f} points).")
    costs = [] if speed is None else ["Costs at each batch size (`T_ar(B)` the undrafted B-row step; `v` and `c` in "
                                      "`T_ar(B)`, `c` per draft position of the batch):", cost_table(speed)]
    return "\n\n".join(["## batch_validation: predictions at batch sizes 1 and 4, run for real (`mdboost validate`)",
                        head, *costs, f"**{summary['verdict']}**", "\n".join(lines), "\n".join(rows), tail])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", type=Path, help="a finished validation's summary.json (default: run one)")
    parser.add_argument("--cells", type=int, default=6, help="cells after the recommendation, per batch size")
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    path, load = args.summary, ""
    if path is None:
        start = os.getloadavg()[0]
        out = ROOT / "outputs" / "validate-batch"
        subprocess.run([sys.executable, "-m", "mdboost", "validate", "--config", "configs/validate_default.yaml",
                        "--set", "ranking.ranking_dir=outputs/rank-full", "--set", f"ranking.cells={args.cells}", "--set", f"generation.prompts={args.prompts}",
                        "--set", f"output_dir={out}", "--set", "humaneval.tasks=0", "--set", "tracking.enabled=false"],
                       cwd=ROOT, check=True)
        path = out / "summary.json"
        load = load_line(start)
    ranked = json.loads((ROOT / "outputs" / "rank-full" / "summary.json").read_text())
    speed = json.loads(Path(ranked["speed_file"]).read_text()) if ranked.get("speed_file") else None
    text = render(json.loads(Path(path).read_text()), speed) + (f"\n\n{load}" if load else "")
    print(text)
    if not args.no_write:
        update_section("batch_validation", text)


if __name__ == "__main__":
    main()
