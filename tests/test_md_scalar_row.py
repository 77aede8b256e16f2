"""One small CPU row searches in Python floats (``mdboost.md._scalar``): the same point as the array search.

``mdboost.md._search.primal_point`` takes the scalar search for ``N = 1`` rows (switch
``_search.SCALAR_ROW``); with the switch off the same row goes through the array search of the
namespace tests. Both must give the same excess mass ``m`` (so the same acceptance), the same
``D_f`` at the point, and keep ``D_f <= budget``, for every built-in generator with a scalar twin.
"""

import math

import pytest
import torch

from mdboost.md import _scalar, _search
from mdboost.md.breakpoints import Breakpoints
from mdboost.md.divergences import GENERATORS, alpha, resolve
from mdboost.md.solve import solve
from tests._md_pairs import dirichlet_pairs

BUDGETS = (0.0, 1e-9, 1e-4, 0.01, 0.1, 1.0, 10.0, math.inf)


def _both(monkeypatch, bp, budget, div):
    col = torch.tensor([[budget]], dtype=torch.float64)
    monkeypatch.setattr(_search, "SCALAR_ROW", True)
    fast = _search.primal_point(bp, col, div, False, with_value=True)
    monkeypatch.setattr(_search, "SCALAR_ROW", False)
    ref = _search.primal_point(bp, col, div, False, with_value=True)
    return fast, ref


@pytest.mark.parametrize("name", sorted(GENERATORS))
@pytest.mark.parametrize("n,peaked", [(2, False), (3, True), (50, False), (257, True), (2000, False)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_scalar_row_equals_array_search(monkeypatch, name, n, peaked, dtype):
    div = GENERATORS[name]
    assert _scalar.scalar_g(div) is not None
    p, q = dirichlet_pairs(3, n, n + len(name), alpha=0.05 if peaked else 0.7, equal_row=True)
    for i in range(3):
        bp = Breakpoints.build(p[i:i + 1].to(dtype), q[i:i + 1].to(dtype))
        for budget in BUDGETS:
            (a, b, m, value), (a0, b0, m0, value0) = _both(monkeypatch, bp, budget, div)
            torch.testing.assert_close(m, m0, atol=1e-11, rtol=0)  # the acceptance is 1 - m
            if 0 < budget < math.inf:
                assert float(value) <= budget * (1 + 1e-12)  # the kept side fits
            if float(value0) < 1e3:  # D_f of the extreme peaked rows is ill-conditioned in m
                torch.testing.assert_close(value, value0, atol=1e-9, rtol=1e-7)
            # (a, b) agree in mass: pi differs by less than the tolerance of m
            pi = torch.maximum((1 - b) * bp._q, torch.minimum(bp._ratio * bp._q, (1 + a) * bp._q))
            pi0 = torch.maximum((1 - b0) * bp._q, torch.minimum(bp._ratio * bp._q, (1 + a0) * bp._q))
            assert float(torch.nan_to_num(pi - pi0).abs().sum()) <= 1e-9


def test_scalar_generators_equal_the_torch_generators():
    z = [0.0, 1e-300, 1e-8, 0.3, 1.0, 1.7, 1e8, 1e300, math.inf]
    for name in sorted(GENERATORS):
        div = GENERATORS[name]
        g = _scalar.scalar_g(div)
        ref = div.g(torch.tensor(z, dtype=torch.float64)).tolist()
        for x, want in zip(z, ref):
            got = g(x)
            assert (got == want) or math.isclose(got, want, rel_tol=1e-14, abs_tol=1e-300), (name, x, got, want)


def test_generators_without_a_twin_take_the_array_search():
    assert _scalar.scalar_g(alpha(0.5)) is None
    assert _scalar.scalar_g(resolve(lambda z: (z - 1.0) ** 2)) is None


def test_single_row_solve_uses_the_scalar_search(monkeypatch):
    calls = []
    original = _scalar.primal_point
    monkeypatch.setattr(_scalar, "primal_point", lambda *a, **k: calls.append(1) or original(*a, **k))
    p, q = dirichlet_pairs(2, 100, 5, alpha=0.7)
    one = solve(p[0], q[0], max_divergence=0.05)
    assert calls == [1]
    batch = solve(p, q, max_divergence=0.05)  # two rows: the array search
    assert calls == [1]
    torch.testing.assert_close(one.acceptance, batch.acceptance[0], atol=1e-11, rtol=0)
    torch.testing.assert_close(one.achieved_divergence, batch.achieved_divergence[0], atol=1e-11, rtol=1e-9)
