"""Atomic file writes, and checked reads of the JSON and YAML files they leave behind.

Everything is written to a temporary sibling first and renamed into place, so a reader never
sees a half-written file and an interrupted write leaves nothing behind. A file that someone
edited or damaged by hand reads as a ``ValueError`` naming the file (:func:`read_json_object`,
:func:`read_yaml_mapping`), never as a bare parser error.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; it replaces ``path`` when the block succeeds.

    The temporary name keeps ``path``'s suffix (so writers that infer a format from it, such
    as ``savefig``, behave) and the file gets the usual permissions (``0o666`` less the umask).
    On an exception the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, _default_mode())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (no newline translation); returns the path."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="") as fh:
            fh.write(text)
    return Path(path)


def read_json_object(path: str | os.PathLike) -> dict | None:
    """The JSON object in ``path``, or None when there is no such file.

    Not valid JSON (or not UTF-8), or JSON that is not an object: ``ValueError`` naming the file.
    """
    path = Path(path)
    if not path.is_file():
        return None
    try:
        out = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(out, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(out).__name__}")
    return out


def read_yaml_mapping(path: str | os.PathLike) -> dict:
    """The YAML mapping in the file ``path`` (an empty file reads as ``{}``).

    Not valid YAML (or not UTF-8), or YAML that is not a mapping: ``ValueError`` naming the file.
    """
    import yaml

    path = Path(path)
    try:
        out = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid YAML: {str(err).splitlines()[0]}") from None
    if out is None:
        return {}
    if not isinstance(out, dict):
        raise ValueError(f"{path} must hold a YAML mapping, got {type(out).__name__}")
    return out


def json_ready(value):
    """``value`` with NaN / inf floats as None, tuples as lists and numpy scalars as Python ones: strict
    JSON (which has no NaN or Infinity, and which strict parsers such as ``JSON.parse`` hold to)."""
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value
