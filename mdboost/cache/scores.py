"""The cost-free work of a ranking, kept between runs: ``<cache dir>/scores/<key>.pt``.

Most of a ranking's scoring does not depend on costs: a pair's operating points, rule laws,
quality and boosting columns and draft-start processes (:func:`mdboost.ranking.rank.pair_work`),
and each frontier's points (:func:`mdboost.ranking.frontier.frontier` without a speed model).
A ranking keeps them here and prices them with the costs at hand, so ``mdboost rank --costs``
(another machine's costs) and a re-run with the same settings skip that work, with the same
results as a run that did it (the pricing is the same code on the same values).

**Keys are content.** :func:`work_key` hashes everything the work depends on: the cache folders
it reads, by their names (each folder's name is already a content key, :mod:`mdboost.cache.keys`;
names, not paths, so a copied cache keeps its work), the settings (their ``repr``), and
:func:`code_digest`, the bytes of mdboost's own source: any change to the package gives new keys,
so work computed by other code is never read. Files are written atomically (temporary file,
then rename); one that cannot be read is computed again and replaced.

The files are pickles (``torch.save``), read only from this cache folder: trust them as you trust
the folder (as joblib's and scikit-learn's ``memory=`` caches are trusted). Remove ``scores/`` to
reclaim its space; nothing else refers to it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
from pathlib import Path
from typing import Callable, TypeVar

import torch

from mdboost._io import atomic_path

FOLDER = "scores"
_FORMAT = 1
T = TypeVar("T")


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """SHA-256 of mdboost's source files (their paths in the package and bytes, in path order)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def work_key(kind: str, **parts) -> str:
    """The key of one piece of work: its ``kind`` and ``parts`` (JSON-able values; settings as their
    ``repr``), the file format and :func:`code_digest`.

    >>> work_key("pair", folders=["a-1"]) == work_key("pair", folders=["a-1"])
    True
    >>> work_key("pair", folders=["a-1"]) == work_key("pair", folders=["a-2"])
    False
    """
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"kind must be a non-empty string, got {kind!r}")
    text = json.dumps({"kind": kind, "format": _FORMAT, "code": code_digest(), **parts}, sort_keys=True,
                      default=repr)
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:32]}"


def folder_names(pc, members) -> list[str] | None:
    """The names of the cache folders of ``members`` (those ``pc`` holds) in an opened
    :class:`~mdboost.cache.pool_cache.PoolCache` ``pc`` (None: None): content keys, not paths."""
    if pc is None:
        return None
    return [os.path.basename(os.path.normpath(pc.caches[m].out_dir)) for m in members if m in pc.caches]


class WorkStore:
    """The ``scores`` folder of a cache: :meth:`get` a piece of work by key, computing and keeping
    it when it is not there.

    Parameters
    ----------
    folder : path-like
        The folder (created on the first write).
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)

    @classmethod
    def beside(cls, cache_folder: str | os.PathLike) -> "WorkStore":
        """The store of the cache that holds the member folder ``cache_folder``."""
        return cls(Path(cache_folder).parent / FOLDER)

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.pt"

    def get(self, key: str, make: Callable[[], T]) -> T:
        """The work kept under ``key``, else ``make()`` (then kept)."""
        path = self.path(key)
        if path.is_file():
            try:
                return torch.load(path, weights_only=False)
            except (OSError, EOFError, RuntimeError, pickle.UnpicklingError, AttributeError, ImportError):
                pass  # damaged (or written by a foreign pickle): made again and replaced below
        value = make()
        with atomic_path(path) as tmp:
            torch.save(value, tmp)
        return value
