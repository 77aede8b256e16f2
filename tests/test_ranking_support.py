"""Aligned support, quality and boosting of the ranking against direct full-vocabulary math."""

import numpy as np
import pytest
import torch

from mdboost.boosting.labels import LabelSets
from mdboost.boosting.margins import margin_bound
from mdboost.ranking import quality
from mdboost.ranking.boosting import (
    CachedLogitsHypothesis, ProposalHypothesis, boost_greedy, boost_target_first,
)
from mdboost.ranking.support import align, rows_from_logits, rows_from_proposals

V, N = 40, 30


@pytest.fixture
def logits():
    gen = torch.Generator().manual_seed(0)
    lq = torch.randn(N, V, generator=gen, dtype=torch.float64) * 2.5
    lp = lq + torch.randn(N, V, generator=gen, dtype=torch.float64) * 1.5
    true = torch.randint(0, V, (N,), generator=gen)
    return lp, lq, true


def _dense(aligned):
    return aligned.p_mass, aligned.q_mass


@pytest.mark.parametrize("k", [1, 5, 20])
def test_masses_are_distributions(logits, k):
    lp, lq, true = logits
    al = align(rows_from_logits(lp, true, k), rows_from_logits(lq, true, k), V)
    p, q = _dense(al)
    assert torch.allclose(p.sum(-1), torch.ones(N, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(q.sum(-1), torch.ones(N, dtype=torch.float64), atol=1e-12)
    assert ((al.count == 0) | (al.count == 1) | (torch.arange(al.count.shape[1]) == al.count.shape[1] - 1)).all()
    # the support covers exactly V tokens
    assert torch.allclose(al.count.sum(-1), torch.full((N,), float(V), dtype=torch.float64))


def test_kept_entries_and_tv_bound(logits):
    lp, lq, true = logits
    k = 8
    al = align(rows_from_logits(lp, true, k), rows_from_logits(lq, true, k), V)
    p_full, q_full = torch.softmax(lp, -1), torch.softmax(lq, -1)
    sd_true = torch.minimum(p_full, q_full).sum(-1)
    sd_approx = torch.minimum(al.p_mass, al.q_mass).sum(-1)
    tails = (1 - torch.topk(p_full, k).values.sum(-1)) + (1 - torch.topk(q_full, k).values.sum(-1))
    assert ((sd_true - sd_approx).abs() <= tails + 1e-12).all()
    # the target's kept ids carry their exact probabilities
    top = torch.topk(q_full, k)
    assert torch.allclose(al.q[:, :k], top.values)


def test_k_v_minus_one_is_exact(logits):
    lp, lq, true = logits
    al = align(rows_from_logits(lp, true, V - 1), rows_from_logits(lq, true, V - 1), V)
    p_full, q_full = torch.softmax(lp, -1), torch.softmax(lq, -1)
    assert torch.allclose(torch.minimum(al.p_mass, al.q_mass).sum(-1), torch.minimum(p_full, q_full).sum(-1))


def test_full_path_and_one_hot(logits):
    lp, lq, true = logits
    full = align(rows_from_logits(lp, true, 4, keep_full=True), rows_from_logits(lq, true, 4, keep_full=True), V)
    assert torch.allclose(full.p_mass, torch.softmax(lp, -1)) and full.p.shape == (N, V)
    props = torch.where(torch.arange(N) % 3 == 0, -1, torch.arange(N) % V)
    d = rows_from_proposals(props, true)
    al = align(d, rows_from_logits(lq, true, 6), V)
    q_full = torch.softmax(lq, -1)
    ok = props >= 0
    # SD acceptance of a one-hot drafter is q_x (kept or the uniform tail level)
    acc = torch.minimum(al.p_mass, al.q_mass).sum(-1)[ok]
    q_x = q_full[ok, props[ok]]
    in_top = (torch.topk(q_full, 6).indices[ok] == props[ok, None]).any(-1)
    assert torch.allclose(acc[in_top], q_x[in_top])
    assert torch.allclose(al.p_mass[ok].sum(-1), torch.ones(int(ok.sum()), dtype=torch.float64))


def _direct_boost(hq, hp, true, rounds):
    """Target-first self-normalized boosting straight from the dense coding."""
    y = LabelSets(n_classes=V, index=true.numpy()).coding()
    gs = [np.einsum("ij,ij->i", y, h) for h in (hq, hp)]
    w = np.full(N, 1 / N)
    edges, coefs = [], [0.0, 0.0]
    for t in range(rounds):
        g = gs[t % 2]
        hs = np.abs(g).max()
        u = g / hs
        mu = w @ u
        edges.append(mu)
        coefs[t % 2] += np.log((1 + mu) / (1 - mu)) / (2 * hs)
        w = w * (1 - mu * u) / (1 - mu * mu)
    return edges, coefs


@pytest.mark.parametrize("rounds", [2, 3])
def test_target_first_boosting_matches_dense_math(logits, rounds):
    lp, lq, true = logits
    hq = CachedLogitsHypothesis(true, lq[torch.arange(N), true], lq.sum(-1), V, full_logits=lq, name="q")
    hp = CachedLogitsHypothesis(true, lp[torch.arange(N), true], lp.sum(-1), V, full_logits=lp, name="p")
    res = boost_target_first(hq, hp, np.arange(N), true.numpy(), n_rounds=rounds, thetas=[0.0, 0.2])
    edges, coefs = _direct_boost(lq.numpy(), lp.numpy(), true, rounds)
    assert np.allclose(res.edges, edges) and res.mu_target == pytest.approx(edges[0])
    assert res.advantage == pytest.approx(edges[0] ** 2 + edges[1] ** 2)
    assert res.c_target == pytest.approx(coefs[0]) and res.c_drafter == pytest.approx(coefs[1])
    assert res.bound[0.0] == pytest.approx(margin_bound(edges, 0.0))
    for t in (0.0, 0.2):
        assert res.risk[t] <= res.bound[t] + 1e-12
    assert np.all(np.abs(res.margins) <= 1 + 1e-12)


def test_greedy_estimator_agrees_when_target_leads(logits):
    lp, lq, true = logits
    # make the target the better scorer: sharpen it on the true token
    lq = lq.clone()
    lq[torch.arange(N), true] += 4.0
    hq = CachedLogitsHypothesis(true, lq[torch.arange(N), true], lq.sum(-1), V, topk_ids=torch.topk(lq, 5).indices,
                                topk_logits=torch.topk(lq, 5).values)
    hp = CachedLogitsHypothesis(true, lp[torch.arange(N), true], lp.sum(-1), V)
    first = boost_target_first(hq, hp, np.arange(N), true.numpy(), n_rounds=2)
    greedy = boost_greedy(hq, hp, np.arange(N), true.numpy(), n_estimators=1)
    assert greedy["greedy_first"] == "target"
    assert greedy["greedy_advantage"] == pytest.approx(first.mu_target ** 2)
    # decision_function keeps the row sums and the kept logits
    dec = hq.decision_function(np.arange(N).reshape(-1, 1))
    assert np.allclose(dec.sum(1), lq.sum(-1).numpy())


def test_proposal_hypothesis_label_scores(logits):
    _, _, true = logits
    props = np.where(np.arange(N) % 2 == 0, true.numpy(), -1)
    props[1] = (true[1].item() + 1) % V
    h = ProposalHypothesis(props, V)
    X = np.arange(N).reshape(-1, 1)
    dense = LabelSets(n_classes=V, index=true.numpy()).scores(h.decision_function(X))
    assert np.allclose(h.label_scores(X, true.numpy()), dense)


def test_label_scores_reject_other_labels(logits):
    lp, lq, true = logits
    h = CachedLogitsHypothesis(true, lq[torch.arange(N), true], lq.sum(-1), V)
    with pytest.raises(ValueError, match="cached true next tokens"):
        h.label_scores(np.arange(N).reshape(-1, 1), (true.numpy() + 1) % V)


def test_quality_against_full_distributions(logits):
    lp, lq, true = logits
    d_full, t_full = rows_from_logits(lp, true, 5, keep_full=True), rows_from_logits(lq, true, 5, keep_full=True)
    idx = torch.arange(N)
    p_full, q_full = torch.softmax(lp, -1), torch.softmax(lq, -1)
    assert torch.allclose(quality.nll(t_full), -q_full[idx, true].log())
    a, b = torch.full((N,), 0.3, dtype=torch.float64), torch.full((N,), 0.2, dtype=torch.float64)
    pi = torch.maximum(0.8 * q_full, torch.minimum(p_full, 1.3 * q_full))
    assert torch.allclose(quality.nll_mentored(d_full, t_full, a, b), -pi[idx, true].log())
    c1, c2 = 0.7, 0.4
    boosted = torch.log_softmax(c1 * lq + c2 * lp, -1)[idx, true]
    al = align(d_full, t_full, V)
    assert torch.allclose(quality.nll_boosted(al, d_full, t_full, c1, c2), -boosted)
    # top-k path: exact at k = V - 1, close at k = V / 2 (uniform-tail approximation)
    for k, tol in ((V - 1, 1e-9), (V // 2, 0.05)):
        d, t = rows_from_logits(lp, true, k), rows_from_logits(lq, true, k)
        approx = quality.nll_boosted(align(d, t, V, true), d, t, c1, c2)
        assert (approx + boosted).abs().max() < tol


def test_quality_one_hot_and_temperature(logits):
    lp, lq, true = logits
    props = torch.where(torch.arange(N) % 2 == 0, true, -1)
    d = rows_from_proposals(props, true)
    t = rows_from_logits(lq, true, 6, temperature=0.7, keep_full=True)
    q = torch.softmax(lq / 0.7, -1)
    idx = torch.arange(N)
    nll_pi = quality.nll_mentored(d, t, torch.full((N,), 0.5, dtype=torch.float64), torch.zeros(N, dtype=torch.float64))
    expect = torch.where(props >= 0, torch.clamp(1.5 * q[idx, true], max=1.0), q[idx, true])
    assert torch.allclose(nll_pi, -expect.log())
    c1, c2 = 0.9, 1.3
    boosted = torch.log_softmax(c1 * lq + c2 * torch.nn.functional.one_hot(props.clamp_min(0), V) * (props >= 0)[:, None], -1)
    got = quality.nll_boosted(align(d, t, V), d, t, c1, c2, temperature=0.7)
    assert torch.allclose(got, -boosted[idx, true])


def test_boosted_nll_nonnegative_when_true_token_in_tail(logits):
    """True tokens outside the kept sets take the tail level: the NLL stays >= 0 at any scale."""
    lp, lq, _ = logits
    true = torch.topk(lq, V, dim=-1).indices[:, -1]  # the target's least likely token
    d, t = rows_from_logits(lp, true, 3), rows_from_logits(lq, true, 3)
    al = align(d, t, V, true)
    outside = ~((t.ids == true[:, None]).any(-1) | (d.ids == true[:, None]).any(-1))
    assert outside.any()
    for c1, c2, s in ((0.5, 0.5, 1.0), (0.5, 0.5, 1e3), (1.0, 0.0, 50.0)):
        assert (quality.nll_boosted(al, d, t, c1, c2, scale=s) >= -1e-9).all()
    scale, best = quality.best_boosted_scale(al, d, t, 0.5, 0.5)
    assert best >= 0 and scale > 0
