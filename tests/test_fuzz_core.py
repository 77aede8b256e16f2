"""The seeded fuzz harness of the core (tests/_fuzz_core.py) in the fast suite: 0 of each kind.

A fixed seed and a time budget: the same cases on every run, at most ~30 s. The large run is
``bench/fuzz_core.py`` (counts in bench/RESULTS.md).
"""

import torch

from tests import _fuzz_core

SEED = 20250515
CASES_PER_DTYPE = 700
TIME_BUDGET_S = 30.0


def _summary(report, kind):
    return "\n".join(f"{api}: {desc if isinstance(desc, str) else ''} {msg}" for api, desc, msg in report.failures[kind][:10])


def test_fuzzed_inputs_keep_the_contract_in_float64_and_float32():
    report = _fuzz_core.run(SEED, CASES_PER_DTYPE, (torch.float64, torch.float32), time_budget=TIME_BUDGET_S)
    assert report.total >= 400, f"only {report.total} cases ran within {TIME_BUDGET_S} s"
    assert report.malformed >= 50 and len(report.cases) >= 10  # every API, valid and malformed calls
    for kind in _fuzz_core.KINDS:
        assert report.count(kind) == 0, f"{report.count(kind)} {kind}:\n{_summary(report, kind)}"


def test_the_harness_catches_a_contract_violation(monkeypatch):
    """The harness itself: a solver that returns NaN, or exceeds the budget, is counted."""
    import mdboost.md.solve as solve_module

    real = solve_module.solve

    def broken(*args, **kwargs):
        sol = real(*args, **kwargs)
        return type(sol)(sol.a, sol.b, sol.acceptance, sol.achieved_divergence + 1.0, sol.sd_acceptance)

    monkeypatch.setattr(_fuzz_core, "solve", broken)
    report = _fuzz_core.run(SEED, 40, (torch.float64,), malformed_share=0.0)
    assert report.count("violation") > 0
