"""Verification rules (mdboost.md.rules): each rule's sampler against its closed form, the closed
forms against an enumeration written here, SGLang's threshold mapping (docs/theory.md, section 11)."""

import math

import pytest
import scipy.stats as sps
import torch

from mdboost.md.divergences import f_divergence
from mdboost.md.onehot import one_hot_primal
from mdboost.md.divergences import resolve
from mdboost.md.rules import Block, Match, Mentored, Rejection, Threshold, threshold_for_budget
from mdboost.md.verify import verify

DIVERGENCES = ["kl", "tv", "hellinger", "pearson", "js", "alpha:0.5", "alpha:3"]  # g(0) finite
UNBOUNDED = ["rkl", "neyman", "alpha:-2"]  # g(0) = inf: a surely emitted draft costs inf
RULES = [Rejection(), Rejection(drafting="greedy"), Mentored(max_divergence=0.1), Mentored(max_divergence=0.1, drafting="greedy"),
         Mentored(min_acceptance=0.8, divergence="tv"), Threshold(accept=0.6), Threshold(accept=0.5, single=0.7),
         Threshold(accept=0.7, drafting="sampled"), Match(), Match(drafting="sampled"), Block(), Block(drafting="greedy")]


def _pair(vocab, seed, alpha=0.7):
    g = torch.Generator().manual_seed(seed)
    d = torch.distributions.Dirichlet(torch.full((vocab,), alpha, dtype=torch.float64))
    torch.manual_seed(seed)
    return d.sample(), d.sample()


def _threshold_law_by_enumeration(p, q, accept, single, greedy):
    """Emitted law and acceptance written out draft by draft (no vector algebra)."""
    vocab = len(p)
    drafts = [(int(torch.argmax(p)), 1.0)] if greedy else [(x, float(p[x])) for x in range(vocab)]
    emitted, acc = [0.0] * vocab, 0.0
    for x, px in drafts:
        qx = float(q[x])
        t = 1.0 if qx >= single else min(1.0, qx / accept)
        acc += px * t
        emitted[x] += px * t
        rest = 1 - qx
        for i in range(vocab):
            if i != x and rest > 0:
                emitted[i] += px * (1 - t) * float(q[i]) / rest
    return acc, emitted


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_threshold_law_equals_enumeration(seed, greedy):
    p, q = _pair(7, seed)
    accept, single = 0.3 + 0.1 * seed, 0.9 if seed % 2 else 1.0
    law = Threshold(accept=accept, single=single, drafting="greedy" if greedy else "sampled").law(p, q)
    acc, emitted = _threshold_law_by_enumeration(p, q, accept, single, greedy)
    assert float(law.acceptance) == pytest.approx(acc, abs=1e-12)
    assert law.emitted.tolist() == pytest.approx(emitted, abs=1e-12)


@pytest.mark.parametrize("rule", [Match(), Match(drafting="sampled"), Rejection(), Rejection(drafting="greedy"), Block()])
def test_lossless_rules_emit_the_target(rule):
    p, q = _pair(9, 3)
    law = rule.law(p, q)
    assert rule.lossless
    assert torch.allclose(law.emitted, q, atol=1e-12)
    assert float(rule.achieved_divergence(p, q, "kl")) == pytest.approx(0.0, abs=1e-12)


def test_match_is_sd_on_greedy_drafts_and_plain_matching_on_sampled_ones():
    p, q = _pair(9, 4)
    x = int(p.argmax())
    assert float(Match().law(p, q).acceptance) == pytest.approx(float(q[x]), abs=1e-12)
    assert float(Rejection(drafting="greedy").law(p, q).acceptance) == pytest.approx(float(q[x]), abs=1e-12)
    # a sampled draft matches the target's sample with probability sum_i p_i q_i, below SD's sum min
    assert float(Match(drafting="sampled").law(p, q).acceptance) == pytest.approx(float((p * q).sum()), abs=1e-12)


@pytest.mark.parametrize("rule", RULES, ids=repr)
def test_sampler_follows_the_closed_form(rule):
    """K = 2 drafts per row at two positions: the first emitted token follows law(pos 0).emitted,
    the first test's acceptance frequency law(pos 0).acceptance (chi-square / binomial)."""
    vocab = 6
    n = 8000 if isinstance(rule, Mentored) and rule.drafting == "greedy" else 40000  # a one-hot solve per row
    p0, q0 = _pair(vocab, 11, alpha=1.0)
    p1, q1 = _pair(vocab, 12, alpha=1.0)
    q2 = _pair(vocab, 13)[1]
    p = torch.stack([p0, p1]).expand(n, 2, vocab)
    q = torch.stack([q0, q1, q2]).expand(n, 3, vocab)
    g = torch.Generator().manual_seed(5)
    if rule.drafting == "greedy":
        tokens = p.argmax(-1)
    else:
        tokens = torch.multinomial(p.reshape(-1, vocab), 1, generator=g).view(n, 2)
    out = rule.verify(tokens, p, q, generator=g)
    law = rule.law(p0, q0)
    accepted = (out.num_accepted >= 1).double().mean()
    se = math.sqrt(float(law.acceptance) * (1 - float(law.acceptance)) / n) + 1e-9
    assert abs(float(accepted) - float(law.acceptance)) < 5 * se
    counts = torch.bincount(out.tokens[:, 0], minlength=vocab).double()
    expected = law.emitted * n
    keep = expected > 5
    chi2 = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    assert sps.chi2.sf(chi2, int(keep.sum()) - 1) > 1e-3
    assert counts[~keep].sum() <= max(5.0, 3 * float(expected[~keep].sum()) + 3)
    # the reported per-position stats are the closed form's
    assert torch.allclose(out.acceptance_probability[0].double(), torch.stack([law.acceptance, rule.law(p1, q1).acceptance]),
                          atol=1e-9)


def test_greedy_rules_reject_a_draft_that_is_not_the_argmax():
    p = torch.tensor([[[0.6, 0.4]]], dtype=torch.float64)
    q = torch.tensor([[[0.5, 0.5], [0.5, 0.5]]], dtype=torch.float64)
    with pytest.raises(ValueError, match="not an argmax of draft_probs"):
        Threshold(accept=0.5).verify(torch.tensor([[1]]), p, q)
    out = Threshold(accept=0.5).verify(torch.tensor([[0]]), p, q, generator=torch.Generator().manual_seed(0))
    assert out.tokens.shape == (1, 2)


def test_rule_arguments_are_checked_by_name():
    with pytest.raises(ValueError, match="accept must be in \\(0, 1\\], got 0"):
        Threshold(accept=0)
    with pytest.raises(ValueError, match="drafting must be one of"):
        Rejection(drafting="beam")
    with pytest.raises(ValueError, match="max_divergence must be a number >= 0, got -1"):
        Mentored(max_divergence=-1)
    with pytest.raises(ValueError, match="not both"):
        Mentored(max_divergence=0.1, min_acceptance=0.5)
    with pytest.raises(ValueError, match="divergence"):
        Mentored(divergence="nope")
    with pytest.raises(ValueError, match="max_divergence must be a number >= 0"):
        threshold_for_budget(-0.1)
    with pytest.raises(TypeError):
        Match(accept=0.5)  # Match is Threshold at 1: not a parameter


def test_mentored_rule_is_verify_and_its_greedy_law_is_the_one_hot_closed_form():
    p, q = _pair(8, 21)
    rule = Mentored(max_divergence=0.2, drafting="greedy")
    law = rule.law(p, q)
    x = int(p.argmax())
    point = one_hot_primal(q[x:x + 1], torch.tensor([0.2], dtype=torch.float64), resolve("kl"))
    assert float(law.acceptance) == pytest.approx(float(point.acceptance), abs=1e-9)
    assert float(law.emitted[x]) == pytest.approx(float(point.acceptance), abs=1e-9)
    tokens = torch.tensor([[1, 3]])
    pp, qq = p.expand(1, 2, 8), q.expand(1, 3, 8)
    got = Mentored(max_divergence=0.2).verify(tokens, pp, qq, generator=torch.Generator().manual_seed(1))
    want = verify(tokens, pp, qq, max_divergence=0.2, generator=torch.Generator().manual_seed(1))
    assert torch.equal(got.tokens, want.tokens)


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_threshold_for_budget_solves_the_worst_position(divergence):
    """phi(c) = c g(1/c) + (1 - c) g(0) = D: the position with q_x = c emits x surely."""
    g = resolve(divergence).g
    for budget in (0.01, 0.1, 0.3):
        c = threshold_for_budget(budget, divergence)
        phi = float(c * g(torch.tensor(1 / c, dtype=torch.float64)) + (1 - c) * g(torch.tensor(0.0, dtype=torch.float64)))
        assert 0 < c < 1
        assert phi == pytest.approx(budget, rel=1e-9)


def test_threshold_for_budget_closed_forms():
    for budget in (0.0, 0.05, 0.7, 3.0):
        assert threshold_for_budget(budget, "kl") == pytest.approx(math.exp(-budget), rel=1e-12)
    for budget in (0.05, 0.5, 0.9):
        assert threshold_for_budget(budget, "tv") == pytest.approx(1 - budget, rel=1e-12)
    assert threshold_for_budget(1.5, "tv") == 1e-9  # accept everything: TV never exceeds 1
    for divergence in UNBOUNDED:  # g(0) = inf: any lossy threshold is unbounded somewhere
        assert threshold_for_budget(5.0, divergence) == 1.0
        p = torch.tensor([1.0, 0.0], dtype=torch.float64)
        q = torch.tensor([0.9, 0.1], dtype=torch.float64)
        assert math.isinf(float(Threshold(accept=0.8).achieved_divergence(p, q, divergence)))


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_threshold_at_the_mapped_c_stays_within_the_budget_and_reaches_it(divergence):
    """Every position (random q, the greedy draft anywhere in the target's range) stays within D,
    and q_x = c reaches D: the mapping is the smallest threshold that holds."""
    budget = 0.15
    rule = Threshold.for_budget(budget, divergence)
    c = rule.accept
    vocab, n = 5, 4000
    torch.manual_seed(0)
    q = torch.distributions.Dirichlet(torch.full((vocab,), 0.5, dtype=torch.float64)).sample((n,))
    q_x = torch.linspace(0.0, 1.0, n, dtype=torch.float64)  # the draft's target probability, swept
    q = torch.cat([q_x[:, None], (1 - q_x[:, None]) * q[:, 1:] / q[:, 1:].sum(-1, keepdim=True)], dim=-1)
    p = torch.zeros_like(q)
    p[:, 0] = 1.0  # greedy draft: token 0
    achieved = rule.achieved_divergence(p, q, divergence)
    assert float(achieved.max()) <= budget * (1 + 1e-9)
    worst = torch.tensor([[c, 1 - c, 0, 0, 0]], dtype=torch.float64)
    worst[0, 1:] = (1 - c) / 4
    assert float(rule.achieved_divergence(p[:1], worst, divergence)) == pytest.approx(budget, rel=1e-6)
    slightly_lower = Threshold(accept=c * 0.97)  # a lower threshold breaks the budget somewhere
    assert float(slightly_lower.achieved_divergence(p, q, divergence).max()) > budget


@pytest.mark.parametrize("divergence", ["kl", "tv", "hellinger", "js"])
def test_mentored_accepts_at_least_the_threshold_rule_at_its_achieved_divergence(divergence):
    """MD is the optimum: at the divergence a threshold position achieves, MD with greedy drafts
    accepts at least as much (docs/theory.md, section 11: the optimality gap is >= 0)."""
    for seed in range(8):
        p, q = _pair(10, 100 + seed, alpha=0.4)
        rule = Threshold.for_budget(0.2, divergence)
        achieved = float(rule.achieved_divergence(p, q, divergence))
        md = Mentored(max_divergence=achieved, divergence=divergence, drafting="greedy")
        assert float(md.law(p, q).acceptance) >= float(rule.law(p, q).acceptance) - 1e-9


def test_engines_follow_the_law():
    assert Rejection().engines == ("mdboost", "hf", "vllm")
    assert set(Match().engines) == {"mdboost", "hf", "vllm", "sglang", "llamacpp"}
    assert Threshold(accept=0.5).engines == ("mdboost", "hf", "sglang")
    assert Mentored(max_divergence=0.1).engines == ("mdboost", "hf")
    assert Mentored(max_divergence=0.0, drafting="greedy").engines == Rejection(drafting="greedy").engines
    p, q = _pair(5, 1)
    # achieved divergence of a lossy rule equals f_divergence of its law
    law = Threshold(accept=0.5).law(p, q)
    assert float(Threshold(accept=0.5).achieved_divergence(p, q, "js")) == pytest.approx(
        float(f_divergence(law.emitted, q, "js")), abs=1e-12)


def test_a_rules_repr_evaluates_back_to_it():
    """The export prints rules as Python (``mdboost.export.rule_code``): the repr names what
    ``__init__`` takes (not `Match`'s fixed thresholds) and a draft floor only when there is one."""
    from mdboost.md.heuristics import Fly, Fuzzy, Lenient, Typical

    namespace = {cls.__name__: cls for cls in (Block, Match, Mentored, Rejection, Threshold, Fly, Fuzzy, Lenient, Typical)}
    rules = [Match(), Match(draft_p_min=0.5), Threshold(accept=0.5, single=0.9), Block(), Rejection(drafting="greedy"),
             Mentored(max_divergence=0.2, divergence="tv", drafting="greedy", draft_p_min=0.25), Lenient(lenience=0.5),
             Typical(), Fuzzy(threshold=0.1), Fly()]
    for rule in rules:
        assert eval(repr(rule), namespace) == rule, repr(rule)
    assert repr(Match()) == "Match(drafting='greedy')"
    assert "draft_p_min" not in repr(Rejection()) and "draft_p_min=0.5" in repr(Match(draft_p_min=0.5))
