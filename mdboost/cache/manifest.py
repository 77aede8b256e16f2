"""Cache manifest, checksums and atomic file writes for the logit cache.

The manifest (``manifest.json``) holds the build configuration (model ids, tokenizer and
dataset fingerprints, ``k``, dtype, code version, text source) and, once shards finish, their
SHA-256 checksums (written after every finished shard, so an interrupted build keeps what it
finished), and its own checksum (``manifest_sha256``, over the rest of it: a hand-edited or
damaged manifest is refused). A finished shard also leaves a ``<shard>.sha256`` sidecar; a
resumed build trusts it only for shards the manifest does not list yet (:func:`trusted_digest`).
Readers verify every shard against the manifest, and the manifest against the layout it
describes (:func:`check_layout`: every member's shards listed, nothing else), and refuse
(:class:`CacheCorruptionError`) rather than read a damaged folder.

Builds of one folder are serialized by :func:`mdboost._io.file_lock` on a sibling lock file
(:func:`mdboost._io.lock_path`), so concurrent processes never write the same folder at once;
the lock holder removes temporary files that killed builds left behind
(:func:`mdboost._io.remove_stale_temps`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from safetensors.torch import save_file

from mdboost import __version__
from mdboost._io import atomic_path, atomic_write_text, sha256_file

FORMAT = "mdboost-logit-cache"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOKENS = "tokens.safetensors"


def lse_key(temperature: float) -> str:
    """Tensor name of ``logsumexp(logits / temperature)`` in a member shard."""
    return "logsumexp" if float(temperature) == 1.0 else f"logsumexp@{float(temperature):g}"


class CacheCorruptionError(ValueError):
    """A shard or manifest is missing, truncated, edited, or does not match its recorded checksum."""


CHECKSUM = "manifest_sha256"


def code_version() -> str:
    return f"mdboost {__version__} / cache format {FORMAT_VERSION}"


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


def manifest_checksum(manifest: dict) -> str:
    """SHA-256 of the manifest's canonical JSON without its own ``manifest_sha256``."""
    body = {k: v for k, v in manifest.items() if k != CHECKSUM}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_manifest(out_dir: str | os.PathLike) -> dict:
    """The folder's manifest, checked: ``ValueError`` when there is none or it is another format,
    :class:`CacheCorruptionError` when it is not valid JSON or does not match its checksum
    (manifests written before the checksum have none and are read as they are)."""
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        raise ValueError(f"out_dir {str(out_dir)!r} holds no {MANIFEST}: not a logit cache")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CacheCorruptionError(f"{path} is damaged (not valid JSON: {err}); rebuild the cache") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} manifest")
    if CHECKSUM in manifest and manifest[CHECKSUM] != manifest_checksum(manifest):
        raise CacheCorruptionError(f"{path} was edited or damaged (its {CHECKSUM} does not match); rebuild the cache")
    return manifest


def write_manifest(out_dir: str | os.PathLike, manifest: dict) -> None:
    """Write ``manifest`` atomically with its checksum (``manifest_sha256``, set in ``manifest`` too)."""
    manifest[CHECKSUM] = manifest_checksum(manifest)
    atomic_write_text(Path(out_dir) / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))


def trusted_digest(path: str | os.PathLike, recorded: dict | None) -> str | None:
    """The digest of a finished file a resumed build may keep, else ``None``.

    ``recorded``: the file's manifest entry (``{"sha256", "bytes"}``) or None. A listed file must
    match its entry (its sidecar is not trusted: a file swapped together with its sidecar, or
    damaged with the sidecar rewritten, is rebuilt); an unlisted one (finished after the last
    manifest write) must match its sidecar (:func:`finished_digest`).
    """
    path = Path(path)
    if recorded is None:
        return finished_digest(path)
    if not path.is_file() or path.stat().st_size != recorded.get("bytes"):
        return None
    digest = sha256_file(path)
    return digest if digest == recorded.get("sha256") else None


def expected_files(manifest: dict, num_sequences: int) -> list[str]:
    """The files the manifest's layout needs: the token file, then every member's shards."""
    count = -(-num_sequences // int(manifest["shard_size"]))
    return [TOKENS] + [shard_name(m["name"], i) for m in manifest["members"] for i in range(count)]


def check_layout(out_dir: str | os.PathLike, manifest: dict, tokens: dict) -> None:
    """Raise :class:`CacheCorruptionError` unless the manifest describes the folder's token file:
    the same sequences and rows, one record id per sequence, and a checksum entry for exactly
    the files its members and ``shard_size`` imply (an entry dropped, a member renamed or
    ``shard_size`` edited in an older manifest without checksum all fail here)."""
    num_sequences = int(tokens["starts"].numel())
    problems = []
    if manifest.get("num_sequences") != num_sequences or len(manifest.get("record_ids", [])) != num_sequences:
        problems.append(f"{num_sequences} sequences in {TOKENS}, manifest says {manifest.get('num_sequences')!r}")
    if manifest.get("num_rows") != int(tokens["row_offsets"][-1]):
        problems.append(f"{int(tokens['row_offsets'][-1])} rows in {TOKENS}, manifest says {manifest.get('num_rows')!r}")
    try:
        expected = set(expected_files(manifest, num_sequences))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as err:
        raise CacheCorruptionError(f"manifest of {out_dir} lacks its layout ({err!r}); rebuild the cache") from None
    listed = set(manifest.get("shards", {}))
    if expected - listed:
        problems.append(f"files without a manifest entry: {sorted(expected - listed)}")
    if listed - expected:
        problems.append(f"manifest entries outside the layout: {sorted(listed - expected)}")
    if problems:
        raise CacheCorruptionError(f"inconsistent cache in {out_dir}: {'; '.join(problems)}; rebuild the cache")


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
