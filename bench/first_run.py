"""A new user's first run: ``mdboost rank`` (and ``mdboost validate``) on the default config in a
fresh clone with an empty ``MDBOOST_HOME`` (conversion, caches, costs, all from nothing).

Clones this checkout's ``HEAD`` into a temporary folder, runs each command there with this
interpreter, and reads its output as it comes: the wall time, the longest silence (no byte on
stdout or stderr; a progress bar's redraw counts), and the run's own ``seconds_by_stage`` from
its ``summary.json``. Writes the section ``first_run`` of ``bench/RESULTS.md``: the goal of the
product-surface issue is 20 minutes for each command, no silence over 30 s.

Run: ``python bench/first_run.py [--validate] [--no-write]`` (tens of minutes; keep the machine quiet).
``--keep DIR`` works in ``DIR`` (the clone and ``MDBOOST_HOME`` under it) and leaves it there;
``--validate-only`` then times ``mdboost validate`` on the ranking a ``--keep`` run left (the clone
brought to this checkout's ``HEAD`` first), as a validation run straight after it would.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import load_line, update_section  # noqa: E402
from mdboost.cache.profile import hardware_fingerprint, hardware_label  # noqa: E402


def timed_run(argv: list[str], cwd: Path, env: dict, log: Path | None = None) -> tuple[float, float, int, str]:
    """Run ``argv``; returns (wall seconds, longest silence in seconds, exit code, the last output line
    before that silence). ``log``: a file to write the output to as it comes."""
    start = last = time.monotonic()
    longest, before, tail = 0.0, "", b""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sel = selectors.DefaultSelector()
    for stream in (proc.stdout, proc.stderr):
        sel.register(stream, selectors.EVENT_READ)
    open_streams = 2
    sink = open(log, "wb") if log is not None else None
    try:
        while open_streams:
            for key, _ in sel.select(timeout=1.0):
                chunk = os.read(key.fileobj.fileno(), 65536)
                now = time.monotonic()
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                if now - last > longest:
                    longest, before = now - last, _last_line(tail)
                last, tail = now, (tail + chunk)[-4096:]
                if sink is not None:
                    sink.write(chunk)
                    sink.flush()
    finally:
        if sink is not None:
            sink.close()
    code = proc.wait()
    end = time.monotonic()
    if end - last > longest:
        longest, before = end - last, _last_line(tail)
    return end - start, longest, code, before


def _last_line(tail: bytes) -> str:
    """The last non-empty line (a progress bar's last redraw) of some output."""
    parts = [p for p in tail.replace(b"\r", b"\n").decode("utf-8", "replace").split("\n") if p.strip()]
    return parts[-1].strip()[:120] if parts else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validate", action="store_true", help="also time `mdboost validate` on the default config")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it (default: a temporary one)")
    parser.add_argument("--validate-only", action="store_true", help="time only `mdboost validate`, on a --keep folder's ranking")
    args = parser.parse_args()
    if args.validate_only and args.keep is None:
        parser.error("--validate-only needs --keep DIR (the folder of an earlier --keep run)")
    commands = [] if args.validate_only else [("rank", "configs/default.yaml", "outputs/rank")]
    if args.validate or args.validate_only:
        commands.append(("validate", "configs/validate_default.yaml", "outputs/validate"))
    rows = ["| command | wall time | longest silence | time by stage (s) |", "|---|---|---|---|"]
    start_load = os.getloadavg()[0]
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    with (tempfile.TemporaryDirectory() if args.keep is None else contextlib.nullcontext(args.keep)) as tmp:
        clone, home = Path(tmp) / "clone", Path(tmp) / "home"
        if args.validate_only:
            subprocess.run(["git", "-C", str(clone), "fetch", "-q", str(ROOT), "HEAD"], check=True)
            subprocess.run(["git", "-C", str(clone), "checkout", "-q", "FETCH_HEAD"], check=True)
        else:
            subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        env = {**os.environ, "MDBOOST_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "PYTHONPATH": str(clone)}
        for command, config, out in commands:
            wall, silence, code, before = timed_run([sys.executable, "-m", "mdboost", command, "--config", config], clone,
                                                    env, Path(tmp) / f"{command}.log")
            if code != 0:
                raise SystemExit(f"mdboost {command} exited {code}")
            stages = json.loads((clone / out / "summary.json").read_text()).get("seconds_by_stage") or {}
            shown = ", ".join(f"{k} {v:.0f}" for k, v in sorted(stages.items(), key=lambda kv: -kv[1]))
            rows.append(f"| `mdboost {command} --config {config}` | {wall / 60:.1f} min | {silence:.0f} s (after "
                        f"`{before.replace('|', '/').replace('`', '')}`) | {shown} |")
        kept = Path(tmp) / "rows.md"  # a --keep folder's rows: --validate-only adds its own to the rank's
        if args.validate_only and kept.is_file():
            rows[2:2] = [r for r in kept.read_text().splitlines() if "mdboost rank" in r]
        kept.write_text("\n".join(rows))
    text = "\n\n".join([
        "## first_run: a new user's first run, from a fresh clone and an empty MDBOOST_HOME (`bench/first_run.py`)",
        f"Machine: {hardware_label(hardware_fingerprint('cpu'))}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}. Goal (product-surface issue): 20 minutes each, no silence over 30 s.",
        "\n".join(rows), load_line(start_load)])
    print(text)
    if not args.no_write:
        update_section("first_run", text)


if __name__ == "__main__":
    main()
