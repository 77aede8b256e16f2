"""Atomic file writes, checked reads of the JSON and YAML files they leave behind, file digests
and folder locks.

Everything is written to a temporary sibling first and renamed into place, so a reader never
sees a half-written file and an interrupted write leaves nothing behind. A file that someone
edited or damaged by hand reads as a ``ValueError`` naming the file (:func:`read_json_object`,
:func:`read_yaml_mapping`), never as a bare parser error.

Writers of one folder (a cache folder, a converted model) are serialized by :func:`file_lock`
on a sibling lock file (:func:`lock_path`); the lock holder removes the temporary files that
killed writers left behind (:func:`remove_stale_temps`). :func:`sha256_file` is the one file
hasher: the cache's checksums and the models' content ids.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: file_lock is a no-op
    fcntl = None

_TEMP = re.compile(r"\..+\.tmp(\.[A-Za-z0-9_]+)?|\..+\.tmp-.+")  # atomic_path / mkdtemp names
_MEMO: dict = {}  # path -> ((size, mtime_ns, inode), sha256): sha256_file(memo=True)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _default_mode() -> int:
    return 0o666 & ~_umask()


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


@contextmanager
def atomic_folder(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder next to ``path``; it is renamed to ``path`` when the block succeeds.

    ``path`` must not exist (``FileExistsError`` naming it, before anything is written; a folder
    someone created meanwhile makes the final rename fail the same way). On an exception the
    temporary folder is removed: a reader never finds a half-written ``path``.

    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> with atomic_folder(d / "out") as tmp: _ = (tmp / "a.txt").write_text("a")
    >>> sorted(p.name for p in d.iterdir()), (d / "out" / "a.txt").read_text()
    (['out'], 'a')
    """
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{str(path)!r} already exists: give a new folder (nothing is overwritten)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0o700 -> a folder's usual mode
        try:
            os.rename(tmp, path)  # an existing non-empty folder fails here: never merged into
        except OSError as err:
            if path.exists():
                raise FileExistsError(f"{str(path)!r} appeared while it was written: nothing was overwritten") from err
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
    import yaml  # deferred: yaml: only the YAML readers need it

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


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22, *, memo: bool = False) -> str:
    """SHA-256 of a file's bytes.

    ``memo=True`` remembers the digest in-process on the file's ``(size, mtime_ns, inode)`` and
    reads the file again only when one of them changed (the models' content ids,
    :mod:`mdboost.models.identity`); checksum verification reads the bytes every time.

    >>> import tempfile; f = Path(tempfile.mkdtemp()) / "x"; _ = f.write_bytes(b"abc")
    >>> sha256_file(f) == sha256_file(f, memo=True) == hashlib.sha256(b"abc").hexdigest()
    True
    """
    path = Path(path)
    if memo:
        path = path.resolve()
        st = path.stat()
        stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        hit = _MEMO.get(path)
        if hit is not None and hit[0] == stamp:
            return hit[1]
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            digest.update(block)
    if memo:
        _MEMO[path] = (stamp, digest.hexdigest())
    return digest.hexdigest()


def lock_path(folder: str | os.PathLike) -> Path:
    """The lock file of a folder (or file): a hidden sibling, never removed with the folder."""
    folder = Path(folder)
    return folder.parent / f".{folder.name}.lock"


@contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created) for the block; waits for other holders.

    The operating system releases it when the holder dies, even by ``SIGKILL``, so a killed
    build never leaves a folder locked. Without ``fcntl`` (not POSIX) it is a no-op.
    """
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def remove_stale_temps(folder: str | os.PathLike, prefix: str = "") -> list[str]:
    """Remove the temporary files a killed writer left in ``folder`` (names ``.<name>.*.tmp*``
    starting with ``.<prefix>``); returns their names. Call it only while holding the folder's lock.

    >>> import tempfile; d = Path(tempfile.mkdtemp()); _ = (d / ".a.safetensors.x1.tmp.safetensors").write_text("")
    >>> remove_stale_temps(d), sorted(p.name for p in d.iterdir())
    (['.a.safetensors.x1.tmp.safetensors'], [])
    """
    folder, removed = Path(folder), []
    if not folder.is_dir():
        return removed
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(f".{prefix}") and _TEMP.fullmatch(entry.name) and not entry.name.endswith(".lock"):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
            removed.append(entry.name)
    return removed
