"""block_verify and block_acceptance_law against Sun et al.'s Algorithm 2 enumerated on tiny vocabularies.

The reference below is written from the paper (Sun et al. 2024, "Block verification accelerates
speculative decoding", Algorithm 2), scalar and row by row, independently of
:mod:`mdboost.md.block`: every draft block of a vocabulary of 2-3 tokens is enumerated, with its
exact probability, for distributions that depend on the position only and for distributions
that depend on the whole prefix.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from mdboost.md.block import block_acceptance_estimate, block_acceptance_law, block_verify, joint_ratios
from mdboost.md.sampling import PLACEHOLDER_TOKEN_ID, draw_uniforms
from mdboost.md.verify import verify

T64 = dict(dtype=torch.float64)


def _tree(vocab, rng, prefix_dependent):
    """``dist(prefix) -> (p, q)``: Dirichlet rows per position, or per prefix when ``prefix_dependent``."""
    table = {}

    def dist(prefix):
        key = tuple(prefix) if prefix_dependent else len(prefix)
        if key not in table:
            table[key] = (rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab)))
        return table[key]

    return dist


def _greedy(dist):
    """The same tree with the drafter replaced by the one-hot of its argmax (greedy drafting)."""
    return lambda prefix: (np.eye(len(dist(prefix)[0]))[np.argmax(dist(prefix)[0])], dist(prefix)[1])


def _thresholds(dist, xs):
    """Algorithm 2's ratios ``p_0..p_K`` and tests ``h_1..h_K`` (1-based; ``h[0]`` unused) for a block ``xs``."""
    k = len(xs)
    r = [1.0]
    for i in range(k):
        p, q = dist(xs[:i])
        r.append(min(r[-1] * q[xs[i]] / p[xs[i]], 1.0))
    h = [1.0] * (k + 1)
    for i in range(1, k):
        p, q = dist(xs[:i])
        resid = np.maximum(r[i] * q - p, 0).sum()
        h[i] = resid / (resid + 1 - r[i]) if resid + 1 - r[i] > 0 else 1.0
    h[k] = r[k]
    return r, h


def _block_law(dist, vocab, k):
    """``({emitted tuple: probability}, [P(tau = t)])`` of one block-verification step, enumerated."""
    law, tau_law = defaultdict(float), np.zeros(k + 1)
    for xs in itertools.product(range(vocab), repeat=k):
        prob_x = math.prod(dist(xs[:i])[0][xs[i]] for i in range(k))
        if prob_x == 0:
            continue
        r, h = _thresholds(dist, xs)
        for tau in range(k + 1):
            p_tau = h[tau] * math.prod(1 - h[j] for j in range(tau + 1, k + 1)) if tau else \
                math.prod(1 - h[j] for j in range(1, k + 1))
            p, q = dist(xs[:tau])
            y_law = q if tau == k else np.maximum(r[tau] * q - p, 0)
            if tau < k and y_law.sum() <= 0:
                continue  # a rejection of probability zero
            y_law = y_law / y_law.sum()
            tau_law[tau] += prob_x * p_tau
            for y in range(vocab):
                law[xs[:tau] + (y,)] += prob_x * p_tau * y_law[y]
    return dict(law), tau_law


def _token_wise_law(dist, vocab, k):
    """The same for textbook token-wise rejection: accept on ``min(1, q/p)``, residual ``(q - p)_+``."""
    law, tau_law = defaultdict(float), np.zeros(k + 1)
    for xs in itertools.product(range(vocab), repeat=k):
        prob_x = math.prod(dist(xs[:i])[0][xs[i]] for i in range(k))
        if prob_x == 0:
            continue
        reach = 1.0
        for tau in range(k + 1):
            p, q = dist(xs[:tau])
            if tau == k:
                stop, y_law = reach, q
            else:
                acc = min(1.0, q[xs[tau]] / p[xs[tau]])
                stop, y_law = reach * (1 - acc), np.maximum(q - p, 0)
                if y_law.sum() > 0:
                    y_law = y_law / y_law.sum()
            tau_law[tau] += prob_x * stop
            for y in range(vocab):
                law[xs[:tau] + (y,)] += prob_x * stop * y_law[y]
            if tau < k:
                reach *= acc
    return dict(law), tau_law


def _target_prob(dist, w, start=0):
    return math.prod(dist(w[:n])[1][w[n]] for n in range(start, len(w)))


def _continued_law(law, dist, w):
    """P(the emitted tokens, continued by the target, read ``w``), ``len(w) = K + 1``."""
    return sum(law.get(w[:t + 1], 0.0) * _target_prob(dist, w, t + 1) for t in range(len(w)))


CASES = [(v, k, dep) for v in (2, 3) for k in (1, 2, 3) for dep in (False, True)]


@pytest.mark.parametrize("vocab,k,prefix_dependent", CASES)
def test_enumerated_block_step_is_lossless_and_beats_token_wise(vocab, k, prefix_dependent):
    dist = _tree(vocab, np.random.default_rng(100 * vocab + 10 * k + prefix_dependent), prefix_dependent)
    law, tau_law = _block_law(dist, vocab, k)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    for w in itertools.product(range(vocab), repeat=k + 1):  # (a) lossless
        assert _continued_law(law, dist, w) == pytest.approx(_target_prob(dist, w), abs=1e-12)
    _, tw_law = _token_wise_law(dist, vocab, k)
    mean, tw_mean = tau_law @ np.arange(k + 1), tw_law @ np.arange(k + 1)
    assert mean >= tw_mean - 1e-12  # (b) at least token-wise (Sun et al., Theorem 2)
    assert tau_law[-1] >= tw_law[-1] - 1e-12
    if not prefix_dependent:  # (b) the exact law of the accepted length
        p = torch.tensor(np.stack([dist(range(j))[0] for j in range(k)]), **T64)
        q = torch.tensor(np.stack([dist(range(j))[1] for j in range(k)]), **T64)
        tail = block_acceptance_law(p, q).numpy()  # P(tau >= j), j = 1..k
        np.testing.assert_allclose(tail, np.cumsum(tau_law[::-1])[::-1][1:], atol=1e-12)


def _rows(dist, vocab, k, batch, rng):
    """``batch`` draft blocks drawn from the drafter tree, with their per-position rows."""
    tokens = np.zeros((batch, k), dtype=np.int64)
    p = np.zeros((batch, k, vocab))
    q = np.zeros((batch, k + 1, vocab))
    for b in range(batch):
        for j in range(k + 1):
            p_j, q_j = dist(tuple(tokens[b, :j]))
            q[b, j] = q_j
            if j < k:
                p[b, j] = p_j
                tokens[b, j] = rng.choice(vocab, p=p_j)
    return torch.tensor(tokens), torch.tensor(p, **T64), torch.tensor(q, **T64)


def _emitted(res):
    return [tuple(t for t in row if t != PLACEHOLDER_TOKEN_ID) for row in res.tokens.tolist()]


def _chi2_against(samples, law, min_expected=5.0):
    """p-value of the samples' histogram against ``law`` (bins under ``min_expected`` merged)."""
    counts = defaultdict(int)
    for s in samples:
        counts[s] += 1
    assert set(counts) <= {key for key, v in law.items() if v > 0}, "emitted a sequence of probability 0"
    n = len(samples)
    keys = sorted(law, key=lambda key: -law[key])
    big = [key for key in keys if law[key] * n >= min_expected]
    obs = [counts[key] for key in big] + [n - sum(counts[key] for key in big)]
    exp = [law[key] * n for key in big] + [n * (1 - sum(law[key] for key in big))]
    if exp[-1] < min_expected:
        obs, exp = obs[:-1], exp[:-1]
        exp = list(np.array(exp) * sum(obs) / sum(exp))
    return chisquare(obs, exp).pvalue


@pytest.mark.parametrize("vocab,k,prefix_dependent", [(3, 3, False), (3, 3, True), (2, 2, True)])
def test_block_verify_follows_the_enumerated_law(vocab, k, prefix_dependent):
    rng = np.random.default_rng(7 + k)
    dist = _tree(vocab, rng, prefix_dependent)
    law, tau_law = _block_law(dist, vocab, k)
    tokens, p, q = _rows(dist, vocab, k, 20000, rng)
    res = block_verify(tokens, p, q, generator=torch.Generator().manual_seed(3))
    assert _chi2_against(_emitted(res), law) > 1e-3
    lengths = res.num_accepted.numpy()
    assert chisquare(np.bincount(lengths, minlength=k + 1), tau_law * len(lengths)).pvalue > 1e-3


def _reference_block(tokens, p, q, u):
    """Algorithm 2 row by row on given uniforms (``block_verify``'s order: K tests, then the draw)."""
    batch, k, _ = p.shape
    out = np.full((batch, k + 1), PLACEHOLDER_TOKEN_ID)
    for b in range(batch):
        rows = {i: (p[b, i], q[b, i]) for i in range(k)}
        rows[k] = (None, q[b, k])
        r, h = _thresholds(lambda prefix: rows[len(prefix)], tuple(tokens[b]))
        tau = max([i for i in range(1, k + 1) if u[b, i - 1] < h[i]], default=0)
        p_t, q_t = rows[tau]
        w = q_t if tau == k else np.maximum(r[tau] * q_t - p_t, 0)
        cdf = torch.cumsum(torch.tensor(w), 0)
        out[b, :tau] = tokens[b, :tau]
        out[b, tau] = int(torch.searchsorted(cdf, u[b, k] * cdf[-1], right=True))
    return out


def test_block_verify_equals_the_reference_on_the_same_uniforms():
    rng = np.random.default_rng(5)
    batch, k, vocab = 400, 4, 6
    p = torch.tensor(rng.dirichlet(np.ones(vocab) * 0.7, size=(batch, k)), **T64)
    q = torch.tensor(rng.dirichlet(np.ones(vocab) * 0.7, size=(batch, k + 1)), **T64)
    tokens = torch.multinomial(p.reshape(-1, vocab), 1, generator=torch.Generator().manual_seed(1)).reshape(batch, k)
    res = block_verify(tokens, p, q, generator=torch.Generator().manual_seed(9))
    u = draw_uniforms(batch, k, dtype=torch.float64, device="cpu", generator=torch.Generator().manual_seed(9))
    np.testing.assert_array_equal(res.tokens.numpy(), _reference_block(tokens.numpy(), p.numpy(), q.numpy(),
                                                                       u.numpy()))
    assert res.num_accepted.float().mean() > 1  # the test reaches deep prefixes
    assert res.accepted_by_budget.any()  # and recovers drafts token-wise rejection drops
    sd = verify(tokens, p, q, generator=torch.Generator().manual_seed(9))
    assert torch.equal(res.sd_acceptance, sd.sd_acceptance) and torch.equal(res.divergence, torch.zeros_like(sd.a))


@pytest.mark.parametrize("prefix_dependent", [False, True])
def test_greedy_drafts_give_token_wise_rejection_in_law(prefix_dependent):
    """One-hot drafts: the same law of (accepted length, emitted tokens) as token-wise rejection,
    not the same outcome for the same uniforms (docs/theory.md, section 5b)."""
    vocab, k = 3, 3
    rng = np.random.default_rng(11)
    dist = _greedy(_tree(vocab, rng, prefix_dependent))
    law, tau_law = _block_law(dist, vocab, k)
    tw_law, tw_tau = _token_wise_law(dist, vocab, k)
    assert set(law) <= set(tw_law)
    for key, value in tw_law.items():
        assert law.get(key, 0.0) == pytest.approx(value, abs=1e-12)
    np.testing.assert_allclose(tau_law, tw_tau, atol=1e-12)
    tokens, p, q = _rows(dist, vocab, k, 20000, rng)
    block = block_verify(tokens, p, q, generator=torch.Generator().manual_seed(4))
    token_wise = verify(tokens, p, q, generator=torch.Generator().manual_seed(4))
    assert _chi2_against(_emitted(block), tw_law) > 1e-3
    assert _chi2_against(_emitted(token_wise), tw_law) > 1e-3
    assert not torch.equal(block.num_accepted, token_wise.num_accepted)  # in law only


def test_greedy_drafts_law_is_the_product_of_target_probabilities():
    q_x = torch.tensor([[0.9, 0.5, 0.7, 0.2]], **T64)
    np.testing.assert_allclose(joint_ratios(torch.ones_like(q_x), q_x).numpy(), q_x.cumprod(-1).numpy(), atol=1e-15)
    rng = np.random.default_rng(2)
    q = torch.tensor(rng.dirichlet(np.ones(5), size=4), **T64)  # [K, S]
    p = torch.eye(5, **T64)[q.argmax(-1)]  # greedy: one-hot at the target's argmax here
    expected = torch.gather(q, -1, q.argmax(-1, keepdim=True)).squeeze(-1).cumprod(0)
    np.testing.assert_allclose(block_acceptance_law(p, q).numpy(), expected.numpy(), atol=1e-14)


def test_law_with_counts_equals_the_expanded_support_and_beats_token_wise():
    rng = np.random.default_rng(3)
    k = 4
    p_full = rng.dirichlet(np.ones(5), size=k)
    q_full = rng.dirichlet(np.ones(5), size=k)
    p_full[:, 4], q_full[:, 4] = p_full[:, 3], q_full[:, 3]  # two tokens with one pair of values
    for x in (p_full, q_full):
        x /= x.sum(-1, keepdims=True)
    counts = torch.tensor([1.0, 1.0, 1.0, 2.0, 0.0], **T64)
    full = block_acceptance_law(torch.tensor(p_full, **T64), torch.tensor(q_full, **T64))
    merged = block_acceptance_law(torch.tensor(p_full, **T64), torch.tensor(q_full, **T64), counts)
    np.testing.assert_allclose(merged.numpy(), full.numpy(), atol=1e-13)
    token_wise = np.cumprod(np.minimum(p_full, q_full).sum(-1))
    assert (full.numpy() >= token_wise - 1e-13).all() and full[-1] > token_wise[-1]
    assert full[0] == pytest.approx(token_wise[0], abs=1e-13)  # the first draft: 1 - TV either way


def test_monte_carlo_estimate_brackets_the_exact_law_and_batches():
    rng = np.random.default_rng(4)
    p = torch.tensor(rng.dirichlet(np.ones(6) * 0.5, size=(3, 5)), **T64)  # [N, K, S]
    q = torch.tensor(rng.dirichlet(np.ones(6) * 0.5, size=(3, 5)), **T64)
    exact = block_acceptance_law(p, q)
    mean, err = block_acceptance_estimate(p, q, num_samples=20000, generator=torch.Generator().manual_seed(0))
    assert mean.shape == err.shape == exact.shape == (3, 5)
    assert ((mean - exact).abs() <= 5 * err + 1e-12).all() and (err < 0.01).all()
    again, _ = block_acceptance_estimate(p, q, num_samples=20000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(mean, again)
    np.testing.assert_allclose(block_acceptance_law(p[1], q[1]).numpy(), exact[1].numpy(), atol=0)


def test_bad_input_names_the_argument():
    p = torch.full((1, 2, 3), 1 / 3, **T64)
    q = torch.full((1, 3, 3), 1 / 3, **T64)
    with pytest.raises(ValueError, match="target_probs must have shape"):
        block_verify(torch.zeros(1, 2, dtype=torch.long), p, q[:, :2])
    with pytest.raises(ValueError, match="draft_tokens"):
        block_verify(torch.full((1, 2), 3), p, q)
    zero = p.clone()
    zero[0, 0] = torch.tensor([0.0, 0.5, 0.5])
    with pytest.raises(ValueError, match="probability 0"):
        block_verify(torch.zeros(1, 2, dtype=torch.long), zero, q)
    with pytest.raises(ValueError, match="counts"):
        block_acceptance_law(p[0], p[0], torch.ones(2))
    with pytest.raises(ValueError, match=r"draft_probs \* counts"):
        block_acceptance_law(p[0], p[0], torch.full((3,), 2.0, **T64))
    with pytest.raises(ValueError, match="block_acceptance_estimate"):
        block_acceptance_law(torch.full((6, 5), 0.2, **T64).add(torch.linspace(-.1, .1, 5, **T64)),
                             torch.full((6, 5), 0.2, **T64), max_states=10)
    with pytest.raises(ValueError, match="num_samples"):
        block_acceptance_estimate(p[0], p[0], num_samples=0)


def test_joint_ratio_dominates_token_wise_draft_by_draft_and_rows_batch():
    """``r_j >= prod_{i<=j} min(1, q_i / p_i)`` for every draft (docs/theory.md, section 5b), and a
    list of generators makes a batched call equal row-by-row calls."""
    rng = np.random.default_rng(8)
    p_x = torch.tensor(rng.uniform(0.01, 1, size=(500, 6)), **T64)
    q_x = torch.tensor(rng.uniform(0, 1, size=(500, 6)), **T64)
    s = torch.clamp(q_x / p_x, max=1).cumprod(-1)
    assert (joint_ratios(p_x, q_x) >= s - 1e-15).all()
    batch, k, vocab = 5, 3, 4
    p = torch.tensor(rng.dirichlet(np.ones(vocab), size=(batch, k)), **T64)
    q = torch.tensor(rng.dirichlet(np.ones(vocab), size=(batch, k + 1)), **T64)
    tokens = torch.multinomial(p.reshape(-1, vocab), 1, generator=torch.Generator().manual_seed(0)).reshape(batch, k)
    together = block_verify(tokens, p, q, generator=[torch.Generator().manual_seed(i) for i in range(batch)])
    alone = [block_verify(tokens[i:i + 1], p[i:i + 1], q[i:i + 1], generator=[torch.Generator().manual_seed(i)])
             for i in range(batch)]
    assert torch.equal(together.tokens, torch.cat([r.tokens for r in alone]))
