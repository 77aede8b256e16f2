"""The numpy float64 path of the small-vocabulary exact primal (CPU) equals the torch path.

``_search.NUMPY_SMALL`` switches between them; both must give the same curve point (they do
the same search with a different bracketing order), for every divergence and dtype.
"""

import pytest
import torch

from mdboost.md import _search
from tests._md_pairs import dirichlet_pairs
from mdboost.md.breakpoints import Breakpoints
from mdboost.md.divergences import GENERATORS


def _pairs(rows, n, seed, peaked=False):
    return dirichlet_pairs(rows, n, seed, alpha=0.05 if peaked else 0.7, equal_row=True)


def _solve(monkeypatch, numpy_path, p, q, budget, div):
    monkeypatch.setattr(_search, "NUMPY_SMALL", numpy_path)
    return Breakpoints.build(p, q).for_divergence(budget, div)


@pytest.mark.parametrize("name", sorted(GENERATORS))
@pytest.mark.parametrize("n,peaked", [(3, False), (257, False), (257, True), (1500, True)])
def test_numpy_small_path_equals_torch_path(monkeypatch, name, n, peaked):
    p, q = _pairs(6, n, n + len(name), peaked)
    budget = torch.tensor([0.0, 1e-4, 0.01, 0.1, 1.0, float("inf")], dtype=torch.float64)
    fast = _solve(monkeypatch, True, p, q, budget, GENERATORS[name])
    ref = _solve(monkeypatch, False, p, q, budget, GENERATORS[name])
    for x, y in zip(fast, ref):
        torch.testing.assert_close(x, y, atol=1e-9, rtol=0)


def test_numpy_small_path_float32_and_budget_respected(monkeypatch):
    p, q = _pairs(8, 300, 11)
    p32, q32 = p.float(), q.float()
    budget = torch.linspace(0, 0.5, 8, dtype=torch.float32)
    fast = _solve(monkeypatch, True, p32, q32, budget, GENERATORS["kl"])
    ref = _solve(monkeypatch, False, p32, q32, budget, GENERATORS["kl"])
    assert fast.acceptance.dtype == torch.float32
    torch.testing.assert_close(fast.acceptance, ref.acceptance, atol=1e-6, rtol=0)
    bp = Breakpoints.build(p32, q32)
    achieved = bp.divergence_at(fast.acceptance.double(), "kl")
    assert bool((achieved <= budget.double() + 1e-4).all())
