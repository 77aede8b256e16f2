"""Linux process controls for the HumanEval sandbox: prctl, Landlock, seccomp, capabilities,
a pids cgroup, and the walk that kills a process tree.

Used by :mod:`mdboost.validation._sandbox_runner` (which says why each is there) and, for what a
machine offers, by :mod:`mdboost.validation.sandbox`. Standard library and ``ctypes`` only; every
function is a no-op or returns a falsy value where its kernel feature is absent (not Linux, an
older kernel), except where a failure would leave a barrier half set: those raise ``OSError``.
Constants are the kernel's UAPI headers' (``linux/prctl.h``, ``linux/landlock.h``,
``linux/seccomp.h``, ``linux/capability.h``, ``linux/audit.h``).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import time

MAX_PROCESSES = 16  # processes the program may add (RLIMIT_NPROC headroom, or pids cgroup)
CGROUP_ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")  # cgroup v1 pids hierarchy, v2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 4, 38, 36
PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 28, 47, 4
SECUREBITS_LOCKED_NOROOT = 0x2F  # noroot, no_setuid_fixup, keep_caps off: each locked
CAPABILITY_V3 = 0x20080522
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
# seccomp: (audit arch, socket syscall number) of the architectures the filter knows
SECCOMP_ARCH = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}
# Landlock's syscall numbers 444-446 are the same on every architecture that has Landlock.
SYS_LANDLOCK = {"create": 444, "add_rule": 445, "restrict": 446}
LL_FS_WRITE = (1 << 1) | sum(1 << b for b in range(4, 13))  # write_file, remove_*, make_*
LL_FS_BY_ABI = {2: 1 << 13, 3: 1 << 14, 5: 1 << 15}  # refer, truncate, ioctl_dev
LL_NET_TCP = (1 << 0) | (1 << 1)  # bind_tcp, connect_tcp (ABI 4)
LL_SCOPE = (1 << 0) | (1 << 1)  # abstract unix sockets, signals (ABI 6)


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
    """Pids in ``cgroup`` (in this process's PID namespace); none without one."""
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
    limit = sum(1 for p in descendants(0) if _owner(p) == uid) + MAX_PROCESSES
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)  # a limit cannot be raised
    resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))


def _owner(pid: int) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1
