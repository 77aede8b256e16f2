"""The draft-start process (mdboost.ranking.process): exact against an exhaustive enumeration of
accept/reject outcomes, the i.i.d. closed form on long sequences, a Monte Carlo of the engine's
loop on real token draws, and the ranking columns it feeds on a tiny target-sampled cache."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch

from mdboost.ranking.chains import budget_tilt, chain_from_positions, chain_from_proposals, conditional_acceptance
from mdboost.ranking.layout import gather_rows, padded_index
from mdboost.ranking.process import run_process
from mdboost.ranking.speed import SpeedProfile, process_speedup, walltime_speedup


def _loop(outcome, length, gamma, offered):
    """The engine's loop on a fixed outcome table ``outcome[s][i]`` (draft i of a step at s accepted)."""
    s, starts, visits, accepted, hist = 0, [], [], 0, {}
    while s < length:
        k = min(gamma, offered[s], length - s - 1)
        starts.append((s, k))
        hist[k] = hist.get(k, 0) + 1
        n = 0
        while n < k and outcome[s][n]:
            n += 1
        visits += [s + i for i in range(min(n + 1, k))]
        accepted += n
        s += n + 1
    return starts, visits, accepted, hist


def _enumerate(chain, gamma, offered, length):
    """Exact expectations by summing over every outcome table (2^(length * width) of them)."""
    width = chain.shape[1]
    start, visit = np.zeros(length), np.zeros(length)
    acc, hist, first = 0.0, np.zeros(width + 1), 0.0
    for bits in itertools.product((0, 1), repeat=length * width):
        table = np.array(bits).reshape(length, width)
        prob = float(np.prod(np.where(table == 1, chain[:length], 1 - chain[:length])))
        if prob == 0:
            continue
        starts, visits, accepted, h = _loop(table, length, gamma, offered)
        for s, k in starts:
            start[s] += prob
            first += prob * (k > 0) * chain[s, 0]
        for t in visits:
            visit[t] += prob
        acc += prob * accepted
        for k, c in h.items():
            hist[k] += prob * c
    return start, visit, acc, hist, first


@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_process_equals_exhaustive_enumeration(gamma):
    gen = torch.Generator().manual_seed(gamma)
    length, width = 5, 3
    chain = torch.rand(3, length + 1, width, generator=gen, dtype=torch.float64)
    chain[0, 2, 0] = 1.0  # certain accept and certain reject entries
    chain[1, 1, 1] = 0.0
    offered = torch.randint(0, width + 1, (3, length + 1), generator=gen)
    offered[2] = width  # a model drafter: always offers
    lengths = torch.tensor([length, length - 1, length])
    res = run_process(chain, gamma, draft_len=offered, lengths=lengths)
    for b in range(3):
        n = int(lengths[b])
        start, visit, acc, hist, first = _enumerate(chain[b].numpy(), gamma, offered[b].tolist(), n)
        np.testing.assert_allclose(res.start_prob[b, :n].numpy(), start, atol=1e-12)
        assert float(res.start_prob[b, n:].abs().sum()) == 0.0
        np.testing.assert_allclose(res.visit_prob[b, :n].numpy(), visit, atol=1e-12)
        assert float(res.accepted[b]) == pytest.approx(acc, abs=1e-12)
        np.testing.assert_allclose(res.steps_by_draft_len[b, :width + 1].numpy(), hist, atol=1e-12)
        num, _ = res.position0(chain[b:b + 1, :, 0].expand(3, -1))
        assert float(num[b]) == pytest.approx(first, abs=1e-12)
        # every path ends exactly at the last token: tokens = steps + accepted
        assert float(res.steps[b] + res.accepted[b]) == pytest.approx(n, abs=1e-12)


def test_constant_acceptance_matches_the_iid_closed_form():
    a, g, length = 0.7, 4, 20000
    chain = torch.full((1, length, g), a, dtype=torch.float64)
    res = run_process(chain, g)
    closed = (1 - a ** (g + 1)) / (1 - a)
    mean_len = 1 + float(res.accepted / res.drafted_steps)
    assert mean_len == pytest.approx(closed, rel=1e-3)
    assert length / float(res.steps) == pytest.approx(closed, rel=1e-3)
    num, den = res.position0(chain[..., 0])
    assert float(num / den) == pytest.approx(a, abs=1e-12)
    # the process speedup tends to the i.i.d. speed model (v = 1, s = 0)
    speed = process_speedup(length, res.draft_tokens, res.steps_by_draft_len, 0.1)
    assert float(speed) == pytest.approx(float(walltime_speedup(a, g, 0.1)), rel=1e-3)


def test_monte_carlo_of_the_loop_agrees():
    gen = torch.Generator().manual_seed(7)
    length, gamma = 12, 3
    c = torch.rand(1, length, generator=gen, dtype=torch.float64)
    chain = chain_from_positions(c, gamma)
    res = run_process(chain, gamma)
    rng = np.random.default_rng(0)
    draws = 20000
    counts, first_acc, first_n = np.zeros(length), 0, 0
    for _ in range(draws):
        table = rng.random((length, gamma)) < chain[0].numpy()
        starts, *_ = _loop(table, length, gamma, [gamma] * length)
        for s, k in starts:
            counts[s] += 1
            if k:
                first_n += 1
                first_acc += table[s, 0]
    np.testing.assert_allclose(counts / draws, res.start_prob[0].numpy(), atol=0.015)
    num, den = res.position0(c)
    assert first_acc / first_n == pytest.approx(float(num / den), abs=0.01)


def test_draft_starts_are_biased_towards_hard_positions():
    # alternating easy/hard regions: starts land after rejections, so the start-weighted
    # acceptance is below the plain mean (the bias the process corrects)
    c = torch.tensor([[0.95] * 8 + [0.1] * 8] * 1, dtype=torch.float64).repeat(1, 4)
    res = run_process(chain_from_positions(c, 4), 4)
    num, den = res.position0(c)
    assert float(num / den) < float(c.mean()) - 0.05


def test_chain_helpers():
    c = torch.tensor([[0.1, 0.2, 0.3]], dtype=torch.float64)
    assert chain_from_positions(c, 2).tolist() == [[[0.1, 0.2], [0.2, 0.3], [0.3, 0.0]]]
    tokens = torch.tensor([[5, 6, 7, 8]])
    props = torch.tensor([[[5, 6], [6, 9], [-1, -1], [8, 1]]])
    chain, offered = chain_from_proposals(props, tokens, 2)
    assert chain.tolist() == [[[1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [1.0, 0.0]]]
    assert offered.tolist() == [[2, 2, 0, 2]]
    index, lengths = padded_index(torch.tensor([0, 0, 0, 3, 3]))
    assert index.tolist() == [[0, 1, 2], [3, 4, -1]] and lengths.tolist() == [3, 2]
    assert gather_rows(torch.arange(5.0), index, -1.0).tolist() == [[0, 1, 2], [3, 4, -1]]
    with pytest.raises(ValueError, match="contiguous"):
        padded_index(torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match="chain"):
        run_process(torch.full((1, 3, 2), 1.5), 1)
    with pytest.raises(ValueError, match="width"):
        run_process(torch.full((1, 3, 2), 0.5), 3)


def test_conditional_acceptance_is_the_posterior_of_acceptance():
    """sum_x pi(x) c(x) = P_acc(pi) = sum_x min(p, pi), for SD (pi = q) and for an MD clamp."""
    from mdboost.md.solve import solve

    gen = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(4, 9, generator=gen, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(4, 9, generator=gen, dtype=torch.float64) * 2, -1)
    sol = solve(p, q, max_divergence=0.1, divergence="kl")
    for a, b in ((torch.zeros(4), torch.zeros(4)), (sol.a.double(), sol.b.double())):
        pi = torch.maximum((1 - b)[:, None] * q, torch.minimum(p, (1 + a)[:, None] * q))
        c = conditional_acceptance(p.log(), q.log(), a[:, None], b[:, None])  # [4, 9]
        assert torch.allclose((pi * c).sum(-1), torch.minimum(p, pi).sum(-1), atol=1e-10)
    assert torch.allclose(conditional_acceptance(p.log(), q.log()), torch.clamp(p / q, max=1.0))
    # one-hot drafter: accepted iff the emitted token is the proposal
    hit = conditional_acceptance(torch.tensor([0.0, -math.inf]), torch.tensor([-2.0, -1.0]), 0.3, 0.2)
    assert hit.tolist() == [1.0, 0.0]


def test_score_process_on_a_tiny_sampled_cache(tmp_path):
    """score_pair with a layout: process columns equal a per-sequence re-computation."""
    from mdboost.cache import open_or_build_cache
    from mdboost.ranking.layout import sequence_layout
    from mdboost.ranking.rank import PairRows, score_pair
    from mdboost.ranking.rows import MemberLoader, acceptance_rows
    from tests.test_rank_pipeline_sampled import _config

    cfg = _config(tmp_path, tracking={"enabled": False}, md={"divergences": ["kl"], "budgets": [0.0, 0.3]},
                  speed={"md_solve": "reached"})
    pc, _ = open_or_build_cache(cfg.cache_spec())
    loader = MemberLoader(pc.acceptance, cfg.md.sampling_temperatures[0])
    profile = SpeedProfile(tuple(1.0 + 0.2 * g for g in range(cfg.speed.gamma_max + 1)), 0.3, 0.05)
    for drafter in ("early_exit:2", "ngram:2"):
        rows = acceptance_rows(loader, pc, drafter, "tiny")
        # a drafter prefill as a private-cache drafter would have (these two have none)
        draft, target, labels = dataclasses.replace(rows.draft, prefill_per_token=0.02), rows.target, rows.labels
        layout = sequence_layout(pc.acceptance.caches[drafter], drafter)
        cache = pc.acceptance.caches[drafter]
        assert layout.prompt_lengths.tolist() == [cache.sequence(int(i))[1] for i in torch.unique(layout.sequence)]
        if drafter.startswith("ngram"):  # gamma_max > the cached lookahead: drafts recomputed, prefix kept
            cached = pc.acceptance.caches[drafter].ngram_proposals(drafter)
            assert cfg.speed.gamma_max > cached.shape[1]
            assert torch.equal(layout.proposals(cfg.speed.gamma_max)[:, :cached.shape[1]], cached)
        pair, settings = PairRows(draft, target, labels), cfg.score_settings()
        res = score_pair(pair, pc.vocab_size, settings=settings, acceptance=PairRows(draft, target, labels, layout=layout),
                         speed_profile=profile)
        plain = score_pair(pair, pc.vocab_size, settings=settings, acceptance=PairRows(draft, target, labels),
                           speed_profile=profile)
        for row, old in zip(res.rows, plain.rows):
            assert row["md_acceptance"] == old["md_acceptance"] and row["predicted_speedup_iid"] == old["predicted_speedup"]
            assert "engine_acceptance" not in old and old["best_gamma_iid"] == old["best_gamma"]
            assert 0 <= row["engine_acceptance"] <= 1 and 1 <= row["engine_mean_accepted_length"] <= row["gamma"] + 1
            _check_row(row, draft, target, labels, layout, cfg, pc.vocab_size, profile, cache)


def _check_row(row, draft, target, labels, layout, cfg, vocab_size, profile, cache):
    """Recompute one row's process columns sequence by sequence (md_solve 'reached': solved = visits;
    each generation's prefill: ``beta (L - 1)`` for its prompt of ``L`` tokens, the target's in
    plain decoding and speculation alike, the drafter's in speculation only)."""
    from mdboost.ranking.acceptance import md_operating_points, sd_acceptance
    from mdboost.ranking.support import align

    aligned = align(draft.rows, target.rows, vocab_size, torch.as_tensor(labels))
    sd = sd_acceptance(aligned, draft.rows.valid)
    f = "kl" if row["divergence"] == "none" else row["divergence"]
    op = next(iter(md_operating_points(aligned, draft.rows.valid, [f], [row["max_divergence"]])))
    width = cfg.speed.gamma_max
    labels = torch.as_tensor(labels)
    c = conditional_acceptance(draft.rows.true_logp, target.rows.true_logp, op.a, op.b)
    delta = budget_tilt(aligned.p_mass, aligned.q_mass, op.a, op.b, op.acceptance)
    if float(row["max_divergence"]) == 0:
        assert float(delta.max()) < 1e-9  # SD: E_q[c] = P_acc, nothing to tilt
    stats = {}
    for g in range(cfg.speed.gamma_min, width + 1):
        tot = dict.fromkeys(("tokens", "steps", "drafted", "accepted", "num", "cond", "cost", "ar"), 0.0)
        for sid in torch.unique(layout.sequence):
            rows = (layout.sequence == sid).nonzero().squeeze(-1)
            if draft.rows.one_hot:
                props = layout.proposals(width)[rows]  # [n, W]
                raw, offered = chain_from_proposals(props[None], labels[rows][None], width)
                chain = raw.clone()
                for s0 in range(rows.numel()):  # the tilt applies where the draft is the position's own proposal
                    for i in range(width):
                        if s0 + i < rows.numel() and props[s0, i] >= 0 and props[s0, i] == props[s0 + i, 0]:
                            chain[0, s0, i] = raw[0, s0, i] + (1 - raw[0, s0, i]) * delta[rows[s0 + i]]
            else:
                raw, offered = chain_from_positions(c[rows][None], width), None
                chain = chain_from_positions((c + (1 - c) * delta)[rows][None], width)
            res = run_process(chain, g, draft_len=offered)
            num, den = res.position0(op.acceptance[rows][None])
            tot["num"] += float(num)
            tot["cond"] += float(res.position0(raw[..., 0])[0])
            tot["tokens"] += rows.numel()
            tot["steps"] += float(res.steps)
            tot["drafted"] += float(den)
            tot["accepted"] += float(res.accepted)
            v = torch.tensor(profile.verify_cost, dtype=torch.float64)[res.draft_len]  # [1, L]
            s = profile.md_overhead if float(row["max_divergence"]) > 0 else 0.0
            fed = cache.sequence(int(sid))[1] - 1
            tot["cost"] += float(draft.cost_ratio * res.draft_tokens + (res.start_prob * v).sum() + s * res.visit_prob.sum())
            tot["cost"] += (profile.prefill_per_token + draft.prefill_per_token) * fed
            tot["ar"] += rows.numel() + profile.prefill_per_token * fed
        stats[g] = tot
    best = max(stats, key=lambda g: (stats[g]["ar"] / stats[g]["cost"], -g))
    t = stats[row["gamma"]]  # the row's own draft length
    assert row["best_gamma"] == best and row["is_best_gamma"] == (row["gamma"] == best)
    assert row["predicted_speedup"] == pytest.approx(t["ar"] / t["cost"], rel=1e-9)
    assert row["engine_acceptance"] == pytest.approx(t["num"] / t["drafted"], rel=1e-9)
    assert row["engine_acceptance_conditional"] == pytest.approx(t["cond"] / t["drafted"], rel=1e-9)
    assert row["engine_tokens_per_call"] == pytest.approx(t["tokens"] / t["steps"], rel=1e-9)
    assert row["engine_mean_accepted_length"] == pytest.approx(1 + t["accepted"] / t["drafted"], rel=1e-9)
    if float(row["max_divergence"]) == 0 and row["is_best_gamma"]:
        assert row["sd_engine_acceptance"] == pytest.approx(row["engine_acceptance"])
        assert torch.allclose(op.acceptance, sd)


def test_budget_tilt_restores_the_mean_acceptance_on_target_text():
    """With ``c~ = c + (1 - c) delta``: ``E_{x~q}[c~] = P_acc(pi)`` per position; SD: ``delta = 0``."""
    from mdboost.md.solve import solve

    gen = torch.Generator().manual_seed(5)
    p = torch.softmax(torch.randn(6, 11, generator=gen, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(6, 11, generator=gen, dtype=torch.float64) * 2, -1)
    p[0] = torch.nn.functional.one_hot(torch.tensor(3), 11).double()  # a one-hot drafter row
    for budget in (0.0, 0.05, 0.5):
        sol = solve(p, q, max_divergence=budget, divergence="kl")
        a, b = sol.a.double(), sol.b.double()
        pi = torch.maximum((1 - b)[:, None] * q, torch.minimum(p, (1 + a)[:, None] * q))
        p_acc = torch.minimum(p, pi).sum(-1)
        delta = budget_tilt(p, q, a, b, p_acc)
        c = conditional_acceptance(p.log(), q.log(), a[:, None], b[:, None])
        assert torch.allclose((q * (c + (1 - c) * delta[:, None])).sum(-1), p_acc, atol=1e-10)
        if budget == 0:
            assert float(delta.abs().max()) < 1e-12
        else:
            assert float(delta[0]) > 0


def test_validation_compares_engine_acceptance_when_the_ranking_has_it():
    from mdboost.validation.prediction import predicted_acceptance

    assert predicted_acceptance({"md_acceptance": "0.6", "engine_acceptance": "0.55"}) == (0.55, True)
    assert predicted_acceptance({"md_acceptance": "0.6", "engine_acceptance": ""}) == (0.6, False)
    assert predicted_acceptance({"md_acceptance": 0.6, "engine_acceptance": float("nan")}) == (0.6, False)
    assert predicted_acceptance({"md_acceptance": 0.6}) == (0.6, False)
    with pytest.raises(ValueError, match="md_acceptance"):
        predicted_acceptance({"md_acceptance": "nan"})


def test_process_speedup_with_a_profile_matches_the_hand_sum():
    gen = torch.Generator().manual_seed(11)
    c = torch.rand(2, 9, generator=gen, dtype=torch.float64)
    table, s, cost = [1.0, 1.3, 1.5, 1.8], 0.2, 0.25
    for g in (1, 2, 3):
        res = run_process(chain_from_positions(c, 3), g, lengths=torch.tensor([9, 6]))
        speed = process_speedup(res.lengths.sum(), res.draft_tokens.sum(), res.steps_by_draft_len.sum(0), cost,
                                verify_costs=table, md_overhead=s, solved=res.visit_prob.sum())
        k = res.draft_len  # [B, L]
        time = (res.start_prob * (cost * k + torch.tensor(table, dtype=torch.float64)[k])).sum() + s * res.visit_prob.sum()
        assert float(speed) == pytest.approx(15 / float(time), rel=1e-12)
        # reached positions = accepted drafts + the rejected ones: visits = accepted + drafted steps - full accepts
        assert float(res.visit_prob.sum()) <= float(res.accepted.sum() + res.drafted_steps.sum()) + 1e-12


def test_process_speedup_with_one_table_per_resample():
    """A stack of ``v`` tables broadcasts against the steps: each resample's speedup is the one-table call's."""
    from mdboost.ranking.speed import process_speedup

    hist = torch.tensor([[[2.0, 3.0, 1.0]], [[1.0, 4.0, 2.0]]])  # [R=2, P=1, K+1=3]
    tables = torch.tensor([[1.0, 1.5, 1.9], [1.0, 1.4, 2.1]])  # [R, K+1]
    both = process_speedup(12.0, 9.0, hist, 0.3, verify_costs=tables[:, None, :], prefill=2.0)
    for r in range(2):
        one = process_speedup(12.0, 9.0, hist[r], 0.3, verify_costs=tables[r].tolist(), prefill=2.0)
        assert torch.allclose(both[r], one)
    with pytest.raises(ValueError, match="verify_costs"):
        process_speedup(12.0, 9.0, hist, 0.3, verify_costs=torch.tensor([[2.0, 1.5, 1.9]])[:, None, :])


def test_resampled_tables_are_whole_repeats():
    """Every resampled table is one measured repeat (entries drawn together, not mixed)."""
    from mdboost.ranking.uncertainty import resample_tables

    samples = [[1.0, 1.0, 1.0], [1.5, 1.6, 1.7], [1.9, 2.0, 2.1]]  # [K=3][S=3]
    tables = resample_tables(samples, 50, seed=3)
    repeats = {tuple(col) for col in torch.tensor(samples, dtype=torch.float64).T.tolist()}
    assert tables.shape == (50, 3) and all(tuple(t) in repeats for t in tables.tolist())
    assert len({tuple(t) for t in tables.tolist()}) == 3  # 50 draws hit all three repeats
    assert torch.equal(tables, resample_tables(samples, 50, seed=3))


class _Proposals:  # the one method of a cache that SequenceLayout.proposals reads
    def __init__(self, props):
        self.props = props

    def ngram_proposals(self, member):
        return self.props


def _reference_rows(length, one_hot, width):
    """One reference sequence whose every token the drafter 'predicts' (prompt lookup copying it,
    or a model with p = q at the reference token), while the position's P_acc is low."""
    from mdboost.ranking.layout import SequenceLayout
    from mdboost.ranking.support import MemberRows

    labels = torch.tensor([1, 2, 3] * (length // 3))
    props = torch.full((length, width), -1, dtype=torch.long)
    for s in range(length):
        ahead = labels[s:s + width]
        props[s, :ahead.numel()] = ahead  # a perfect copy of the reference
    zeros, ones = torch.zeros(length), torch.ones(length, dtype=torch.bool)
    draft = MemberRows(props[:, :1], zeros[:, None], zeros, zeros, ones, one_hot=one_hot)  # log p(x) = 0
    target = MemberRows(props[:, :1], zeros[:, None], zeros, zeros, ones)  # log q(x) = 0 too: c = 1 everywhere
    layout = SequenceLayout(torch.zeros(length, dtype=torch.long), cache=_Proposals(props), member="ngram:2")
    return layout, draft, target, labels


@pytest.mark.parametrize("one_hot", [True, False])
def test_on_reference_text_the_process_takes_the_expected_acceptance(one_hot):
    """A reference text read at its own tokens flatters a drafter that predicts it (c = 1 at every
    token, a reviewer's prompt-lookup case: P_acc 0.014, predicted 1.2x, realized below 1). On
    reference rows the chain is P_acc of the verified position: here constant, so the process
    is the i.i.d. model up to the sequence's end."""
    from mdboost.ranking.process import PointInputs, ProcessSettings, score_process
    from mdboost.ranking.rank import PairRows, PairSide

    length, width, alpha, cost = 3000, 4, 0.014, 0.05
    layout, draft, target, labels = _reference_rows(length, one_hot, width)
    acc = torch.full((length,), alpha, dtype=torch.float64)
    point = [PointInputs(torch.zeros(length), torch.zeros(length), acc)]
    rows = PairRows(PairSide("ngram:2", draft, None, cost), PairSide("target", target, None, 1.0), labels.numpy(),
                    layout=layout)
    args = (rows, point, ProcessSettings((1, 2, 3, 4)))
    biased, = score_process(*args)  # c read at the reference token: every draft accepted
    fixed, = score_process(*args, on_reference=True)
    assert float(biased.values["mean_accepted_length"][-1]) == pytest.approx(width + 1, rel=1e-2)
    assert float(biased.values["speedup"].max()) > 2
    for i, g in enumerate([1, 2, 3, 4]):  # the i.i.d. closed forms (v = 1, s = 0)
        assert float(fixed.values["mean_accepted_length"][i]) == pytest.approx((1 - alpha ** (g + 1)) / (1 - alpha),
                                                                               rel=1e-3)
        assert float(fixed.values["speedup"][i]) == pytest.approx(float(walltime_speedup(alpha, g, cost)), rel=1e-3)
    assert float(fixed.values["speedup"].max()) < 1  # drafting does not pay, as in the real runs
    assert torch.allclose(fixed.values["acceptance_conditional"], fixed.values["acceptance"])


def test_the_speedup_interval_over_prompts_alone_holds_the_costs_at_their_medians():
    """``speedup_prompts`` resamples the prompts as ``speedup`` does, at the measured (median) costs:
    without cost repeats the two intervals are the same; with them, the prompt interval is the
    one without repeats and the joint one is wider (the part validation does not widen)."""
    from mdboost.ranking.layout import SequenceLayout
    from mdboost.ranking.process import PointInputs, ProcessSettings, score_process
    from mdboost.ranking.rank import PairRows, PairSide
    from mdboost.ranking.uncertainty import BootstrapSettings

    length, width = 1200, 4
    layout, draft, target, labels = _reference_rows(length, True, width)
    layout = SequenceLayout(torch.arange(length) // 100, cache=layout.cache, member=layout.member)  # 12 prompts
    acc = (torch.arange(length) // 100 + 1).double() / 14  # each prompt its own acceptance
    point = [PointInputs(torch.zeros(length), torch.zeros(length), acc)]
    profile = SpeedProfile((1.0, 1.2, 1.4, 1.6, 1.8), verify_samples=[(1.0, 1.0, 1.0)] + [(v - 0.1, v, v + 0.2) for v in
                                                                                      (1.2, 1.4, 1.6, 1.8)])
    settings = ProcessSettings((1, 2, 3, 4), bootstrap=BootstrapSettings(num_resamples=400, seed=5))

    def score(cost_samples, verify=True):
        rows = PairRows(PairSide("ngram:2", draft, None, 0.2, cost_samples), PairSide("target", target, None, 1.0),
                        labels.numpy(), layout=layout)
        prof = profile if verify else SpeedProfile(profile.verify_cost)
        return score_process(rows, point, settings, prof, on_reference=True)[0]

    fixed, spread = score(None, verify=False), score((0.1, 0.2, 0.35))
    for side in ("lo", "hi"):
        assert torch.equal(getattr(fixed, side)["speedup_prompts"], getattr(fixed, side)["speedup"])
        assert torch.allclose(getattr(spread, side)["speedup_prompts"], getattr(fixed, side)["speedup"])
    assert torch.equal(spread.values["speedup_prompts"], spread.values["speedup"])
    width_of = {k: (spread.hi[k] - spread.lo[k]) for k in ("speedup", "speedup_prompts")}
    assert bool((width_of["speedup"] > width_of["speedup_prompts"]).all())


def test_expected_chain_of_prompt_lookup_counts_only_its_own_proposals():
    from mdboost.ranking.chains import expected_chain

    acc = torch.tensor([[0.5, 0.25, 0.75]], dtype=torch.float64)
    same = torch.tensor([[[True, False], [True, True], [False, False]]])  # start 2 offers nothing
    assert expected_chain(acc, 2, same).tolist() == [[[0.5, 0.0], [0.25, 0.75], [0.0, 0.0]]]


def test_continuations_of_another_target_take_the_expected_chain(tmp_path):
    """Acceptance rows whose text this pair's target did not sample (``pool.pairs: all``: the
    continuations come from the pool target) are scored as reference rows are."""
    from mdboost.cache import open_or_build_cache
    from mdboost.ranking.layout import sequence_layout
    from mdboost.ranking.rank import PairRows, score_pair
    from mdboost.ranking.rows import MemberLoader, acceptance_rows
    from tests.test_rank_pipeline_sampled import _config

    cfg = _config(tmp_path, tracking={"enabled": False}, md={"divergences": ["kl"], "budgets": [0.0, 0.3]})
    pc, _ = open_or_build_cache(cfg.cache_spec())
    rows = acceptance_rows(MemberLoader(pc.acceptance, cfg.md.sampling_temperatures[0]), pc, "early_exit:2", "tiny")
    layout = sequence_layout(pc.acceptance.caches["early_exit:2"], "early_exit:2")
    settings = cfg.score_settings()
    with_layout = PairRows(rows.draft, rows.target, rows.labels, layout=layout)
    other = score_pair(PairRows(rows.draft, rows.target, rows.labels), pc.vocab_size, settings=settings,
                       acceptance=with_layout, on_reference=True)
    reference = score_pair(with_layout, pc.vocab_size, settings=settings)  # no acceptance rows: the reference path
    sampled = score_pair(PairRows(rows.draft, rows.target, rows.labels), pc.vocab_size, settings=settings,
                         acceptance=with_layout)
    for a, b, c in zip(other.rows, reference.rows, sampled.rows):
        assert a["predicted_speedup"] == b["predicted_speedup"]
        assert a["engine_acceptance_conditional"] == a["engine_acceptance"]
    assert any(a["predicted_speedup"] != c["predicted_speedup"] for a, c in zip(other.rows, sampled.rows))


def test_process_settings_refuse_what_the_process_cannot_run():
    from mdboost.ranking.process import ProcessSettings

    assert ProcessSettings(range(1, 4)).gammas == (1, 2, 3)
    for bad, match in (((), "gammas must be a non-empty"), ((0, 1), "gammas must be a non-empty")):
        with pytest.raises(ValueError, match=match):
            ProcessSettings(bad)
    with pytest.raises(ValueError, match="md_solve must be one of .*, got 'lazy'"):
        ProcessSettings((1,), md_solve="lazy")


def test_cost_draws_keep_the_medians_first_and_draw_measured_repeats():
    """Resample 0 is the measured cost and ``v`` table; every other resample is one measured repeat."""
    from types import SimpleNamespace

    from mdboost.ranking.process import _cost_draws
    from mdboost.ranking.uncertainty import BootstrapSettings

    drafter = SimpleNamespace(cost_ratio=0.1, cost_samples=(0.08, 0.12))
    samples = ((1.0, 1.0), (1.5, 1.7), (2.0, 2.4))  # v(K) of two repeats, K = 0..2
    profile = SpeedProfile((1.0, 1.6, 2.2), verify_samples=samples)
    cost, verify = _cost_draws(drafter, profile, 3, BootstrapSettings(num_resamples=50, seed=3))
    assert cost.shape == (51, 1, 1) and float(cost[0]) == 0.1 and set(cost[1:].flatten().tolist()) <= {0.08, 0.12}
    assert verify.shape == (51, 1, 1, 3) and verify[0].flatten().tolist() == [1.0, 1.6, 2.2]
    repeats = {tuple(col) for col in zip(*samples)}
    assert {tuple(row) for row in verify[1:, 0, 0].tolist()} <= repeats
    cost, verify = _cost_draws(drafter, profile, 3, BootstrapSettings(num_resamples=0))
    assert cost.flatten().tolist() == [0.1] and verify == (1.0, 1.6, 2.2)  # no bootstrap: the measured figures


def test_floor_runs_cut_each_start_at_its_first_undrafted_position():
    """A draft floor: a step started at s may draft the run of floor-passing positions from s on
    (within the chain width and the sequence); a point without a floor is not cut."""
    from mdboost.ranking.layout import padded_index
    from mdboost.ranking.process import PointInputs, floor_runs

    zeros = torch.zeros(7, dtype=torch.float64)
    drafts = torch.tensor([True, True, False, True, True, True, True])  # rows 0-4: sequence 0; 5-6: sequence 1
    index, _ = padded_index(torch.tensor([0, 0, 0, 0, 0, 1, 1]))
    floored = PointInputs(zeros, zeros, zeros, drafts=drafts)
    plain = PointInputs(zeros, zeros, zeros)
    assert floor_runs([plain], index, 3) is None
    runs = floor_runs([floored, plain], index, 3)
    assert runs[0].tolist() == [[2, 1, 0, 2, 1], [2, 1, 0, 0, 0]]
    assert runs[1].tolist() == [[3] * 5, [3] * 5]


@pytest.mark.parametrize("accept, stops, drafted", [(1.0, 1, 3), (0.0, 3, 4)])
def test_a_floor_that_ends_drafting_costs_one_more_drafter_forward(accept, stops, drafted):
    """Worked by hand, L = 5, gamma 3, floor runs [2, 1, 0, 2, 1]. Every draft accepted: start 0
    drafts 2 (the floor ends it: a stop), start 3 drafts 1 (the text's end binds). Every draft
    rejected: starts 0, 1, 2 end at the floor (2, 1, 0 drafts), 3 drafts 1, 4 none (the end)."""
    chain = torch.full((1, 5, 3), accept, dtype=torch.float64)
    res = run_process(chain, 3, floor_len=torch.tensor([[2, 1, 0, 2, 1]]))
    assert float(res.floor_stops[0]) == stops and float(res.draft_tokens[0]) == drafted
    assert float(res.drafter_forwards[0]) == stops + drafted
    assert float(run_process(chain, 3).floor_stops[0]) == 0


def test_floor_drafts_reads_the_confidence_and_needs_ten_logits():
    from mdboost.ranking.rule_points import floor_drafts
    from mdboost.ranking.support import rows_from_logits, rows_from_proposals

    logits = torch.tensor([[4.0] + [0.0] * 11, [0.0] * 12])  # confident row (e^4 / (e^4 + 9)), uniform row
    rows = rows_from_logits(logits, torch.tensor([0, 1]), k=10)
    assert floor_drafts(rows, 0.5).tolist() == [True, False] and floor_drafts(rows, 0.0) is None
    with pytest.raises(ValueError, match="k=4 per position: build it with k >= 10"):
        floor_drafts(rows_from_logits(logits, torch.tensor([0, 1]), k=4), 0.5)
    props = rows_from_proposals(torch.tensor([3, -1]), torch.tensor([3, 2]))
    assert floor_drafts(props, 0.9) is None  # prompt lookup: its own offer, not cut
