"""The default pool ranked for llama.cpp and validated in llama.cpp: do the predictions hold there?

Ranks ``configs/llamacpp.yaml`` (the default pool's logit caches; costs timed with llama.cpp doing
the forward passes of mdboost's loop on the shipped Q4_1 GGUF, one thread; drafters the early
exits as truncated GGUFs and prompt lookup) and validates it with ``configs/validate_llamacpp.yaml``
(the recommendation and 12 more cells on 10 held-out HumanEval prompts, each cell interleaved per
prompt with plain decoding through the same backend). Writes the section ``llamacpp_validation``
of ``bench/RESULTS.md``: every cell's predicted and realized speedup over plain llama.cpp, and the
goal of the engines issue: at least 12 cells, coverage of the 90% intervals 80-97%, MAE of the
speedup <= 0.05, the recommendation (or "plain decoding") confirmed.

Run: ``python bench/llamacpp_validation.py [--ranking DIR] [--summary S] [--no-write]``
(needs ``pip install 'mdboost[llamacpp]'``; tracking off, outputs under ``outputs/llamacpp-validation``).
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
from mdboost.cache.profile import hardware_label  # noqa: E402
from mdboost.validation.calibration import ONE_PASS, TimingNoise  # noqa: E402

OUT = ROOT / "outputs" / "llamacpp-validation"


def _configs(ranking: Path) -> tuple[Path, Path]:
    rank = yaml.safe_load((ROOT / "configs" / "llamacpp.yaml").read_text())
    rank.update(output_dir=str(ranking))
    rank["tracking"]["enabled"] = False
    validate = yaml.safe_load((ROOT / "configs" / "validate_llamacpp.yaml").read_text())
    validate.update(output_dir=str(OUT / "validate"))
    validate["ranking"]["ranking_dir"] = str(ranking)
    validate["humaneval"]["tasks"] = 0
    validate["tracking"]["enabled"] = False
    return write_configs(OUT, {"rank": rank, "validate": validate})


def _point(c: dict) -> str:
    rule = c.get("rule") or "mentored"
    budget = float(c["max_divergence"])
    how = f"{rule}:{c.get('drafting') or 'sampled'}" + (f":p{float(c['draft_p_min']):g}" if float(c.get("draft_p_min") or 0) else "")
    return f"{c['drafter']} {how} {c['divergence']} {budget:g}, gamma {int(float(c['gamma']))}, T {float(c['temperature']):g}"


def _ratio(c: dict) -> str:
    """The cell's tokens/s over AR's as measured, each at its own lengths (older summaries: n/a)."""
    ratio = c.get("tokens_per_second_ratio")
    return "n/a" if ratio is None else f"{float(ratio):.2f}"


def render(ranked: dict, summary: dict) -> str:
    m = summary["metrics"]
    speed, acc = m["speedup"], m.get("acceptance")
    cells = summary["cells"]
    goal = (len(cells) >= 12 and speed["coverage"] is not None and 0.80 <= speed["coverage"] <= 0.97
            and speed["mae"] <= 0.05 and "predictions hold" in summary["verdict"])
    ar = sorted(float(c["ar_tokens_per_second"]) for c in cells)
    rows = ["| cell | predicted speedup [90% predictive] | realized | inside | tokens/s ratio (own lengths) | new tokens | "
            "acceptance predicted / realized |",
            "|---|---|---|---|---|---|---|"]
    for c in cells:
        pa, ra = c.get("predicted_acceptance"), c.get("realized_acceptance")
        accept = "n/a" if pa in (None, "") or ra in (None, "") else f"{float(pa):.2f} / {float(ra):.2f}"
        rows.append(f"| {_point(c)}{' (recommendation)' if c['role'] == 'recommendation' else ''} | "
                    f"{float(c['predicted_speedup']):.2f} [{float(c['predicted_speedup_lo']):.2f}, "
                    f"{float(c['predicted_speedup_hi']):.2f}] | {float(c['realized_speedup']):.2f} | "
                    f"{'yes' if c['speedup_inside'] else 'no'} | {_ratio(c)} | {int(float(c['num_new_tokens']))} | "
                    f"{accept} |")
    timing = summary.get("intervals", {}).get("timing")
    noise = ONE_PASS if not timing else f"{TimingNoise(**timing).describe()} (docs/validation.md, \"Predictive intervals\")"
    errors = [float(c["realized_speedup"]) - float(c["predicted_speedup"]) for c in cells]
    below = sum(not c["speedup_inside"] and e < 0 for c, e in zip(cells, errors))
    above = sum(not c["speedup_inside"] and e > 0 for c, e in zip(cells, errors))
    lines = [
        "## llamacpp_validation: the default pool ranked for llama.cpp and validated in llama.cpp "
        "(`bench/llamacpp_validation.py`)",
        f"Machine: {hardware_label(ranked.get('hardware'))}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}. Ranking: `configs/llamacpp.yaml` (the default pool's caches; costs timed in "
        "mdboost's loop with llama.cpp doing the forward passes on the shipped Q4_1 GGUF; drafters the early exits as "
        "truncated GGUFs and prompt lookup). Validation: `configs/validate_llamacpp.yaml`, "
        f"{summary['generation']['prompts']} held-out HumanEval prompts, {len(cells)} cells, "
        f"{summary['generation']['max_new_tokens']} new tokens, every cell interleaved per prompt with plain decoding "
        f"through the same backend, realized speedup over plain decoding at the cell's own lengths (docs/validation.md, "
        f"\"Equal work\"), {summary['generation'].get('passes', 1)} pass(es) (median {ar[len(ar) // 2]:.1f} tokens/s over the cells' runs).",
        f"Ranking's verdict: {ranked['verdict']}",
        f"**{summary['verdict']}**",
        f"- speedup: intervals cover {coverage_text(speed)}, MAE {speed['mae']:.3f}, Spearman {speed['spearman']:.2f}, "
        f"regret {100 * speed['regret']:.1f}%",
        f"- acceptance: intervals cover {coverage_text(acc)}" + (f", MAE {acc['mae']:.3f}" if acc else ""),
        f"- misses: {below} below the interval, {above} above; mean signed error (realized - predicted) "
        f"{sum(errors) / len(errors):+.3f}",
        f"- timing noise: {noise}",
        "\n".join(rows),
        f"Goal (engines issue: >= 12 cells, speedup coverage 80-97%, MAE <= 0.05, the recommendation confirmed): "
        f"{'met' if goal else 'not met'} on this run (with {speed['with_interval']} cells one cell moves the "
        f"coverage by {100 / max(speed['with_interval'], 1):.0f} points).",
    ]
    return "\n\n".join(lines[:4] + ["\n".join(lines[4:8])] + lines[8:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranking", type=Path, help="a finished llama.cpp ranking folder (default: rank first)")
    parser.add_argument("--summary", type=Path, help="a finished validation's summary.json (default: validate)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    ranking = args.ranking or OUT / "rank"
    load = ""
    if args.summary is None:
        start = os.getloadavg()[0]
        rank_cfg, validate_cfg = _configs(ranking)
        steps = ([] if args.ranking else [("rank", rank_cfg)]) + [("validate", validate_cfg)]
        for command, cfg in steps:
            subprocess.run([sys.executable, "-m", "mdboost", command, "--config", str(cfg)], cwd=ROOT, check=True)
        load = load_line(start)
    path = args.summary or OUT / "validate" / "summary.json"
    ranked = json.loads((ranking / "summary.json").read_text())
    text = render(ranked, json.loads(Path(path).read_text())) + (f"\n\n{load}" if load else "")
    print(text)
    if not args.no_write:
        update_section("llamacpp_validation", text)


if __name__ == "__main__":
    main()
