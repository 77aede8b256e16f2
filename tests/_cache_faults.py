"""Fault injection for logit-cache folders, shared by ``tests/test_cache_faults.py`` and
``bench/cache_faults.py``: SIGKILL a build at a chosen file operation (in a forked child), and
the kinds of damage a folder can take."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

from mdboost._io import sha256_file
from mdboost.cache import manifest as manifest_module
from mdboost.cache.manifest import CHECKSUM, MANIFEST, TOKENS, manifest_checksum

RECORDS = [
    {"id": f"r{i}", "prompt": f"def f{i}(x):\n    y = x + {i}\n", "reference": f"    return y * {i} + y\n"}
    for i in range(5)
]


def folder_state(folder: Path) -> dict:
    """Every file of a cache folder (lock files aside) as bytes, the manifest as parsed JSON."""
    out = {}
    for path in sorted(Path(folder).iterdir()):
        if path.name == MANIFEST:
            out[path.name] = json.loads(path.read_text())
        elif path.is_file():
            out[path.name] = path.read_bytes()
    return out


def temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in Path(folder).iterdir() if p.name.startswith(".") and ".tmp" in p.name)


def killed_build(build, kill_at: int, when: str = "before", delay: float | None = None) -> bool:
    """Run ``build()`` in a forked child that SIGKILLs itself at a file operation; True if it was killed.

    ``when="before"``: right before the ``kill_at``-th ``os.replace`` (the temporary file is
    written, not renamed); ``"after"``: right after it; ``"mid-write"``: the ``kill_at``-th
    safetensors file is left half written, then the kill; ``delay`` (seconds, instead of a file
    operation): a timer kills the child at a random time.
    """
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test runner
        try:
            count = [0]
            kill = lambda: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731
            if delay is not None:
                import threading

                threading.Timer(delay, kill).start()
            elif when == "mid-write":
                real_save = manifest_module.save_file

                def save_file(tensors, path, *a, **k):
                    real_save(tensors, path, *a, **k)
                    count[0] += 1
                    if count[0] == kill_at:
                        size = os.path.getsize(path)
                        os.truncate(path, size // 2)
                        kill()

                manifest_module.save_file = save_file
            else:
                real_replace = os.replace

                def replace(src, dst, *a, **k):
                    count[0] += 1
                    if count[0] == kill_at and when == "before":
                        kill()
                    real_replace(src, dst, *a, **k)
                    if count[0] == kill_at and when == "after":
                        kill()

                os.replace = replace
            build()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


# ---- damage ---------------------------------------------------------------------------------

def _edit_manifest(folder: Path, edit, legacy: bool = False) -> None:
    """Edit the parsed manifest in place; ``legacy``: drop its checksum too (a manifest written
    before checksums, edited), else keep the stale checksum (an edit by hand)."""
    path = folder / MANIFEST
    data = json.loads(path.read_text())
    edit(data)
    if legacy:
        data.pop(CHECKSUM, None)
    path.write_text(json.dumps(data, indent=2, sort_keys=True))


def _flip(path: Path, at: int = -3) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _rewrite_sidecar(path: Path) -> None:
    _sidecar(path).write_text(sha256_file(path) + "\n")


def _swap(a: Path, b: Path) -> None:
    for x, y in ((a, b), (_sidecar(a), _sidecar(b))):
        tmp = x.with_name(x.name + ".swap")
        x.rename(tmp)
        y.rename(x)
        tmp.rename(y)


def _rename_member(data: dict) -> None:
    data["members"][1]["name"] = "early_exit:3"


def _drop_entry(data: dict) -> None:
    del data["shards"]["early_exit_2-00001.safetensors"]


def _resign(data: dict) -> None:
    """A forged but self-consistent manifest: the checksum recomputed after an edit."""
    data[CHECKSUM] = manifest_checksum(data)


SHARD = "early_exit_2-00001.safetensors"
CORRUPTIONS = {
    "shard bit flipped": lambda d: _flip(d / SHARD),
    "shard truncated": lambda d: os.truncate(d / SHARD, (d / SHARD).stat().st_size // 2),
    "shard emptied": lambda d: os.truncate(d / SHARD, 0),
    "shard deleted": lambda d: (d / SHARD).unlink(),
    "shard flipped, sidecar rewritten": lambda d: (_flip(d / SHARD), _rewrite_sidecar(d / SHARD)),
    "shard swapped with its sidecar (same member)": lambda d: _swap(d / SHARD, d / "early_exit_2-00000.safetensors"),
    "shard swapped with its sidecar (other member)": lambda d: _swap(d / SHARD, d / "tiny-00001.safetensors"),
    "token file bit flipped": lambda d: _flip(d / TOKENS, 100),
    "token file deleted": lambda d: (d / TOKENS).unlink(),
    "manifest truncated": lambda d: os.truncate(d / MANIFEST, (d / MANIFEST).stat().st_size // 2),
    "manifest deleted": lambda d: (d / MANIFEST).unlink(),
    "manifest entry dropped": lambda d: _edit_manifest(d, _drop_entry),
    "manifest entry dropped (no checksum)": lambda d: _edit_manifest(d, _drop_entry, legacy=True),
    "manifest shard_size edited": lambda d: _edit_manifest(d, lambda m: m.update(shard_size=4)),
    "manifest shard_size edited (no checksum)": lambda d: _edit_manifest(d, lambda m: m.update(shard_size=1), legacy=True),
    "manifest k edited (no checksum)": lambda d: _edit_manifest(d, lambda m: m.update(k=m["k"] - 1), legacy=True),
    "manifest vocab_size edited (no checksum)": lambda d: _edit_manifest(
        d, lambda m: m.update(vocab_size=m["vocab_size"] + 8), legacy=True),
    "manifest member renamed (no checksum)": lambda d: _edit_manifest(d, _rename_member, legacy=True),
    "manifest num_rows edited (no checksum)": lambda d: _edit_manifest(
        d, lambda m: m.update(num_rows=m["num_rows"] - 1), legacy=True),
    "manifest complete flag edited": lambda d: _edit_manifest(d, lambda m: m.update(complete=False)),
    "manifest shard_size edited, checksum forged": lambda d: _edit_manifest(d, lambda m: (m.update(shard_size=4), _resign(m))),
}


def damaged_copy(clean: Path, out: Path, kind: str) -> Path:
    shutil.copytree(clean, out)
    CORRUPTIONS[kind](out)
    return out
