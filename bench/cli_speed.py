"""How fast the CLI answers: ``mdboost --help``, a config error, ``mdboost export``.

Each command runs as a user runs it (a fresh interpreter: ``python -m mdboost``), the three
interleaved, ``--repeats`` times; the medians and the worst go to the section ``cli_speed`` of
``bench/RESULTS.md`` with the machine and the load. The product-surface issue asks for 2 s each.
``mdboost export`` needs a finished ranking folder (``--ranking``, default ``outputs/rank``).

Run: ``python bench/cli_speed.py [--repeats 5] [--ranking DIR] [--no-write]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import load_line, update_section  # noqa: E402
from mdboost.cache.profile import hardware_fingerprint, hardware_label  # noqa: E402

GOAL = 2.0


def _time(argv: list[str], expect: int) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mdboost", *argv], cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != expect:
        raise SystemExit(f"mdboost {' '.join(argv)}: exit {done.returncode}, expected {expect}: {done.stderr[-500:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each command, interleaved")
    parser.add_argument("--ranking", default="outputs/rank", help="a finished ranking folder for `mdboost export`")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bad = Path(tmp) / "bad.yaml"
        bad.write_text("md:\n  budgets: [-1]\n")
        commands = {"mdboost --help": (["--help"], 0),
                    "a config error (mdboost rank, bad md.budgets)": (["rank", "--config", str(bad)], 2),
                    "mdboost export --format vllm": (["export", "--ranking", args.ranking, "--format", "vllm"], 0)}
        start = os.getloadavg()[0]
        times = {name: [] for name in commands}
        for _ in range(args.repeats):
            for name, (argv, expect) in commands.items():
                times[name].append(_time(argv, expect))
        load = load_line(start)
    rows = ["| command | median s | worst s | within 2 s |", "|---|---|---|---|"]
    for name, values in times.items():
        med = statistics.median(values)
        rows.append(f"| {name} | {med:.2f} | {max(values):.2f} | {'yes' if med <= GOAL else 'no'} |")
    text = "\n\n".join([
        "## cli_speed: how fast the CLI answers (`bench/cli_speed.py`)",
        f"Machine: {hardware_label(hardware_fingerprint('cpu'))}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; each command a fresh `python -m mdboost`, the three interleaved, "
        f"{args.repeats} runs each.",
        "\n".join(rows), load])
    print(text)
    if not args.no_write:
        update_section("cli_speed", text)


if __name__ == "__main__":
    main()
