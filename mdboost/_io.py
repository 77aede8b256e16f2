"""Atomic file writes, whole output folders replaced atomically, checked reads of the JSON and
YAML files they leave behind, file digests and folder locks.

Everything is written to a temporary sibling first and renamed into place, so a reader never
sees a half-written file and an interrupted write leaves nothing behind. A file that someone
edited or damaged by hand reads as a ``ValueError`` naming the file (:func:`read_json_object`,
:func:`read_yaml_mapping`), never as a bare parser error.

Writers of one folder (a cache folder, a converted model) are serialized by :func:`file_lock`
on a sibling lock file (:func:`lock_path`); the lock holder removes the temporary files that
killed writers left behind (:func:`remove_stale_temps`). :func:`sha256_file` is the one file
hasher: the cache's checksums and the models' content ids.

A pipeline's output folder is written whole by :func:`output_folder`: the run writes into a fresh
hidden sibling named after this host and process (:func:`run_temp_folder`) and
:func:`swap_folder` renames it into place at the end (old folder aside, new one in, old one
removed), so the folder holds one run's files or, for the instant between the two renames or
after a kill there, none; never two runs' files mixed.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: file_lock is a no-op
    fcntl = None

_TEMP = re.compile(r"\..+\.tmp(\.[A-Za-z0-9_]+)?|\..+\.tmp-.+")  # atomic_path / mkdtemp names
_RUN_TEMP = re.compile(r"\.(?P<name>.+)\.tmp-(?P<host>[A-Za-z0-9.]+)-(?P<pid>\d+)-[a-z0-9_]+")  # run_temp_folder
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


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
    return Path(path)


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


def _host() -> str:
    """This machine's name in the characters a temporary folder's name allows (``[A-Za-z0-9.]``)."""
    return re.sub(r"[^A-Za-z0-9.]", ".", socket.gethostname()) or "host"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine runs (not POSIX: assumed alive, nothing is removed)."""
    if os.name != "posix":  # pragma: no cover - os.kill(pid, 0) would terminate it on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def run_temp_folder(path: str | os.PathLike) -> Path:
    """A fresh, empty hidden sibling of ``path`` named after this host and process:
    ``.<name>.tmp-<host>-<pid>-<random>`` (:func:`remove_dead_runs_temps` reads the two back)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-{_host()}-{os.getpid()}-"))


def remove_dead_runs_temps(path: str | os.PathLike) -> list[str]:
    """Remove the temporary siblings of ``path`` (:func:`run_temp_folder`) whose process is gone:
    named after this host and a process id that no longer runs; returns their names. Those of
    other hosts (a shared file system) and of live processes are left alone.

    >>> import tempfile; d = Path(tempfile.mkdtemp()); t = run_temp_folder(d / "out")
    >>> remove_dead_runs_temps(d / "out"), t.is_dir()  # this process runs: kept
    ([], True)
    """
    path, removed, host = Path(path), [], _host()
    if not path.parent.is_dir():
        return removed
    for entry in sorted(path.parent.iterdir()):
        match = _RUN_TEMP.fullmatch(entry.name)
        if match and match["name"] == path.name and match["host"] == host and not _alive(int(match["pid"])):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed


def swap_folder(new: str | os.PathLike, path: str | os.PathLike) -> None:
    """Rename the folder ``new`` to ``path``, replacing the folder there, as atomically as POSIX
    allows: the old folder is renamed aside (into a :func:`run_temp_folder` sibling), ``new`` in,
    then the old one removed. A reader finds the old folder, no folder (between the two renames,
    or for good when the process is killed there) or the new one, never a mix. Hold
    ``path``'s :func:`file_lock` around it when others may swap the same folder."""
    new, path = Path(new), Path(path)
    aside = None
    if path.exists():
        aside = run_temp_folder(path) / "old"
        os.rename(path, aside)
    try:
        os.rename(new, path)
    except OSError:
        if aside is not None and not path.exists():
            os.rename(aside, path)  # the old folder back
        raise
    finally:
        if aside is not None:
            shutil.rmtree(aside.parent, ignore_errors=True)


def foreign_entries(path: str | os.PathLike, owned: Iterable[str]) -> list[str]:
    """The names in the folder ``path`` that are not in ``owned`` (none when it does not exist)."""
    path, owned = Path(path), set(owned)
    return sorted(e.name for e in path.iterdir() if e.name not in owned) if path.is_dir() else []


def check_output_folder(path: str | os.PathLike, owned: Iterable[str]) -> Path:
    """``path`` as an absolute path if a run may replace it whole: it does not exist, or it is a
    folder holding only names of ``owned`` (the files a run of this kind writes). Else a
    ``FileExistsError`` naming the folder and what else it holds: nothing of the user's is ever
    removed with an old output folder.

    >>> import tempfile; d = Path(tempfile.mkdtemp()); _ = (d / "notes.txt").write_text("mine")
    >>> check_output_folder(d, ["summary.json"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    FileExistsError: output folder '...' holds files no run writes (notes.txt): ...
    """
    path = Path(os.path.abspath(path))
    if not path.name:
        raise FileExistsError(f"output folder {str(path)!r} is a file system root: give a folder of its own")
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"output folder {str(path)!r} is a file: give a folder")
    foreign = foreign_entries(path, owned)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise FileExistsError(f"output folder {str(path)!r} holds files no run writes ({shown}): a run replaces "
                              "its output folder whole; give another output_dir or move them")
    return path


@contextmanager
def output_folder(path: str | os.PathLike, owned: Iterable[str]) -> Iterator[Path]:
    """Yield a fresh temporary folder for a run's outputs; when the block succeeds it replaces
    ``path`` whole (:func:`swap_folder`, under ``path``'s :func:`file_lock`).

    ``owned``: the names a run writes at the top of the folder; an existing ``path`` holding
    anything else is refused (:func:`check_output_folder`), on entry and again at the swap. Two
    runs on one folder each write their own temporary folder and the last to finish wins: the
    folder always holds one run's complete outputs. On an exception the temporary folder is
    removed and ``path`` left as it was; one of a killed run is removed by the next run
    (:func:`remove_dead_runs_temps`).

    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> for text in ("first", "second"):
    ...     with output_folder(d / "out", ["a.txt"]) as tmp: _ = (tmp / "a.txt").write_text(text)
    >>> sorted(p.name for p in d.iterdir()), (d / "out" / "a.txt").read_text()
    (['.out.lock', 'out'], 'second')
    """
    owned = tuple(owned)
    path = check_output_folder(path, owned)
    remove_dead_runs_temps(path)
    tmp = run_temp_folder(path)
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0o700 -> a folder's usual mode
        with file_lock(lock_path(path)):  # one swap at a time: the last run to finish wins
            check_output_folder(path, owned)
            swap_folder(tmp, path)
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
