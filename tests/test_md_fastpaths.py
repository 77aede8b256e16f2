"""The primal's fast paths agree with their generic counterparts (no timing here).

- the KL prefix sums (one ``log``) equal the generic ``q_i g(r_i)`` sums;
- the large-vocabulary search (``searchsorted`` on B-breakpoints + secant refinement) and the
  small-vocabulary one (every breakpoint at once) return the same point.
"""

import math

import pytest
import torch

from mdboost.md import _search
from tests._md_pairs import dirichlet_pairs
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
def test_large_and_small_vocab_paths_agree(monkeypatch, name):
    p, q = _pairs(6, 3000, 5)
    budgets = torch.tensor([0.0, 1e-5, 1e-3, 0.05, 0.4, 50.0], dtype=torch.float64)
    out = {}
    for small_vocab in (0, 1 << 20):
        monkeypatch.setattr(_search, "SMALL_VOCAB", small_vocab)
        out[small_vocab] = Breakpoints.build(p, q).for_divergence(budgets, name)
    large, small = out[0], out[1 << 20]
    for x, y in zip(large, small):
        torch.testing.assert_close(x, y, atol=1e-11, rtol=0)
    assert torch.all(large.acceptance >= Breakpoints.build(p, q).sd_acceptance - 1e-15)
