"""Deterministic-drafter closed form and lazy verification (``solve="reached"/"needed"``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mdboost.md.breakpoints import Breakpoints
from mdboost.md.divergences import f_divergence, resolve
from mdboost.md.onehot import one_hot_dual, one_hot_primal
from mdboost.md.solve import mentored_distribution, solve
from mdboost.md.verify import verify

T64 = dict(dtype=torch.float64)
DIVS = ["kl", "rkl", "tv", "hellinger", "pearson", "js", "alpha:1.5"]


def _one_hot_rows(n, vocab, seed):
    """Random targets and one-hot drafters, with edge rows q_x = 0 (row 0) and q_x = 1 (row 1)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(n, vocab, generator=gen, **T64) * 2, -1)
    x = torch.randint(0, vocab, (n,), generator=gen)
    q[0, x[0]] = 0.0
    q[0] /= q[0].sum()
    q[1] = 0.0
    q[1, x[1]] = 1.0
    p = torch.nn.functional.one_hot(x, vocab).to(torch.float64)
    return p, q, x


@pytest.mark.parametrize("name", DIVS)
def test_one_hot_primal_matches_breakpoints_and_brute_force(name):
    p, q, x = _one_hot_rows(24, 9, seed=1)
    budgets = torch.tensor([0.0, 1e-4, 0.01, 0.05, 0.2, 1.0, 5.0, math.inf], **T64).repeat(3)
    div = resolve(name)
    sx = q.gather(1, x[:, None]).squeeze(1)
    got = one_hot_primal(sx, budgets, div)
    ref = Breakpoints.build(p, q).for_divergence(budgets, div)
    torch.testing.assert_close(got.acceptance, ref.acceptance, atol=1e-9, rtol=0)
    pi = mentored_distribution(p, q, got.a, got.b)
    torch.testing.assert_close(pi.sum(-1), torch.ones(24, **T64), atol=1e-12, rtol=0)
    direct = f_divergence(pi, q, div)
    assert torch.all(direct <= budgets + 1e-9)
    torch.testing.assert_close(got.divergence, direct, atol=1e-9, rtol=1e-9)
    assert got.acceptance[0] == 0 and got.acceptance[1] == 1  # q_x = 0: never; q_x = 1: always


def test_one_hot_tv_oracle_and_dual():
    p, q, x = _one_hot_rows(16, 7, seed=2)
    sx = q.gather(1, x[:, None]).squeeze(1)
    budget = torch.full((16,), 0.1, **T64)
    got = one_hot_primal(sx, budget, resolve("tv"))
    expected = torch.where(sx > 0, torch.clamp(sx + 0.1, max=1.0), torch.zeros_like(sx))  # 1 - TV + D
    torch.testing.assert_close(got.acceptance, expected, atol=1e-12, rtol=0)
    floor = torch.linspace(0, 1, 16, **T64)
    dual = one_hot_dual(sx, floor, resolve("kl"))
    ref = solve(p, q, min_acceptance=floor)
    torch.testing.assert_close(dual.acceptance, ref.acceptance, atol=1e-12, rtol=0)
    torch.testing.assert_close(dual.a, ref.a, atol=1e-9, rtol=0)


def _batch(batch, k, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(batch, k + 1, vocab, generator=gen, **T64), -1)
    p = torch.softmax(torch.log(q[:, :k]) + torch.randn(batch, k, vocab, generator=gen, **T64), -1)
    tokens = torch.multinomial(p.reshape(-1, vocab), 1, generator=gen).reshape(batch, k)
    return tokens, p, q


@pytest.mark.parametrize("vocab", [30, 4096])  # small rows: one call for every candidate; large: two rounds
@pytest.mark.parametrize("mode", ["reached", "needed"])
@pytest.mark.parametrize("dual", [False, True])
def test_lazy_solving_emits_the_same_tokens(mode, dual, vocab):
    tokens, p, q = _batch(48, 4, vocab, seed=3)
    kw = dict(min_acceptance=0.8) if dual else dict(max_divergence=torch.linspace(0.01, 0.5, 48, **T64))
    eager = verify(tokens, p, q, generator=torch.Generator().manual_seed(9), **kw)
    lazy = verify(tokens, p, q, generator=torch.Generator().manual_seed(9), solve=mode, **kw)
    assert torch.equal(eager.tokens, lazy.tokens) and torch.equal(eager.num_accepted, lazy.num_accepted)
    assert torch.equal(eager.accepted_by_budget, lazy.accepted_by_budget)
    solved = ~torch.isnan(lazy.a)
    reached = torch.arange(4) <= eager.num_accepted.clamp(max=3).unsqueeze(-1)
    if mode == "reached":
        assert torch.equal(solved, reached)
    else:
        assert torch.all(solved <= reached) and solved.sum() < reached.sum()
        rejected = reached & (torch.arange(4) == eager.num_accepted.unsqueeze(-1))
        assert torch.all(solved[rejected])  # every rejection was decided with the clamp
    for name in ("a", "b", "acceptance_probability", "divergence"):
        torch.testing.assert_close(getattr(lazy, name)[solved], getattr(eager, name)[solved], atol=1e-9, rtol=0)


def test_one_hot_drafts_in_verify_match_the_generic_solve():
    _, _, q = _batch(64, 3, 12, seed=4)
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 12, (64, 3), generator=gen)
    p = torch.nn.functional.one_hot(tokens, 12).to(torch.float64)
    budget = torch.linspace(0.0, 0.6, 64, **T64)
    res = verify(tokens, p, q, max_divergence=budget, generator=torch.Generator().manual_seed(1))
    ref = solve(p, q[:, :3], max_divergence=budget[:, None])
    torch.testing.assert_close(res.acceptance_probability, ref.acceptance, atol=1e-9, rtol=0)
    torch.testing.assert_close(res.divergence, ref.achieved_divergence, atol=1e-9, rtol=1e-9)
    assert np.all(res.divergence.numpy() <= budget[:, None].numpy() + 1e-9)


def test_verify_rejects_an_unknown_solve_mode():
    tokens, p, q = _batch(2, 2, 5, seed=6)
    with pytest.raises(ValueError, match="solve"):
        verify(tokens, p, q, max_divergence=0.1, solve="lazy")


@pytest.mark.parametrize("vocab", [40, 3000])  # the numpy small-vocabulary search, the torch one
@pytest.mark.parametrize("name", ["kl", "hellinger", "rkl"])
def test_divergence_with_value_equals_a_direct_computation(name, vocab):
    """The search's value at the solution equals a direct D_f of the clamp."""
    gen = torch.Generator().manual_seed(7)
    q = torch.softmax(torch.randn(6, vocab, generator=gen, **T64) * 2, -1)
    p = torch.softmax(torch.log(q) + torch.randn(6, vocab, generator=gen, **T64), -1)
    budgets = torch.tensor([0.0, 0.001, 0.05, 0.3, 2.0, math.inf], **T64)
    point, value = Breakpoints.build(p, q).for_divergence_with_value(budgets, name)
    direct = f_divergence(mentored_distribution(p, q, point.a, point.b), q, name)
    torch.testing.assert_close(value, direct, atol=1e-9, rtol=1e-9)
    assert value[0] == 0 and torch.all(value <= budgets + 1e-9)
