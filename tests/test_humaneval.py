"""mdboost.validation.humaneval: the HumanEval checks and pass@k (hostile completions:
tests/test_sandbox.py)."""

from __future__ import annotations

import itertools
import random

import pytest

from mdboost.validation import humaneval as he

SUBSET = ["HumanEval/0", "HumanEval/2", "HumanEval/10", "HumanEval/32", "HumanEval/53",
          "HumanEval/100", "HumanEval/163"]


@pytest.fixture(scope="module")
def problems():
    return he.load_problems()


def test_bundled_problems_are_the_164_tasks(problems):
    assert len(problems) == 164
    assert {"prompt", "test", "entry_point", "canonical_solution"} <= set(problems["HumanEval/0"])


def test_canonical_solutions_pass(problems):
    result = he.evaluate(problems, {t: problems[t]["canonical_solution"] for t in SUBSET})
    assert [r.task_id for r in result.results] == SUBSET
    assert all(r.passed for r in result.results), [r for r in result.results if not r.passed]
    assert result.pass_at_1 == 1.0


@pytest.mark.slow
def test_all_canonical_solutions_pass(problems):
    result = he.evaluate(problems, {t: p["canonical_solution"] for t, p in problems.items()})
    assert result.n_passed == 164, [r for r in result.results if not r.passed]


@pytest.mark.parametrize("completion", [
    "    pass\n",                                      # returns None
    "    raise RuntimeError('boom')\n",
    "    return 42\n",
    "    import sys\n    sys.exit(0)\n",               # exits 0 before the checks run
    "    import os\n    os._exit(0)\n",
    "  syntax error here(\n",
])
def test_broken_solutions_fail(problems, completion):
    result = he.check_completion({**problems["HumanEval/2"], "task_id": "HumanEval/2"}, completion)
    assert result.status == he.FAILED and not result.passed


def test_pass_at_1_is_the_pass_rate(problems):
    tasks = SUBSET[:4]
    completions = {t: problems[t]["canonical_solution"] for t in tasks}
    completions[tasks[1]] = "    return None\n"
    result = he.evaluate(problems, completions)
    assert [r.passed for r in result.results] == [True, False, True, True]
    assert result.pass_at_1 == 0.75 and result.n_passed == 3


def test_infinite_loop_times_out(problems):
    result = he.check_completion(problems["HumanEval/0"], "    while True:\n        pass\n",
                                 timeout=1.0)
    assert result.status == he.TIMEOUT and not result.passed


def test_sleeping_child_process_times_out_too():
    # posix.fork: the guard has taken os.fork and subprocess.Popen away
    status, _ = he.run_program("import posix, time\n"
                               "pid = posix.fork()\n"
                               "if pid == 0:\n    time.sleep(60)\n"
                               "posix.waitpid(pid, 0)\n", timeout=1.0)
    assert status == he.TIMEOUT


def test_memory_limit_stops_a_runaway_allocation():
    status, detail = he.run_program("x = bytearray(2 * 1024 ** 3)\n", memory_mb=256)
    assert status == he.FAILED and "MemoryError" in detail
    assert he.run_program("x = bytearray(16 * 1024 ** 2)\n", memory_mb=256)[0] == he.PASSED


def test_runs_in_an_isolated_temporary_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    (tmp_path / "sitecustomize_marker.py").write_text("raise SystemExit(3)\n")
    prog = ("import os, posix, sys\n"  # the guard has taken os.getcwd away
            "assert posix.getcwd().split(os.sep)[-1].startswith('mdboost-humaneval-')\n"
            "assert sys.flags.isolated == 1\n"
            "import importlib.util\n"
            "assert importlib.util.find_spec('sitecustomize_marker') is None\n"
            "open('left_behind.txt', 'w').write('x')\n")
    assert he.run_program(prog) == (he.PASSED, "")
    assert not (tmp_path / "left_behind.txt").exists()


@pytest.mark.parametrize("kwargs, name", [({"timeout": 0}, "timeout"), ({"timeout": -1}, "timeout"),
                                          ({"memory_mb": 10}, "memory_mb"),
                                          ({"memory_mb": 1.5}, "memory_mb")])
def test_bad_limits_raise(kwargs, name):
    with pytest.raises(ValueError, match=name):
        he.run_program("pass\n", **kwargs)


def test_bad_inputs_raise(problems):
    with pytest.raises(ValueError, match="completions"):
        he.evaluate(problems, {})
    with pytest.raises(ValueError, match="HumanEval/999"):
        he.evaluate(problems, {"HumanEval/999": "    pass\n"})
    with pytest.raises(ValueError, match="entry_point"):
        he.program_parts({"prompt": "", "test": ""}, "pass")
    with pytest.raises(ValueError, match="completion"):
        he.program_parts(problems["HumanEval/0"], None)


def test_parts_are_the_harness_program_split_at_the_completion(problems):
    p = problems["HumanEval/0"]
    program, trusted = he.program_parts(p, p["canonical_solution"])
    assert program == p["prompt"] + p["canonical_solution"] + "\n"  # all the program process runs
    assert trusted == {"prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"]}


def test_the_test_may_name_the_entry_point_itself(problems):
    # HumanEval/33's test calls sort_third by name: the completion's function, not the prompt's stub
    p = problems["HumanEval/33"]
    assert he.check_completion(p, p["canonical_solution"]).passed
    assert not he.check_completion(p, "    return l\n").passed


def _brute_pass_at_k(outcomes, k):
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_enumeration_of_subsets():
    rng = random.Random(0)
    for _ in range(30):
        n = rng.randint(1, 9)
        outcomes = [rng.random() < 0.4 for _ in range(n)]
        for k in range(1, n + 1):
            assert he.pass_at_k(n, sum(outcomes), k) == pytest.approx(_brute_pass_at_k(outcomes, k))
    assert he.mean_pass_at_k([[True, False], [False, False]], 1) == pytest.approx(0.25)


@pytest.mark.parametrize("n, c, k", [(3, 4, 1), (3, 1, 0), (3, 1, 4), (-1, 0, 1), (3, 1.0, 1)])
def test_pass_at_k_rejects_bad_counts(n, c, k):
    with pytest.raises(ValueError):
        he.pass_at_k(n, c, k)
