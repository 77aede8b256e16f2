"""verify(mentored_probs=...): emitted tokens follow the given pi (chi-square), pi = q is SD exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mdboost.md.solve import acceptance_probability
from mdboost.md.tv_set import geometric_mixture, project_tv_optimal
from mdboost.md.verify import verify
from tests.test_md_verify import _chi2_pvalue, _draft, _pair

T64 = dict(dtype=torch.float64)


@pytest.mark.parametrize("budget", [0.05, 0.2])
def test_emitted_tokens_follow_the_given_distribution(budget):
    p, q = _pair(7, seed=21)
    pi = project_tv_optimal(p, q, budget, geometric_mixture(p, q, 1.0, 1.5))
    rows = 20000
    gen = torch.Generator().manual_seed(4)
    dp = p.expand(rows, 1, -1).contiguous()
    tp = torch.stack([q, q]).expand(rows, 2, -1).contiguous()
    res = verify(_draft(dp, gen), dp, tp, mentored_probs=pi.expand(rows, 1, -1), divergence="tv", generator=gen)
    assert _chi2_pvalue(res.tokens[:, 0].numpy(), pi.numpy()) > 1e-3
    acc = float(acceptance_probability(p, pi))
    assert acc == pytest.approx(min(1.0, float(torch.minimum(p, q).sum()) + budget), abs=1e-12)  # TV optimum
    realized = res.num_accepted.double().mean().item()
    assert abs(realized - acc) < 4.5 * np.sqrt(acc * (1 - acc) / rows)
    assert torch.allclose(res.acceptance_probability, torch.full((rows, 1), acc, **T64))
    assert torch.allclose(res.divergence, torch.full((rows, 1), budget, **T64), atol=1e-12)  # TV(pi, q) = D
    assert res.accepted_by_budget.any() and bool(res.a.isnan().all())


def test_second_position_and_bonus_follow_their_distributions():
    """Rows that accept position 0 emit position 1's pi; rows accepting both draw the bonus from q."""
    p, q = _pair(5, seed=3)
    rows = 30000
    gen = torch.Generator().manual_seed(8)
    dp = torch.stack([p, p]).expand(rows, 2, -1).contiguous()
    tp = torch.stack([q, q, q]).expand(rows, 3, -1).contiguous()
    pi = torch.stack([p, project_tv_optimal(p, q, 0.1, torch.ones(5, **T64))])  # position 0: pi = p, all accepted
    res = verify(_draft(dp, gen), dp, tp, mentored_probs=pi.expand(rows, 2, -1).contiguous(), generator=gen)
    assert bool((res.num_accepted >= 1).all())
    assert _chi2_pvalue(res.tokens[:, 1].numpy(), pi[1].numpy()) > 1e-3
    both = res.num_accepted == 2
    assert _chi2_pvalue(res.tokens[both, 2].numpy(), q.numpy()) > 1e-3


def test_target_as_mentored_probs_is_exactly_speculative_decoding():
    batch, k, v = 64, 4, 12
    gen = torch.Generator().manual_seed(11)
    p = torch.softmax(torch.randn(batch, k, v, generator=gen, **T64), -1)
    q = torch.softmax(torch.randn(batch, k + 1, v, generator=gen, **T64) * 0.7, -1)
    tokens = _draft(p, gen)
    sd = verify(tokens, p, q, generator=torch.Generator().manual_seed(5))
    towards = verify(tokens, p, q, mentored_probs=q[:, :k], generator=torch.Generator().manual_seed(5))
    assert torch.equal(sd.tokens, towards.tokens) and torch.equal(sd.num_accepted, towards.num_accepted)
    assert torch.allclose(towards.acceptance_probability, sd.sd_acceptance)
    assert torch.allclose(towards.divergence, torch.zeros_like(towards.divergence))
    gens = [torch.Generator().manual_seed(i) for i in range(batch)]  # batched = row by row with a list
    batched = verify(tokens, p, q, mentored_probs=p, generator=gens)
    for i in range(0, batch, 16):
        row = verify(tokens[i:i + 1], p[i:i + 1], q[i:i + 1], mentored_probs=p[i:i + 1],
                     generator=[torch.Generator().manual_seed(i)])
        assert torch.equal(row.tokens[0], batched.tokens[i])
    assert bool((batched.num_accepted == k).all())  # pi = p accepts everything


def test_bad_mentored_probs_are_reported():
    p, q = _pair(4, seed=1)
    dp, tp, tok = p.expand(2, 1, 4), q.expand(2, 2, 4), torch.zeros(2, 1, dtype=torch.long)
    with pytest.raises(ValueError, match="mentored_probs must have shape"):
        verify(tok, dp, tp, mentored_probs=p.expand(2, 2, 4))
    with pytest.raises(ValueError, match="mentored_probs"):
        verify(tok, dp, tp, mentored_probs=torch.full((2, 1, 4), 0.5, **T64))
    with pytest.raises(ValueError, match="give no budget"):
        verify(tok, dp, tp, mentored_probs=dp, max_divergence=0.1)
    with pytest.raises(ValueError, match="top_k"):
        verify(tok, dp, tp, mentored_probs=dp, top_k=2)
