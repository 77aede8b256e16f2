"""The ranking's verification rules (mdboost.ranking.rule_points) against the rules' own laws on
full distributions, the greedy draft on the aligned support, and score_pair's rows per rule."""

import math
from dataclasses import replace

import pytest
import torch

from mdboost.md.rules import Match, Mentored, Rejection, Threshold
from mdboost.ranking.layout import SequenceLayout
from mdboost.ranking.process import run_process
from mdboost.ranking.chains import chain_from_positions
from mdboost.ranking.rank import PairRows, ScoreSettings, pair_work, score_pair
from mdboost.ranking.rule_points import (greedy_slots, greedy_tilt, point_law, rule_points, slot_tokens,
                                         text_acceptance, true_token_prob)
from mdboost.ranking.support import align, rows_from_logits
from tests.test_ranking_pair import _member

V, N = 30, 24
FAMILIES = (Mentored(), Rejection(drafting="greedy"), Rejection(), Threshold(), Match(), Mentored(drafting="greedy"))


def _logits(seed=0, n=N, v=V):
    gen = torch.Generator().manual_seed(seed)
    lq = torch.randn(n, v, generator=gen, dtype=torch.float64) * 2
    lp = lq + torch.randn(n, v, generator=gen, dtype=torch.float64) * 1.5
    true = torch.multinomial(torch.softmax(lq, -1), 1, generator=gen).squeeze(-1)
    return lp, lq, true


def _dense(rows, v):
    """The uniform-tail distribution a member's top-k rows stand for, over the whole vocabulary."""
    level = rows.tail.double() / (v - rows.k)
    dense = level[:, None].expand(-1, v).clone()
    return dense.scatter_(1, rows.ids, rows.logp.double().exp())


def _argmax_lowest_id(p):  # [N, V] -> [N]: argmax, ties to the smallest token id
    return (p == p.amax(-1, keepdim=True)).double().argmax(-1)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_slot_is_the_argmax_token_never_the_bucket(k):
    lp, lq, true = _logits()
    draft, target = rows_from_logits(lp, true, k), rows_from_logits(lq, true, k)
    aligned = align(draft, target, V)
    slots = greedy_slots(aligned)
    assert (aligned.count.gather(-1, slots[:, None]) == 1).all()  # one token, never the merged bucket
    assert torch.equal(slot_tokens(aligned, slots), torch.softmax(lp, -1).argmax(-1))
    # full logits: the slot is the token id, the argmax of p
    full = align(rows_from_logits(lp, true, k, keep_full=True), rows_from_logits(lq, true, k, keep_full=True), V)
    assert torch.equal(greedy_slots(full), torch.softmax(lp, -1).argmax(-1))


def test_greedy_slot_ignores_a_heavy_bucket_and_breaks_ties_by_token_id():
    v = 400
    lp = torch.zeros(2, v, dtype=torch.float64)
    lp[:, 7] = lp[:, 3] = 3.0  # two equal maxima; the other 398 tokens hold most of the mass
    lq = torch.randn(2, v, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    true = torch.zeros(2, dtype=torch.long)
    aligned = align(rows_from_logits(lp, true, 2), rows_from_logits(lq, true, 2), v)
    assert float(aligned.p_mass[:, -1].min()) > 0.5  # the bucket is the largest mass
    assert slot_tokens(aligned, greedy_slots(aligned)).tolist() == [3, 3]


@pytest.mark.parametrize("full", [True, False])
def test_point_law_is_the_rule_law_on_the_distributions_the_support_stands_for(full):
    """Every rule point: acceptance, achieved divergence and pi at the true token equal the rule's
    own closed form on the full (or uniform-tail) distributions with the greedy draft argmax p."""
    lp, lq, true = _logits(1)
    k = 5
    draft, target = rows_from_logits(lp, true, k, keep_full=full), rows_from_logits(lq, true, k, keep_full=full)
    aligned = align(draft, target, V, true)
    p, q = ((torch.softmax(lp, -1), torch.softmax(lq, -1)) if full else (_dense(draft, V), _dense(target, V)))
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    valid = torch.ones(N, dtype=torch.bool)
    for pt in rule_points(FAMILIES, ["kl", "tv", "hellinger"], [0.0, 0.05, 0.4]):
        law = point_law(pt, aligned, valid)
        token = _argmax_lowest_id(p) if pt.rule.drafting == "greedy" else None
        ref = pt.rule.law(p, q, draft_token=token)
        assert torch.allclose(law.acceptance, ref.acceptance, atol=1e-9), pt
        f = "kl" if pt.divergence == "none" else pt.divergence
        achieved = pt.rule.achieved_divergence(p, q, f, draft_token=token)
        assert torch.allclose(law.divergence, achieved, atol=1e-9), pt
        if full:  # the exact q_j times the slot's ratio: pi_j itself
            pi_j = ref.emitted[torch.arange(N), true]
            prob = true_token_prob(law, aligned, valid, true, target.true_logp)
            assert torch.allclose(prob, pi_j, atol=1e-9), pt


def test_true_token_prob_outside_the_kept_ids_takes_the_bucket_ratio():
    lp, lq, true = _logits(2)
    draft, target = rows_from_logits(lp, true, 2), rows_from_logits(lq, true, 2)
    aligned = align(draft, target, V, true)
    pt = rule_points([Threshold()], ["tv"], [0.3])[0]
    law = point_law(pt, aligned, torch.ones(N, dtype=torch.bool))
    p, q = _dense(draft, V), _dense(target, V)
    ref = pt.rule.law(p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True), draft_token=_argmax_lowest_id(p))
    ratio = ref.emitted[torch.arange(N), true] / q[torch.arange(N), true]
    q_true = torch.softmax(lq, -1)[torch.arange(N), true]
    prob = true_token_prob(law, aligned, torch.ones(N, dtype=torch.bool), true, target.true_logp)
    assert torch.allclose(prob, q_true * ratio, rtol=1e-9)
    outside = ~(aligned.ids == true[:, None]).any(-1)
    assert bool(outside.any())  # some true tokens lie in the bucket


def test_greedy_draft_is_emitted_only_by_acceptance_and_the_tilt_restores_its_mean():
    """pi_g = P_acc for every greedy rule (so c = 1[x = g] is the posterior of acceptance), and
    E_{x~q}[c + (1 - c) delta] = P_acc per position."""
    lp, lq, true = _logits(3)
    aligned = align(rows_from_logits(lp, true, 4, keep_full=True), rows_from_logits(lq, true, 4, keep_full=True), V)
    valid = torch.ones(N, dtype=torch.bool)
    q = torch.softmax(lq, -1)
    for pt in rule_points([Rejection(drafting="greedy"), Threshold(), Match(), Mentored(drafting="greedy")],
                          ["kl", "tv"], [0.0, 0.3]):
        law = point_law(pt, aligned, valid)
        g = law.slots
        assert torch.allclose(law.emitted.gather(-1, g[:, None]).squeeze(-1), law.acceptance, atol=1e-12), pt
        delta = greedy_tilt(law, aligned)
        mean = torch.zeros(N, dtype=torch.float64)
        for x in range(V):  # E over the emitted token x ~ q
            c = text_acceptance(law, aligned, valid, torch.full((N,), x))
            mean += q[:, x] * (c + (1 - c) * delta)
        assert torch.allclose(mean, law.acceptance, atol=1e-12), pt
        if pt.rule.lossless:
            assert float(delta.max()) < 1e-12


def test_rule_points_cross_families_and_refuse_what_the_ranking_cannot_score():
    pts = rule_points([Mentored(), Rejection(), Threshold()], ["kl", "tv"], [0.1, 0.0])
    assert [(pt.rule.name, pt.divergence, pt.max_divergence) for pt in pts] == [
        ("mentored", "kl", 0.1), ("mentored", "none", 0.0), ("mentored", "tv", 0.1), ("rejection", "none", 0.0),
        ("threshold", "kl", 0.1), ("threshold", "none", 0.0), ("threshold", "tv", 0.1)]
    assert pts[4].rule.accept == pytest.approx(math.exp(-0.1)) and pts[6].rule.accept == pytest.approx(0.9)
    assert pts[0].rule == Mentored(max_divergence=0.1, divergence="kl") and pts[0].is_md and not pts[3].is_md
    with pytest.raises(ValueError, match="greedy drafts only"):
        rule_points([Threshold(drafting="sampled")], ["kl"], [0.0])
    with pytest.raises(ValueError, match="every divergence and budget"):
        rule_points([Mentored(max_divergence=0.2)], ["kl"], [0.0])
    with pytest.raises(TypeError, match="Rule objects"):
        rule_points(["mentored"], ["kl"], [0.0])
    with pytest.raises(ValueError, match="greedy drafts only"):
        ScoreSettings(rules=(Match(drafting="sampled"),))
    with pytest.raises(ValueError, match="at least one rule"):
        ScoreSettings(rules=())


def _pair(seed=4, k=V - 1, full=True, layout=None):
    lp, lq, true = _logits(seed, n=40)
    d, t = _member("d", lp, true, k, full, 0.2), _member("t", lq, true, k, full, 1.0)
    return PairRows(d, t, true.numpy(), layout=layout), lp, lq, true


def test_score_pair_rows_per_rule():
    pair, lp, lq, _ = _pair()
    settings = ScoreSettings(divergences=("kl", "tv"), budgets=(0.0, 0.1, 0.5), gamma_min=1, gamma_max=4,
                             rules=FAMILIES)
    rows = [r for r in score_pair(pair, V, settings=settings).rows if r["is_best_gamma"]]
    by = {(r["rule"], r["drafting"], r["divergence"], r["max_divergence"]): r for r in rows}
    assert {(r, d) for r, d, *_ in by} == {("mentored", "sampled"), ("rejection", "greedy"), ("rejection", "sampled"),
                                           ("threshold", "greedy"), ("match", "greedy"), ("mentored", "greedy")}
    p, q = torch.softmax(lp, -1), torch.softmax(lq, -1)
    plain_sd = by[("mentored", "sampled", "none", 0.0)]
    assert by[("rejection", "sampled", "none", 0.0)]["md_acceptance"] == pytest.approx(plain_sd["md_acceptance"])
    assert by[("rejection", "sampled", "none", 0.0)]["predicted_speedup"] == pytest.approx(plain_sd["predicted_speedup"])
    greedy = float(q.gather(-1, p.argmax(-1, keepdim=True)).mean())  # q at argmax p
    for name in ("rejection", "threshold", "match", "mentored"):
        r = by[(name, "greedy", "none", 0.0)]
        assert r["md_acceptance"] == pytest.approx(greedy) and r["achieved_divergence_max"] < 1e-12
        assert set(r["engines"].split()) == {"mdboost", "hf", "vllm", "sglang", "llamacpp"}
    for f in ("kl", "tv"):
        for budget in (0.1, 0.5):
            sglang, md = by[("threshold", "greedy", f, budget)], by[("mentored", "sampled", f, budget)]
            assert sglang["achieved_divergence_max"] <= budget + 1e-12  # docs/theory.md section 11
            assert sglang["threshold_acc"] == pytest.approx(math.exp(-budget) if f == "kl" else 1 - budget)
            greedy_md = by[("mentored", "greedy", f, budget)]  # MD on the same drafts: the optimum of the curve
            assert greedy_md["md_acceptance"] >= sglang["md_acceptance"] - 1e-12
            assert sglang["engines"] == "mdboost hf sglang" and md["engines"] == "mdboost hf"
            assert md["achieved_divergence_max"] <= budget + 1e-9
            assert md["achieved_divergence_mean"] == md["achieved_divergence"]


def test_greedy_process_runs_on_the_argmax_match_along_the_text():
    """On text sampled from q a lossless greedy rule's draft is accepted iff the text's token is
    argmax p: the process's mean accepted length is run_process on that indicator chain."""
    layout = SequenceLayout(torch.arange(40) // 10)  # 4 sequences of 10 positions
    pair, lp, _, true = _pair(5, layout=layout)
    settings = ScoreSettings(divergences=("kl",), budgets=(0.0,), gamma_min=1, gamma_max=3,
                             rules=(Rejection(drafting="greedy"),))
    rows = score_pair(pair, V, settings=settings, on_reference=False).rows
    hit = (torch.softmax(lp, -1).argmax(-1) == true).double().reshape(4, 10)
    for r in rows:
        res = run_process(chain_from_positions(hit, 3), r["gamma"])
        drafted = (res.start_prob * (res.draft_len > 0)).sum()
        assert r["engine_mean_accepted_length"] == pytest.approx(float(1 + res.accepted.sum() / drafted))


def test_block_chain_is_the_block_law_of_each_start():
    """c_{s,i} = E[r_{s,i}] / E[r_{s,i-1}] against the exact enumeration (small vocabulary)."""
    from mdboost.md.block import block_acceptance_law
    from mdboost.ranking.rule_points import block_chain

    v, n, width = 5, 9, 3
    lp, lq, true = _logits(6, n=n, v=v)
    aligned = align(rows_from_logits(lp, true, 2, keep_full=True), rows_from_logits(lq, true, 2, keep_full=True), v)
    sequence = torch.tensor([0] * 5 + [1] * 4)
    chain = block_chain(aligned, torch.ones(n, dtype=torch.bool), sequence, width, num_samples=20000)
    p, q = torch.softmax(lp, -1), torch.softmax(lq, -1)
    for s in range(n):
        end = 5 if s < 5 else n
        k = min(width, end - s)
        law = block_acceptance_law(p[s:s + k], q[s:s + k])  # P(accepted >= i + 1), i < k
        expected = law / torch.cat([torch.ones(1, dtype=torch.float64), law[:-1]])
        assert torch.allclose(chain[s, :k], expected, atol=0.02), (s, chain[s], expected)
        assert (chain[s, k:] == 0).all()  # past the sequence's end
        assert chain[s, 0] == pytest.approx(float(torch.minimum(p[s], q[s]).sum()), abs=0.02)


def test_block_rows_accept_at_least_token_wise_rejection():
    """Sampled drafts: block verification's mean accepted length >= token-wise rejection's at every
    gamma, same first-draft acceptance; greedy drafts: the same rows as rejection's."""
    from mdboost.md.rules import Block

    layout = SequenceLayout(torch.arange(40) // 10)
    pair, *_ = _pair(7, layout=layout)
    settings = ScoreSettings(divergences=("kl",), budgets=(0.0,), gamma_min=1, gamma_max=4,
                             rules=(Rejection(), Block(), Rejection(drafting="greedy"), Block(drafting="greedy")))
    rows = score_pair(pair, V, settings=settings, on_reference=False).rows
    by = {(r["rule"], r["drafting"], r["gamma"]): r for r in rows}
    gains = []
    for g in range(1, 5):
        block, sd = by[("block", "sampled", g)], by[("rejection", "sampled", g)]
        assert block["md_acceptance"] == pytest.approx(sd["md_acceptance"])
        assert block["engine_mean_accepted_length"] >= sd["engine_mean_accepted_length"] - 0.01
        gains.append(block["engine_mean_accepted_length"] - sd["engine_mean_accepted_length"])
        for key in ("md_acceptance", "engine_mean_accepted_length", "predicted_speedup"):
            assert by[("block", "greedy", g)][key] == by[("rejection", "greedy", g)][key]
        assert block["engines"] == "mdboost hf vllm"
    assert max(gains) > 0.01  # blocks of several drafts gain


def test_block_at_one_draft_is_sd_exactly():
    """gamma 1: a block is one draft, token-wise rejection's law: the same rows, to rounding."""
    from mdboost.md.rules import Block

    layout = SequenceLayout(torch.arange(40) // 10)
    pair, *_ = _pair(8, layout=layout)
    settings = ScoreSettings(divergences=("kl",), budgets=(0.0,), gamma_min=1, gamma_max=3,
                             rules=(Rejection(), Block()))
    for on_reference in (False, True):
        rows = score_pair(pair, V, settings=settings, on_reference=on_reference).rows
        one = {r["rule"]: r for r in rows if r["gamma"] == 1}
        for key in ("engine_mean_accepted_length", "predicted_speedup", "engine_acceptance"):
            assert one["block"][key] == pytest.approx(one["rejection"][key], rel=1e-12), (key, on_reference)


def test_a_lossy_threshold_interval_holds_what_the_top_k_cache_cannot_see():
    """SGLang's floor threshold (``tv <= 1``: ``accept = 1e-9``) accepts a greedy draft outside the
    target's top-k with ``min(1, q_x / 1e-9)``. The uniform tail puts ``q_x`` at the tail's mean
    level, below the threshold here, while the true ``q_x`` is far above it: the point misses the
    full-logit value, and the interval (the process at ``q_x = 0`` and at the smallest kept ``q``)
    holds it."""
    n, v, k = 60, 3000, 4
    gen = torch.Generator().manual_seed(3)
    lq = torch.full((n, v), -40.0, dtype=torch.float64)  # a far tail of ~3000 tokens
    lq[:, :k] = torch.randn(n, k, generator=gen, dtype=torch.float64)  # the head: the target's top-k
    lq[:, k] = -14.0  # the drafter's argmax: outside the target's top-k, q_x ~ 1e-7 >> 1e-9 > the tail's mean
    lp = torch.full((n, v), -40.0, dtype=torch.float64)
    lp[:, :k] = lq[:, :k]
    lp[torch.arange(n) % 3 == 0, k] = 5.0  # a third of the positions draft it
    true = torch.multinomial(torch.softmax(lq, -1), 1, generator=gen).squeeze(-1)
    layout = SequenceLayout(torch.arange(n) // 10)
    settings = ScoreSettings(divergences=("tv",), budgets=(1.0,), gamma_min=1, gamma_max=3, rules=(Threshold(),))

    def row(full: bool) -> dict:
        pair = PairRows(_member("d", lp, true, k, full, 0.2), _member("t", lq, true, k, full, 1.0), true.numpy(),
                        layout=layout)
        rows = score_pair(pair, v, settings=settings, on_reference=False).rows
        return next(r for r in rows if r["rule"] == "threshold" and r["max_divergence"] == 1.0 and r["gamma"] == 2)

    exact, topk = row(True), row(False)
    assert exact["engine_acceptance"] > topk["engine_acceptance"] + 0.05  # the uniform tail underestimates q_x
    assert topk["engine_acceptance_lo"] <= exact["engine_acceptance"] <= topk["engine_acceptance_hi"]
    assert topk["predicted_speedup_lo"] <= exact["predicted_speedup"] <= topk["predicted_speedup_hi"]
    # a lossless threshold (accept = 1) tests q_x itself: no end to add, the interval is the bootstrap's
    plain = PairRows(_member("d", lp, true, k, False, 0.2), _member("t", lq, true, k, False, 1.0), true.numpy(),
                     layout=layout)
    work = pair_work(plain, v, settings=replace(settings, budgets=(0.0, 1.0)), on_reference=False)
    assert [(pt.rule.accept < 1, bounded) for pt, *_, bounded in work.others] == [(False, False), (True, True)]
