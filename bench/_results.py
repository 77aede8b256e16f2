"""Write one benchmark's section of ``bench/RESULTS.md`` atomically.

Each benchmark script owns the block between ``<!-- BEGIN name -->`` and ``<!-- END name -->``
and replaces only that block, so scripts can run in any order without clobbering each other.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

import torch

from mdboost._io import atomic_write_text

RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = "# Benchmark results\n\nEach section is written by the script it names; ratios are measured side by side in one process.\n"


def machine_line() -> str:
    """One line describing where the numbers were measured."""
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    return (
        f"_Measured on {device}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}, {platform.python_version()}._"
    )


def load_line(start: float) -> str:
    """The host's 1-minute load average when a measurement started (``start``, from
    ``os.getloadavg()[0]``) and now: other processes sharing the cores slow the many small ops of
    a call more than a few large ones, so ratios measured on a busy host differ."""
    return f"_Host load (1-minute average): {start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end._"


def coverage_text(metric: dict | None) -> str:
    """A validation metric's interval coverage in words (``summary.json``'s ``metrics`` entries).

    >>> coverage_text({"covered": 12, "with_interval": 13, "coverage": 12 / 13})
    '12 of 13 (92%)'
    """
    if not metric or metric["coverage"] is None:
        return "n/a"
    return f"{metric['covered']} of {metric['with_interval']} ({100 * metric['coverage']:.0f}%)"


def write_configs(folder: Path, configs: dict) -> tuple[Path, ...]:
    """Each ``name -> config mapping`` of ``configs`` as ``folder/<name>.yaml`` (atomic), in order."""
    import yaml  # deferred: only the scripts that write configs need it

    paths = tuple(folder / f"{name}.yaml" for name in configs)
    for path, cfg in zip(paths, configs.values()):
        atomic_write_text(path, yaml.safe_dump(cfg, sort_keys=False))
    return paths


def update_section(name: str, markdown: str, path: Path = RESULTS) -> None:
    """Replace (or append) the block of ``name`` in the results file, atomically."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"name must be letters, digits, '_', '.', '-', got {name!r}")
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{markdown.strip()}\n{end}\n"
    text = path.read_text() if path.exists() else HEADER
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + block
    atomic_write_text(path, text)
