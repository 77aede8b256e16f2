"""The grid of ``bench/generation.py``: configurations (cells), their chunks and the cells file.

A *cell* (:class:`Spec` at fixed settings) is one measured configuration; a *chunk* is the
cells measured together in one process. :func:`plan_chunks` orders a grid by drafter priority;
the cells file (``bench/generation_cells.json``) holds every measured cell, written atomically.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import NamedTuple

from mdboost._io import atomic_write_text
from mdboost.models.pool import DEFAULT_DRAFTERS, parse_drafter

CELLS = Path(__file__).with_name("generation_cells.json")
FORMAT = "mdboost-generation-cells/1"
# Drafter order: acceptance and cost ratio of the `cache` section through the speed model
# (tuned:12 cheapest with ~0.4 acceptance, then the deep tuned exits); kinds in FIRST_TIER run
# at every temperature before the others.
PRIORITY = ("ngram:3", "tuned:12", "tuned:27", "tuned:24", "tuned:18", "int8",
            "early_exit:27", "early_exit:24", "early_exit:18", "early_exit:12")
FIRST_TIER = ("ngram", "tuned")
FULL_GRID = dict(drafters=",".join(DEFAULT_DRAFTERS), gammas=[2, 4, 6], budgets=[0.01, 0.05, 0.2],
                 temperatures=[1.0, 0.7], prompts=10, new_tokens=64)
DEFAULTS = dict(drafters="early_exit:12,ngram:3", gammas=[4], budgets=[0.05], temperatures=[0.0, 1.0],
                prompts=4, new_tokens=64)
SETTINGS = ("target", "device", "prompts", "new_tokens", "seed", "threads")
HF_MODES = ("hf_ar", "hf_assisted", "hf_lookup")
PEER_CONFIDENCE = 0.4  # transformers' default assistant_confidence_threshold


class Spec(NamedTuple):
    """One configuration. ``mode``: ar, sd, md, hf_ar, hf_assisted or hf_lookup."""

    mode: str
    temperature: float
    drafter: str | None = None
    gamma: int | None = None
    budget: float | None = None


class Chunk(NamedTuple):
    """Cells measured together (interleaved per prompt, with the engine's AR at ``temperature``)."""

    name: str
    temperature: float
    cells: tuple


def settings_of(args) -> dict:
    return {name: getattr(args, name) for name in SETTINGS}


def cell_key(spec: Spec, settings: dict) -> str:
    """The identity of a cell: its configuration plus every setting that changes its timing."""
    return "|".join([f"{k}={v}" for k, v in spec._asdict().items()] + [f"{k}={settings[k]}" for k in SETTINGS])


# --------------------------------------------------------------------------- planning

def drafter_priority(name: str) -> tuple[int, int]:
    """``(tier, rank)``: tier 0 for n-gram and tuned drafters; rank from ``PRIORITY``."""
    tier = 0 if parse_drafter(name)[0] in FIRST_TIER else 1
    return tier, PRIORITY.index(name) if name in PRIORITY else len(PRIORITY)


def plan_chunks(drafters, gammas, budgets, temperatures, hf=True, peer_drafter=None, peer_gamma=4) -> list[Chunk]:
    """The chunks of a grid in priority order; a cell appears once (in its first chunk)."""
    drafters = sorted(drafters, key=drafter_priority)
    chunks = []
    if hf:
        lookup = next((d for d in drafters if parse_drafter(d)[0] == "ngram"), None)
        peer = peer_drafter or next((d for d in drafters if parse_drafter(d)[0] != "ngram"), None)
        cells = [Spec("hf_ar", 0.0)]
        for mode, name in (("hf_lookup", lookup), ("hf_assisted", peer)):
            if name is not None:
                cells += [Spec(mode, 0.0, name, peer_gamma), Spec("sd", 0.0, name, peer_gamma, 0.0)]
        chunks.append(Chunk("HF peers (greedy)", 0.0, tuple(cells)))
    for tier in (0, 1):
        for temp in temperatures:
            for name in (d for d in drafters if drafter_priority(d)[0] == tier):
                cells = []
                for gamma in gammas:
                    cells.append(Spec("sd", temp, name, gamma, 0.0))
                    if temp > 0:  # at temperature 0 q is one-hot and MD reduces to SD
                        cells += [Spec("md", temp, name, gamma, b) for b in budgets]
                chunks.append(Chunk(f"{name} T={temp}", temp, tuple(cells)))
    seen = set()

    def measured_before(spec):
        found = spec in seen
        seen.add(spec)
        return found

    return _pending(chunks, measured_before)


def _pending(chunks, done) -> list[Chunk]:
    out = []
    for chunk in chunks:
        cells = tuple(spec for spec in chunk.cells if not done(spec))
        if cells:
            out.append(chunk._replace(cells=cells))
    return out


def dependencies(spec: Spec) -> list[tuple[str, Spec]]:
    """``(role, spec)`` of the configs a cell's ratios need from the same process (besides AR)."""
    if spec.mode == "md":
        return [("sd", Spec("sd", spec.temperature, spec.drafter, spec.gamma, 0.0))]
    if spec.mode in ("hf_assisted", "hf_lookup"):
        return [("hf_ar", Spec("hf_ar", 0.0)), ("engine", Spec("sd", 0.0, spec.drafter, spec.gamma, 0.0))]
    return []


def chunk_specs(chunk: Chunk) -> list[Spec]:
    """Everything a chunk runs: AR, then each cell after the configs it depends on."""
    specs = [Spec("ar", chunk.temperature)]
    for spec in chunk.cells:
        specs += [s for _, s in dependencies(spec) if s not in specs] + ([spec] if spec not in specs else [])
    return specs


def grid_keys(args) -> dict[str, str]:
    """``{key: chunk name}`` of the full grid (FULL_GRID) at the current settings."""
    chunks = plan_chunks(FULL_GRID["drafters"].split(","), FULL_GRID["gammas"], FULL_GRID["budgets"],
                         FULL_GRID["temperatures"], True, args.peer_drafter, 4)
    return {cell_key(s, settings_of(args)): c.name for c in chunks for s in c.cells}


# --------------------------------------------------------------------------- cells file

def load_cells(path: Path) -> dict[str, dict]:
    """``{key: cell}`` from the cells file (empty when it does not exist)."""
    if not Path(path).exists():
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"cells file {path} is not valid JSON: {err}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"cells file {path} must have format {FORMAT!r}, got {data.get('format') if isinstance(data, dict) else data!r}")
    return {cell["key"]: cell for cell in data["cells"]}


def save_cells(path: Path, cells: dict[str, dict]) -> None:
    """Write all cells atomically, one JSON object per line."""
    body = ",\n".join(json.dumps(cell, sort_keys=True) for cell in cells.values())
    atomic_write_text(path, f'{{"format": "{FORMAT}", "cells": [\n{body}\n]}}\n')


def merge_cells(path: Path, new: dict[str, dict]) -> dict[str, dict]:
    """Add ``new`` cells to the file (a new cell replaces one with the same key); returns all cells.

    The read-merge-write holds an exclusive ``flock`` on the file's folder, so processes that
    measure different chunks into the same file (``--shard``) never drop each other's cells
    (and no lock file is left behind).
    """
    path = Path(path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        cells = load_cells(path)
        cells.update(new)
        save_cells(path, cells)
    finally:
        os.close(folder)  # releases the lock
    return cells


def parse_shard(spec: str) -> tuple[int, int]:
    """``"I/N"`` -> ``(I, N)`` with ``0 <= I < N``."""
    try:
        index, count = (int(x) for x in spec.split("/"))
    except ValueError:
        index, count = -1, 0
    if not 0 <= index < count:
        raise ValueError(f"--shard must be I/N with 0 <= I < N, got {spec!r}")
    return index, count


def shard(chunks: list, part: tuple[int, int] | None) -> list:
    """The chunks of shard ``(I, N)`` (every ``N``-th chunk from the ``I``-th, 0-based); all for None.

    Applied to the whole plan (before ``--resume`` drops measured cells), so concurrent processes
    get disjoint chunks whenever each of them starts.
    """
    if part is None:
        return chunks
    index, count = part
    return chunks[index::count]
