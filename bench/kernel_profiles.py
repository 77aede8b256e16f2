"""Two machines' cost profiles, two picks: this CPU as it is, and with its matrix kernels capped at AVX2.

On the default pool (its caches finished: ``mdboost rank --config configs/full.yaml`` first), at
batch size 1 with four of its drafters (:data:`DRAFTERS`):

1. ``mdboost profile --out native.json``: this machine's costs (already in the speed file);
2. the same under ``ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2``:
   torch's CPU kernels (ATen's dispatch, MKL's GEMMs, oneDNN) limited to AVX2 on this AVX-512
   host, a stand-in for an AVX2-only machine measured for real (the capped costs key their own
   speed file and the profile's fingerprint names the cap);
3. ``mdboost rank --costs`` with each, on the same caches (batch size 1, no frontier, no tracking).

Writes the section ``kernel_profiles`` of ``bench/RESULTS.md``: per profile its hardware line, the
target's step time, each drafter's ``c``, and the recommendation; the goal of the hardware issue
(two profiles give different picks where their costs say so, each named in the output) is met when
the two picks differ and each verdict names its profile's hardware.

Run: ``python bench/kernel_profiles.py [--work outputs/kernel-profiles] [--no-write]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import load_line, update_section  # noqa: E402
from mdboost.cache.profile import hardware_label  # noqa: E402

CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# batch size 1 and four of the pool's drafters (a model at two depths, int8, prompt lookup): the capped
# profile measures every figure afresh, about a minute a drafter on a 2-core CPU
DRAFTERS = "[early_exit:12, tuned:12, int8, ngram:3]"
COMMON = ["--config", "configs/full.yaml", "--set", "speed.batch_sizes=[1]", "--set", f"pool.drafters={DRAFTERS}"]


def _cli(argv: list[str], env: dict | None = None) -> None:
    subprocess.run([sys.executable, "-m", "mdboost.cli", *argv], cwd=ROOT, check=True,
                   env={**os.environ, "TQDM_DISABLE": "1", **(env or {})})


def _costs(profile: dict) -> str:
    drafters = profile["drafters"]
    return ", ".join(f"{name.split('#')[0]} {entry['median']:.3f}" for name, entry in sorted(drafters.items()))


def render(results: dict) -> str:
    rows = ["| profile | hardware | T_ar (ms) | c per drafter | recommendation | what the pick depends on |",
            "|---|---|---|---|---|---|"]
    picks = {}
    for name, (profile, summary) in results.items():
        rec = summary["recommendation"]
        picks[name] = (rec["drafter"], rec["beats_plain_decoding"], rec["gamma"], rec["max_divergence"])
        rows.append(f"| {name} | {hardware_label(summary['hardware'])} (cost profile {summary['cost_profile']}) | "
                    f"{1000 * profile['profile']['step_seconds']:.1f} | {_costs(profile)} | {summary['verdict'].split(';')[0]} | "
                    f"{summary.get('hardware_dependence', '')} |")
    named = all("costs measured on" in s["verdict"] for _, s in results.values())
    differ = len(set(picks.values())) > 1
    tail = (f"Goal (two profiles of different machines give different picks where their costs say so, each named in "
            f"the output): {'met' if differ and named else 'not met'} (picks "
            f"{'differ' if differ else 'are the same'}; each verdict names its profile's hardware: {named}). "
            f"The capped profile is this CPU with torch's kernels limited to AVX2 "
            f"({', '.join(f'{k}={v}' for k, v in CAPS.items())}), not a second machine; FBGEMM's int8 kernels pick "
            f"their own instruction set from the CPU, so the int8 drafter's kernels are not capped.")
    return "\n\n".join(["## kernel_profiles: one pool, two machines' costs (`mdboost profile`, `mdboost rank --costs`)",
                        "\n".join(rows), tail])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "kernel-profiles")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    start = os.getloadavg()[0]
    results = {}
    for name, env in (("native", {}), ("avx2-capped", CAPS)):
        profile = args.work / f"{name}.json"
        _cli(["profile", *COMMON, "--out", str(profile)], env)
        out = args.work / f"rank-{name}"
        _cli(["rank", *COMMON, "--costs", str(profile), "--set", f"output_dir={out}", "--set", "tracking.enabled=false",
              "--set", "ranking.frontier_rows=0"])
        results[name] = (json.loads(profile.read_text()), json.loads((out / "summary.json").read_text()))
    text = render(results) + f"\n\n{load_line(start)}"
    print(text)
    if not args.no_write:
        update_section("kernel_profiles", text)


if __name__ == "__main__":
    main()
