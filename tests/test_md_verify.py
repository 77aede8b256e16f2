"""verify: emitted tokens follow pi(a, b), SD exactness, reproducibility, batching, top-k."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from mdboost.md.solve import mentored_distribution, solve
from mdboost.md.verify import PLACEHOLDER_TOKEN_ID, draw_uniforms, verify
from tests._sd_reference import reference_sd
from tests.test_md_reference import random_pair

T64 = dict(dtype=torch.float64)


def _pair(n, seed, **kw):
    p, q = random_pair(np.random.default_rng(seed), n, **kw)
    return torch.tensor(p, **T64), torch.tensor(q, **T64)


def _draft(p_rows, gen):  # [B, K, V] -> [B, K]
    b, k, v = p_rows.shape
    return torch.multinomial(p_rows.reshape(-1, v), 1, generator=gen).reshape(b, k)


def _first_tokens(p, q, budget, rows, seed, top_k=None, divergence="kl"):
    gen = torch.Generator().manual_seed(seed)
    dp = p.expand(rows, 1, -1).contiguous()
    tp = torch.stack([q, q]).expand(rows, 2, -1).contiguous()
    res = verify(_draft(dp, gen), dp, tp, max_divergence=budget, divergence=divergence, top_k=top_k, generator=gen)
    return res


def _chi2_pvalue(tokens, probs):
    probs = np.asarray(probs, float)
    counts = np.bincount(tokens, minlength=len(probs)).astype(float)
    support = probs > 0
    assert counts[~support].sum() == 0, "emitted a token outside the support"
    exp = probs[support] / probs[support].sum() * counts.sum()
    return chisquare(counts[support], exp).pvalue


@pytest.mark.parametrize("budget", [0.0, 0.05, 0.3])
def test_emitted_tokens_follow_mentored_distribution(budget):
    p, q = _pair(6, seed=1)
    rows = 20000
    res = _first_tokens(p, q, budget, rows, seed=2)
    sol = solve(p, q, max_divergence=budget)
    pi = mentored_distribution(p, q, sol.a, sol.b).numpy()
    if budget == 0.0:
        np.testing.assert_allclose(pi, q.numpy(), atol=0)
    assert _chi2_pvalue(res.tokens[:, 0].numpy(), pi) > 1e-3
    acc = float(sol.acceptance)
    realized = res.num_accepted.double().mean().item()
    assert abs(realized - acc) < 4.5 * np.sqrt(acc * (1 - acc) / rows)
    assert torch.allclose(res.acceptance_probability[:, 0], sol.acceptance.expand(rows))
    if budget > 0:
        assert res.accepted_by_budget.any()
        assert torch.all(res.divergence <= budget + 1e-9)
    else:
        assert not res.accepted_by_budget.any()


def test_deterministic_drafter_and_dual_budget():
    _, q = _pair(5, seed=4)
    p = torch.zeros(5, **T64)
    p[2] = 1.0
    rows = 20000
    gen = torch.Generator().manual_seed(0)
    dp = p.expand(rows, 1, 5).contiguous()
    tp = q.expand(rows, 2, 5).contiguous()
    target = float(q[2]) + 0.2
    res = verify(torch.full((rows, 1), 2), dp, tp, min_acceptance=target, generator=gen)
    sol = solve(p, q, min_acceptance=target)
    assert float(sol.acceptance) == pytest.approx(target, abs=1e-12)
    pi = mentored_distribution(p, q, sol.a, sol.b).numpy()
    assert _chi2_pvalue(res.tokens[:, 0].numpy(), pi) > 1e-3


def test_bonus_token_follows_target_when_all_accepted():
    p, _ = _pair(7, seed=5)
    _, bonus = _pair(7, seed=6)
    rows, k = 20000, 2
    gen = torch.Generator().manual_seed(3)
    dp = p.expand(rows, k, 7).contiguous()
    tp = torch.cat([dp, bonus.expand(rows, 1, 7)], dim=1).contiguous()  # q == p: always accept
    res = verify(_draft(dp, gen), dp, tp, max_divergence=0.1, generator=gen)
    assert torch.all(res.num_accepted == k)
    assert _chi2_pvalue(res.tokens[:, k].numpy(), bonus.numpy()) > 1e-3


def test_top_k_samples_the_masked_solution():
    p, q = _pair(30, seed=8)
    k = 6
    keep = torch.topk(q, k).indices
    qm = torch.zeros_like(q)
    qm[keep] = q[keep] / q[keep].sum()
    rows = 20000
    res = _first_tokens(p, q, 0.1, rows, seed=9, top_k=k)
    full = _first_tokens(p, qm, 0.1, 4, seed=9)
    sol = solve(p, qm, max_divergence=0.1)
    assert torch.allclose(res.acceptance_probability[:, 0], sol.acceptance.expand(rows), atol=1e-12)
    assert torch.allclose(res.a[:4], full.a, atol=1e-9) and torch.allclose(res.b[:4], full.b, atol=1e-9)
    pi = mentored_distribution(p, qm, sol.a, sol.b).numpy()
    assert _chi2_pvalue(res.tokens[:, 0].numpy(), pi) > 1e-3


@pytest.mark.parametrize("as_tensor", [False, True])
def test_zero_budget_is_exactly_speculative_decoding(as_tensor):
    batch, k, v = 64, 4, 12
    gen = torch.Generator().manual_seed(11)
    p = torch.softmax(torch.randn(batch, k, v, generator=gen, **T64), -1)
    q = torch.softmax(torch.randn(batch, k + 1, v, generator=gen, **T64) * 0.7, -1)
    tokens = _draft(p, gen)
    budget = torch.zeros(batch, **T64) if as_tensor else 0.0
    res = verify(tokens, p, q, max_divergence=budget, generator=torch.Generator().manual_seed(5))
    u = draw_uniforms(batch, k, dtype=torch.float64, device="cpu", generator=torch.Generator().manual_seed(5))
    ref = reference_sd(tokens.numpy(), p.numpy(), q.numpy(), u)
    np.testing.assert_array_equal(res.tokens.numpy(), ref)
    assert torch.all(res.a == 0) and torch.all(res.b == 0)


def test_seed_reproduces_and_batched_equals_row_by_row():
    batch, k, v = 6, 3, 20
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(batch, k, v, generator=gen), -1)
    q = torch.softmax(torch.randn(batch, k + 1, v, generator=gen), -1)
    tokens = _draft(p, gen)
    budgets = torch.tensor([0.0, 0.01, 0.1, 0.3, 1.0, 5.0])

    def gens():
        return [torch.Generator().manual_seed(100 + i) for i in range(batch)]

    first = verify(tokens, p, q, max_divergence=budgets, generator=gens(), top_k=8)
    again = verify(tokens, p, q, max_divergence=budgets, generator=gens(), top_k=8)
    assert torch.equal(first.tokens, again.tokens)
    rows = [
        verify(tokens[i : i + 1], p[i : i + 1], q[i : i + 1], max_divergence=budgets[i : i + 1], top_k=8,
               generator=[torch.Generator().manual_seed(100 + i)])
        for i in range(batch)
    ]
    assert torch.equal(first.tokens, torch.cat([r.tokens for r in rows]))
    assert torch.equal(first.num_accepted, torch.cat([r.num_accepted for r in rows]))
    one = verify(tokens, p, q, max_divergence=budgets, generator=torch.Generator().manual_seed(3))
    two = verify(tokens, p, q, max_divergence=budgets, generator=torch.Generator().manual_seed(3))
    assert torch.equal(one.tokens, two.tokens)


def test_output_layout_and_per_position_budgets():
    batch, k, v = 5, 4, 9
    gen = torch.Generator().manual_seed(2)
    p = torch.softmax(torch.randn(batch, k, v, generator=gen), -1)
    q = torch.softmax(torch.randn(batch, k + 1, v, generator=gen), -1)
    tokens = _draft(p, gen)
    budgets = torch.rand(batch, k, generator=gen) * 0.2
    res = verify(tokens, p, q, max_divergence=budgets, generator=gen)
    assert res.tokens.shape == (batch, k + 1) and res.tokens.dtype == torch.long
    for i in range(batch):
        n = int(res.num_accepted[i])
        assert torch.equal(res.tokens[i, :n], tokens[i, :n])
        assert 0 <= int(res.tokens[i, n]) < v
        assert torch.all(res.tokens[i, n + 1 :] == PLACEHOLDER_TOKEN_ID)
    sol = solve(p, q[:, :k], max_divergence=budgets)
    torch.testing.assert_close(res.acceptance_probability, sol.acceptance)
    assert torch.all(res.acceptance_probability >= res.sd_acceptance - 1e-6)


def test_zero_draft_tokens_gives_one_bonus_token():
    q = torch.softmax(torch.randn(3, 1, 5), -1)
    res = verify(torch.zeros(3, 0, dtype=torch.long), torch.zeros(3, 0, 5), q, generator=torch.Generator())
    assert res.tokens.shape == (3, 1) and torch.all(res.num_accepted == 0) and torch.all(res.tokens >= 0)
