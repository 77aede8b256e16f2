"""Run a command only while a given process lives: how ``mdboost ui``'s MLflow server dies with
``mdboost ui``, even when that is killed by ``SIGKILL`` (which no handler sees).

``python -m mdboost.tracking.watchdog PARENT_PID -- COMMAND...`` makes its own process group
(unless it leads one already), runs ``COMMAND`` in it and polls every :data:`POLL` seconds
whether ``PARENT_PID`` is still its parent. When the parent is gone (the watchdog was handed to
another process), or on SIGTERM / SIGINT / SIGHUP, it sends SIGTERM to its whole group (the
command and every process the command started: ``mlflow server`` starts uvicorn, which starts
its workers), waits :data:`GRACE` seconds, then SIGKILLs the group. It exits with the command's
status (128 + the signal's number when a signal ended it).

Why a watchdog and not ``PR_SET_PDEATHSIG`` on the server alone: the death signal reaches only
the process that asked for it, and ``mlflow server`` runs uvicorn as a child, which would
outlive it. Polling the parent works on every POSIX system (Linux, macOS); on Windows, which
has neither process groups nor ``killpg``, ``mdboost ui`` is not supported.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL = 0.25  # seconds between two looks at the parent
GRACE = 10.0  # seconds the group gets to stop on SIGTERM before SIGKILL


class _Stop(Exception):
    """A signal asked the watchdog to stop its command."""


def _raise_stop(signum, frame):
    raise _Stop(signum)


def watch(parent: int, cmd: list[str], *, poll: float = POLL, grace: float = GRACE) -> int:
    """Run ``cmd`` in this process's group while ``parent`` is this process's parent; returns its status."""
    if os.getpgrp() != os.getpid():
        os.setsid()  # our own group: stopping it never reaches whoever started us
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _raise_stop)
    proc = subprocess.Popen(cmd)
    try:
        while proc.poll() is None and os.getppid() == parent:
            time.sleep(poll)
    except _Stop:
        pass
    finally:
        _stop_group(proc, grace)
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


def _stop_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the group (this process excepted), then SIGKILL to it if the command outlives ``grace``."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    os.killpg(os.getpgrp(), signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(os.getpgrp(), signal.SIGKILL)  # this process too: nothing of the group is left


def watched(cmd: list[str], parent: int | None = None) -> list[str]:
    """``cmd`` run under the watchdog of ``parent`` (default: this process). The watchdog runs as
    a script (this file: it imports nothing of mdboost), so it starts wherever the interpreter
    does, whatever the working directory and ``sys.path``.

    >>> watched(["mlflow", "server"], parent=42)[-4:]
    ['42', '--', 'mlflow', 'server']
    """
    return [sys.executable, os.path.abspath(__file__), str(os.getpid() if parent is None else parent), "--", *cmd]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: python -m mdboost.tracking.watchdog PARENT_PID -- COMMAND...", file=sys.stderr)
        return 2
    return watch(int(argv[0]), argv[2:])


if __name__ == "__main__":
    sys.exit(main())
