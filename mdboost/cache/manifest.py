"""Cache manifest, checksums and atomic file writes for the logit cache.

The manifest (``manifest.json``) holds the build configuration (model ids, tokenizer and
dataset fingerprints, ``k``, dtype, code version, text source) and, once shards finish, their
SHA-256 checksums. A finished shard also leaves a ``<shard>.sha256`` sidecar, which is what
makes an interrupted build resumable: a shard whose bytes match its sidecar is skipped, any
other shard is rebuilt. Readers verify every shard against the manifest and refuse
(:class:`CacheCorruptionError`) rather than silently read a damaged file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from safetensors.torch import save_file

from mdboost._io import atomic_path, atomic_write_text

FORMAT = "mdboost-logit-cache"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOKENS = "tokens.safetensors"


def lse_key(temperature: float) -> str:
    """Tensor name of ``logsumexp(logits / temperature)`` in a member shard."""
    return "logsumexp" if float(temperature) == 1.0 else f"logsumexp@{float(temperature):g}"


class CacheCorruptionError(ValueError):
    """A shard is missing, truncated, or does not match its recorded checksum."""


def code_version() -> str:
    from mdboost import __version__

    return f"mdboost {__version__} / cache format {FORMAT_VERSION}"


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def atomic_save_tensors(tensors: dict, path: str | os.PathLike) -> str:
    """Save ``tensors`` as safetensors atomically, write the ``.sha256`` sidecar; return the digest.

    No safetensors metadata is written, so equal tensors give byte-identical files.
    """
    path = Path(path)
    with atomic_path(path) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
        digest = sha256_file(tmp)
    atomic_write_text(path.with_name(path.name + ".sha256"), digest + "\n")
    return digest


def finished_digest(path: str | os.PathLike) -> str | None:
    """The shard's digest when its bytes match its sidecar (a finished shard), else ``None``."""
    path = Path(path)
    sidecar = path.with_name(path.name + ".sha256")
    if not path.is_file() or not sidecar.is_file():
        return None
    recorded = sidecar.read_text().strip()
    return recorded if sha256_file(path) == recorded else None


def read_manifest(out_dir: str | os.PathLike) -> dict:
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        raise ValueError(f"out_dir {str(out_dir)!r} holds no {MANIFEST}: not a logit cache")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} manifest")
    return manifest


def write_manifest(out_dir: str | os.PathLike, manifest: dict) -> None:
    atomic_write_text(Path(out_dir) / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))


def verify_shards(out_dir: str | os.PathLike, manifest: dict) -> list[str]:
    """Names of shards that are missing or whose checksum differs from the manifest."""
    bad = []
    for name, info in manifest.get("shards", {}).items():
        path = Path(out_dir) / name
        if not path.is_file() or path.stat().st_size != info["bytes"] or sha256_file(path) != info["sha256"]:
            bad.append(name)
    return bad


def shard_name(member: str, index: int) -> str:
    """File name of a member's shard; the member name is made file-system safe."""
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in member)
    return f"{slug}-{index:05d}.safetensors"
