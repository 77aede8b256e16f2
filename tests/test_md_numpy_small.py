"""The exact and bound primal give the same point in both array namespaces (numpy and torch).

The bracket and the in-segment refinement are written once over a namespace ``xp``
(``mdboost.md._xp``); :func:`mdboost.md._xp.namespace_for` picks numpy for CPU tensors without autograd and torch
otherwise. Both sides of that rule must give the same curve point, for every divergence, both
bracket searches (small and large vocabularies) and both dtypes.
"""

import pytest
import torch

from mdboost.md import _search
from mdboost.md._xp import NUMPY, TORCH, namespace_for
from mdboost.md.breakpoints import Breakpoints
from mdboost.md.divergences import GENERATORS
from tests._md_pairs import dirichlet_pairs


def _pairs(rows, n, seed, peaked=False):
    return dirichlet_pairs(rows, n, seed, alpha=0.05 if peaked else 0.7, equal_row=True)


def _point(bp, budget, div, bound, xp, bracket=None):
    """``(a, b, acceptance, D_f)`` at the primal solution found in namespace ``xp``."""
    m, seg, value = _search.primal(bp, budget.reshape(-1, 1).double(), div, bound, xp, with_value=True,
                                   bracket=bracket)
    a, b = bp.ab(m, seg, bp.arrays().tv)
    torch.testing.assert_close(value, bp.div_on(m, seg, div, bound), atol=1e-15, rtol=1e-14)
    return a, b, 1 - m, value


@pytest.mark.parametrize("bound", [False, True])
@pytest.mark.parametrize("name", sorted(GENERATORS))
@pytest.mark.parametrize("n,peaked,bracket", [(3, False, "small"), (257, False, "small"), (257, True, "small"),
                                              (1500, True, "small"), (257, True, "large")])
def test_numpy_namespace_equals_torch_namespace(name, n, peaked, bracket, bound):
    p, q = _pairs(6, n, n + len(name), peaked)
    bp = Breakpoints.build(p, q)
    budget = torch.tensor([0.0, 1e-4, 0.01, 0.1, 1.0, float("inf")], dtype=torch.float64)
    fast = _point(bp, budget, GENERATORS[name], bound, NUMPY, bracket)
    ref = _point(bp, budget, GENERATORS[name], bound, TORCH, bracket)
    for x, y in zip(fast, ref):
        assert isinstance(x, torch.Tensor) and x.dtype == torch.float64
        torch.testing.assert_close(x, y, atol=1e-12, rtol=0)
    col = budget.reshape(-1, 1)
    inner = (col > 0) & (col < float("inf"))  # budget 0 is pi = q, whatever the segment
    if not bound:  # exact D_f is continuous along the curve: the kept side fits on its segment
        assert bool((fast[3] <= col + 1e-12)[inner].all())


def test_float32_inputs_in_both_namespaces_respect_the_budget():
    p, q = _pairs(8, 300, 11)
    bp = Breakpoints.build(p.float(), q.float())
    budget = torch.linspace(0, 0.5, 8, dtype=torch.float64)
    fast = _point(bp, budget, GENERATORS["kl"], False, NUMPY)
    ref = _point(bp, budget, GENERATORS["kl"], False, TORCH)
    torch.testing.assert_close(fast[2], ref[2], atol=1e-12, rtol=0)
    achieved = bp.divergence_at(fast[2].reshape(-1).float(), "kl").double()
    assert bool((achieved <= budget + 1e-4).all())


def test_namespace_rule_covers_both_sides():
    assert namespace_for(torch.zeros(3)) is NUMPY  # CPU, no autograd
    assert namespace_for(torch.zeros(3, requires_grad=True)) is TORCH  # autograd needs torch ops
    assert namespace_for(torch.zeros(3, device="meta")) is TORCH  # any other device
