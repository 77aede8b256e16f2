"""Run untrusted code against a trusted check, contained, with a verdict it cannot forge.

The parent side of :mod:`mdboost.validation._sandbox_runner` (its docstring has the design):
this module writes the untrusted program into a fresh temporary folder, starts the checker
(inside new PID, network and mount namespaces through ``unshare`` where that works), sends it
the trusted part of the check on stdin, and reads the verdict from its exit status alone.
``docs/validation.md`` ("HumanEval") lists what each barrier contains, and where.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from mdboost.validation import _sandbox_kernel as kernel
from mdboost.validation import _sandbox_runner as runner

PASSED, FAILED, TIMEOUT = "passed", "failed", "timeout"
RUNNER = Path(runner.__file__)
GRACE_S = 5.0  # the parent's own kill comes this long after the checker's timeout
NAMESPACES = ("--net", "--pid", "--mount", "--mount-proc", "--fork", "--kill-child")


@dataclass(frozen=True)
class Barriers:
    """Which process-level barriers this machine gives a check (beyond rlimits and the guard).

    ``namespaces``: new PID, network and mount namespaces (the tree dies with the checker, no
    network at all, a private /proc). ``landlock_abi``: Landlock version (>= 1 confines writes,
    >= 4 also TCP, >= 6 also signals; 0 none). ``root``: the program runs as uid 0 with every
    capability dropped, its processes bounded by a pids cgroup (RLIMIT_NPROC does not bind
    root). ``subreaper``: orphans return to the checker (Linux). ``seccomp``: ``socket()`` is
    refused (Linux on x86_64 or aarch64).
    """

    namespaces: bool
    landlock_abi: int
    root: bool
    subreaper: bool
    seccomp: bool


@lru_cache(maxsize=1)
def namespace_command() -> tuple[str, ...]:
    """The ``unshare`` prefix that works here unprivileged (or as root); () where none does.

    Root needs no user namespace (and must not map one: its root would keep root's file
    access); anyone else maps their own uid into a new user namespace, keeping no capability
    once the checker starts.
    """
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return ()
    user = () if os.geteuid() == 0 else ("--user", "--map-current-user")
    command = (unshare, *user, *NAMESPACES)
    try:
        probe = subprocess.run([*command, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return command if probe.returncode == 0 else ()


def barriers() -> Barriers:
    """The barriers :func:`run` uses on this machine."""
    linux = sys.platform.startswith("linux")
    return Barriers(bool(namespace_command()), kernel.landlock_abi(), linux and os.geteuid() == 0,
                    linux, linux and os.uname().machine in kernel.SECCOMP_ARCH)


def check_limits(timeout: float, memory_mb: int) -> None:
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < 64:
        raise ValueError(f"memory_mb must be an integer >= 64, got {memory_mb!r}")


def run(program: str, check: dict | None = None, *, timeout: float = 10.0,
        memory_mb: int = 1024) -> tuple[str, str]:
    """Run ``program`` contained; return ``(status, detail)``.

    Parameters
    ----------
    program : str
        Untrusted Python source, run in the program process.
    check : dict or None
        The trusted part: ``prompt`` and ``test`` (run in the checker) and ``entry_point`` (the
        program's function that ``check`` receives). Then "passed" means the test's ``check``
        returned: the program cannot forge it. With None, "passed" only means the program
        reported that it ran to its end: nothing trusted runs, so the program decides.
    timeout : float
        Wall-clock seconds (> 0) for the whole check; also the program's CPU seconds (+1).
    memory_mb : int
        Address-space limit of each program process in MiB (>= 64).

    Returns
    -------
    tuple of str
        ``status`` ("passed", "failed" or "timeout") and a one-line ``detail``.
    """
    check_limits(timeout, memory_mb)
    trusted = dict(check) if check is not None else {"entry_point": None}
    with tempfile.TemporaryDirectory(prefix="mdboost-humaneval-", ignore_cleanup_errors=True) as tmp:
        path = Path(tmp, "program.py")
        path.write_text(program, encoding="utf-8")
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp,
               "LC_ALL": "C.UTF-8"}
        command = [*namespace_command(), sys.executable, "-I", "-B", str(RUNNER), str(path),
                   repr(float(timeout)), str(memory_mb)]
        proc = subprocess.Popen(command, cwd=tmp, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            out, err = proc.communicate(json.dumps(trusted).encode(), timeout=timeout + GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()  # unshare --kill-child takes the namespace's PID 1, hence all, with it
            proc.communicate()
            return TIMEOUT, f"no verdict within {timeout + GRACE_S}s"
    return _status(proc.returncode), _detail(out, err)


def _status(code: int) -> str:
    return {runner.EXIT_PASSED: PASSED, runner.EXIT_TIMEOUT: TIMEOUT}.get(code, FAILED)


def _detail(out: bytes, err: bytes) -> str:
    try:
        return str(json.loads(out.decode().strip().splitlines()[-1])["detail"])
    except (ValueError, IndexError, KeyError, TypeError):
        lines = err.decode(errors="replace").strip().splitlines()
        return lines[-1][:runner.MAX_DETAIL] if lines else "the checker gave no verdict"
