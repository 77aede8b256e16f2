"""Atomic file writes: the one place where the project writes files that others read.

Everything is written to a temporary sibling first and renamed into place, so a reader never
sees a half-written file and an interrupted write leaves nothing behind.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


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
