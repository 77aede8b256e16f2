"""The primal's fast paths agree with their generic counterparts (no timing here).

- the KL prefix sums (one ``log``) equal the generic ``q_i g(r_i)`` sums;
- the large-vocabulary search (``searchsorted`` on B-breakpoints + secant refinement) and the
  small-vocabulary one (every breakpoint at once) return the same point.
"""

import math

import pytest
import torch

from tests._md_pairs import bracketed_point, dirichlet_pairs
from mdboost.md.breakpoints import Breakpoints
from mdboost.md.divergences import GENERATORS, Divergence


def _pairs(rows, n, seed, peaked=False):
    return dirichlet_pairs(rows, n, seed, alpha=0.05 if peaked else 0.5)


@pytest.mark.parametrize("peaked", [False, True])
def test_kl_fast_prefix_equals_generic(peaked):
    p, q = _pairs(4, 700, 3, peaked)
    bp = Breakpoints.build(p, q)
    generic = Divergence("kl-generic", lambda z: torch.xlogy(z, z), 1.0, math.inf)
    fast, slow = bp.prefix(GENERATORS["kl"]), bp.prefix(generic)
    assert fast.shape == slow.shape == (4, 701)
    torch.testing.assert_close(fast, slow, atol=1e-13, rtol=1e-10)


@pytest.mark.parametrize("name", ["kl", "hellinger", "rkl"])
def test_large_and_small_vocab_paths_agree(name):
    p, q = _pairs(6, 3000, 5)
    budgets = torch.tensor([0.0, 1e-5, 1e-3, 0.05, 0.4, 50.0], dtype=torch.float64)
    bp = Breakpoints.build(p, q)
    large, small = (bracketed_point(bp, budgets, name, bracket)[0] for bracket in ("large", "small"))
    for x, y, z in zip(large, small, bp.for_divergence(budgets, name)):
        torch.testing.assert_close(x, y, atol=1e-11, rtol=0)
        torch.testing.assert_close(z, y, atol=1e-11, rtol=0)
    assert torch.all(large.acceptance >= Breakpoints.build(p, q).sd_acceptance - 1e-15)
