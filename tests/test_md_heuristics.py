"""The field's heuristics (mdboost.md.heuristics): each sampler against its law (chi-square), each
law against an enumeration written here draft by draft, FLy's block law by enumerating vLLM's
state machine, and the divergence facts of docs/theory.md section 11 ("The field's heuristics")."""

import itertools
import math

import pytest
import scipy.stats as sps
import torch

from mdboost.md.divergences import f_divergence
from mdboost.md.heuristics import Fly, Fuzzy, Lenient, Typical, fly_entropy, typical_threshold
from mdboost.md.rules import Mentored, Rejection, Threshold, threshold_for_budget

LOCAL = [Lenient(lenience=0.6), Lenient(lenience=0.3, drafting="greedy"), Typical(), Typical(epsilon=0.3, delta=0.5),
         Typical(drafting="sampled"), Fuzzy(threshold=0.05), Fuzzy(threshold=0.4, divergence="kl"),
         Fuzzy(threshold=0.3, drafting="greedy", divergence="tv"), Fly(window_acceptance=0.4),
         Fly(window_acceptance=0.7, drafting="sampled", entropy_threshold=0.2)]


def _pair(vocab, seed, alpha=0.7):
    torch.manual_seed(seed)
    d = torch.distributions.Dirichlet(torch.full((vocab,), alpha, dtype=torch.float64))
    return d.sample(), d.sample()


def _entropy_medusa(q):
    return -sum(float(v) * math.log(float(v) + 1e-5) for v in q)


def _accept_and_residual(rule, p, q, x):
    """Acceptance probability of draft x and the residual distribution, written per rule."""
    vocab = len(p)
    px, qx = float(p[x]), float(q[x])
    sd_resid = [max(float(q[i]) - float(p[i]), 0.0) for i in range(vocab)]
    if isinstance(rule, Lenient):
        l = rule.lenience
        t = min(1.0, qx / (l * px))
        resid = [max(float(q[i]) - l * float(p[i]), 0.0) for i in range(vocab)]
    elif isinstance(rule, Typical):
        tau = min(rule.epsilon, rule.delta * math.exp(-_entropy_medusa(q)))
        t = 1.0 if qx > tau else 0.0
        top = max(range(vocab), key=lambda i: (float(q[i]), -i))
        resid = [1.0 if i == top else 0.0 for i in range(vocab)]
    elif isinstance(rule, Fuzzy):
        d = float(f_divergence(p, q, rule.divergence))
        t = 1.0 if d <= rule.threshold else min(1.0, qx / px)
        resid = sd_resid
    else:  # Fly, first position of a block with kappa = window_acceptance
        top = sorted((float(v) for v in q), reverse=True)[:rule.entropy_top_k]
        h = -sum(v * math.log(v) for v in top if v > 0)
        m = min(1.0, qx / px)
        gate = h >= rule.entropy_threshold and qx > 0
        t = m + (1 - m) * (rule.window_acceptance if gate else 0.0)
        resid = sd_resid
    total = sum(resid)
    return t, ([r / total for r in resid] if total > 0 else [float(v) for v in q])


def _law_by_enumeration(rule, p, q):
    vocab = len(p)
    drafts = [(int(torch.argmax(p)), 1.0)] if rule.drafting == "greedy" else [(x, float(p[x])) for x in range(vocab)]
    prop = torch.zeros_like(p)
    for x, w in drafts:
        prop[x] = w
    emitted, acc = [0.0] * vocab, 0.0
    for x, w in drafts:
        t, resid = _accept_and_residual(rule, prop, q, x)
        acc += w * t
        emitted[x] += w * t
        for i in range(vocab):
            emitted[i] += w * (1 - t) * resid[i]
    return acc, emitted


@pytest.mark.parametrize("rule", LOCAL, ids=repr)
@pytest.mark.parametrize("seed", range(4))
def test_law_equals_enumeration(rule, seed):
    p, q = _pair(6, seed, alpha=0.6 + 0.2 * seed)
    law = rule.law(p, q)
    acc, emitted = _law_by_enumeration(rule, p, q)
    assert float(law.acceptance) == pytest.approx(acc, abs=1e-12)
    assert law.emitted.tolist() == pytest.approx(emitted, abs=1e-12)
    assert float(law.emitted.sum()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("rule", [r for r in LOCAL if not isinstance(r, Fly)], ids=repr)
def test_sampler_follows_the_closed_form(rule):
    """K = 2 drafts a row: the first emitted token follows law(position 0).emitted and the first
    test passes with frequency law(position 0).acceptance (chi-square / binomial)."""
    vocab, n = 6, 40000
    p0, q0 = _pair(vocab, 11, alpha=1.0)
    p1, q1 = _pair(vocab, 12, alpha=1.0)
    q2 = _pair(vocab, 13)[1]
    p = torch.stack([p0, p1]).expand(n, 2, vocab)
    q = torch.stack([q0, q1, q2]).expand(n, 3, vocab)
    g = torch.Generator().manual_seed(5)
    tokens = p.argmax(-1) if rule.drafting == "greedy" else \
        torch.multinomial(p.reshape(-1, vocab), 1, generator=g).view(n, 2)
    out = rule.verify(tokens, p, q, generator=g)
    law = rule.law(p0, q0)
    _check_frequencies(out.tokens[:, 0], (out.num_accepted >= 1).double().mean(), law, n, vocab)
    assert torch.allclose(out.acceptance_probability[0].double(),
                          torch.stack([law.acceptance, rule.law(p1, q1).acceptance]), atol=1e-9)


def _check_frequencies(first, accepted, law, n, vocab):
    se = math.sqrt(float(law.acceptance) * (1 - float(law.acceptance)) / n) + 1e-9
    assert abs(float(accepted) - float(law.acceptance)) < 5 * se
    counts = torch.bincount(first, minlength=vocab).double()
    expected = law.emitted * n
    keep = expected > 5
    if int(keep.sum()) > 1:
        chi2 = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
        assert sps.chi2.sf(chi2, int(keep.sum()) - 1) > 1e-3
    assert counts[~keep].sum() <= max(5.0, 3 * float(expected[~keep].sum()) + 3)


# FLy: vLLM's state machine, enumerated here over every draft and every native outcome


def _fly_block_law(rule, p, q):
    """Law of the emitted block (a tuple of tokens) under FLy, K = len(p) drafts, written as a
    recursion over vLLM's kernel (rejection_sampler_utils.py:590-755), independent of the sampler."""
    num_draft, vocab = p.shape
    greedy = rule.drafting == "greedy"

    def entropy(row):
        top = sorted((float(v) for v in row), reverse=True)[:rule.entropy_top_k]
        return -sum(v * math.log(v) for v in top if v > 0)

    def residual(i, x):
        prop = [1.0 if j == x else 0.0 for j in range(vocab)] if greedy else [float(v) for v in p[i]]
        w = [max(float(q[i, j]) - prop[j], 0.0) for j in range(vocab)]
        s = sum(w)
        return [v / s for v in w] if s > 0 else [float(v) for v in q[i]]

    out = {}

    def add(key, prob):
        out[key] = out.get(key, 0.0) + prob

    def finish(drafts, length, prob):
        if length == num_draft:
            weights = [float(v) for v in q[num_draft]]
        else:
            weights = residual(length, drafts[length])
        for y, w in enumerate(weights):
            if w > 0:
                add(tuple(drafts[:length]) + (y,), prob * w)

    options = [[(int(torch.argmax(p[i])), 1.0)] if greedy else
               [(x, float(p[i, x])) for x in range(vocab) if p[i, x] > 0] for i in range(num_draft)]
    for combo in itertools.product(*options):
        drafts = [x for x, _ in combo]
        weight = math.prod(w for _, w in combo)
        rates = [min(1.0, float(q[i, x]) / (1.0 if greedy else float(p[i, x]))) for i, x in enumerate(drafts)]

        def walk(i, length, pending, prob):
            if i == num_draft:
                return finish(drafts, length, prob)
            for ok, w in ((True, rates[i]), (False, 1 - rates[i])):
                if w == 0:
                    continue
                if pending >= 0:
                    if not ok:
                        finish(drafts, length, prob * w)
                    elif i - pending == rule.window:
                        walk(i + 1, i + 1, -1, prob * w)
                    else:
                        walk(i + 1, length, pending, prob * w)
                elif ok:
                    walk(i + 1, i + 1, -1, prob * w)
                elif (entropy(q[i]) >= rule.entropy_threshold and float(q[i, drafts[i]]) > 0
                      and i + rule.window < num_draft):
                    walk(i + 1, length, i, prob * w)
                else:
                    finish(drafts, length, prob * w)

        walk(0, 0, -1, weight)
    return out


FLY = [Fly(window=1), Fly(window=2, drafting="sampled"), Fly(window=1, drafting="sampled", entropy_threshold=0.0),
       Fly(window=2, entropy_threshold=0.5)]


@pytest.mark.parametrize("rule", FLY, ids=repr)
def test_fly_first_position_law_is_the_block_enumeration_marginal(rule):
    """The first emitted token's marginal under the whole-block enumeration equals Fly.law with
    kappa = prod over the window of the native acceptances 1 - TV(p_j, q_j)."""
    num_draft, vocab = 3, 3
    torch.manual_seed(7)
    d = torch.distributions.Dirichlet(torch.full((vocab,), 1.0, dtype=torch.float64))
    p, q = d.sample((num_draft,)), d.sample((num_draft + 1,))
    block = _fly_block_law(rule, p, q)
    assert sum(block.values()) == pytest.approx(1.0, abs=1e-12)
    first = [sum(w for k, w in block.items() if k[0] == y) for y in range(vocab)]
    def proposal(j):
        return torch.zeros_like(p[j]).scatter_(0, p[j].argmax().view(1), 1.0) if rule.drafting == "greedy" else p[j]

    natives = [float(torch.minimum(proposal(j), q[j]).sum()) for j in range(num_draft)]
    kappa = math.prod(natives[1:1 + rule.window])
    law = Fly(window=rule.window, entropy_threshold=rule.entropy_threshold, drafting=rule.drafting,
              window_acceptance=kappa).law(p[0], q[0])
    assert law.emitted.tolist() == pytest.approx(first, abs=1e-12)
    kept = sum(w for k, w in block.items() if len(k) > 1)  # the first draft stays in the output
    assert float(law.acceptance) == pytest.approx(kept, abs=1e-12)


@pytest.mark.parametrize("rule", FLY, ids=repr)
def test_fly_sampler_follows_the_block_enumeration(rule):
    """Whole emitted blocks (K = 3, V = 3) against the enumeration, chi-square."""
    num_draft, vocab, n = 3, 3, 60000
    torch.manual_seed(7)
    d = torch.distributions.Dirichlet(torch.full((vocab,), 1.0, dtype=torch.float64))
    p, q = d.sample((num_draft,)), d.sample((num_draft + 1,))
    block = _fly_block_law(rule, p, q)
    g = torch.Generator().manual_seed(3)
    pp, qq = p.expand(n, num_draft, vocab), q.expand(n, num_draft + 1, vocab)
    tokens = pp.argmax(-1) if rule.drafting == "greedy" else \
        torch.multinomial(pp.reshape(-1, vocab), 1, replacement=True, generator=g).view(n, num_draft)
    out = rule.verify(tokens, pp, qq, generator=g)
    seen = {}
    for row in out.tokens.tolist():
        key = tuple(t for t in row if t >= 0)
        seen[key] = seen.get(key, 0) + 1
    assert set(seen) <= set(block)
    keys = [k for k in block if block[k] * n > 5]
    expected = torch.tensor([block[k] * n for k in keys])
    counts = torch.tensor([float(seen.get(k, 0)) for k in keys])
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert sps.chi2.sf(chi2, len(keys) - 1) > 1e-3


def test_fly_reported_position_law_uses_the_next_window():
    p, q = _pair(5, 1)
    p2, q2 = _pair(5, 2)
    pp = torch.stack([p, p2, p]).unsqueeze(0)
    qq = torch.stack([q, q2, q, q2]).unsqueeze(0)
    rule = Fly(window=1, drafting="sampled", entropy_threshold=0.0)
    out = rule.verify(torch.tensor([[0, 1, 2]]), pp, qq, generator=torch.Generator().manual_seed(0))
    kappa = float(torch.minimum(p2, q2).sum())
    first = Fly(window=1, drafting="sampled", entropy_threshold=0.0, window_acceptance=kappa).law(p, q)
    last = Rejection().law(p, q)  # k + W >= K: no deferral, plain SD
    assert float(out.acceptance_probability[0, 0]) == pytest.approx(float(first.acceptance), abs=1e-12)
    assert float(out.acceptance_probability[0, 2]) == pytest.approx(float(last.acceptance), abs=1e-12)


def test_fly_entropy_is_vllms_top_k_entropy():
    q = torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64)
    want = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.15 * math.log(0.15))
    assert float(fly_entropy(q, 3)) == pytest.approx(want, abs=1e-12)
    assert float(fly_entropy(q, 10)) == pytest.approx(want - 0.05 * math.log(0.05), abs=1e-12)


def test_typical_threshold_is_medusas():
    q = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    h = -sum(v * math.log(v + 1e-5) for v in (0.7, 0.2, 0.1))
    assert float(typical_threshold(q, 0.09, 0.3)) == pytest.approx(min(0.09, 0.3 * math.exp(-h)), abs=1e-15)
    assert float(typical_threshold(q, 0.01, 0.3)) == pytest.approx(0.01, abs=1e-15)


# divergence facts (docs/theory.md, section 11, "The field's heuristics")


@pytest.mark.parametrize("divergence", ["kl", "tv", "js", "hellinger"])
def test_fuzzy_stays_within_its_threshold_and_its_greedy_form_is_sglangs_threshold(divergence):
    threshold = 0.2
    torch.manual_seed(1)
    d = torch.distributions.Dirichlet(torch.full((6,), 0.5, dtype=torch.float64))
    p, q = d.sample((500,)), d.sample((500,))
    rule = Fuzzy(threshold=threshold, divergence=divergence)
    assert float(rule.achieved_divergence(p, q, divergence).max()) <= threshold + 1e-12
    greedy = Fuzzy(threshold=threshold, divergence=divergence, drafting="greedy")
    c = threshold_for_budget(threshold, divergence)
    sglang = Threshold(accept=1.0, single=c)  # emit x surely iff q_x >= c, else SD on the one-hot
    keep = (q.gather(-1, p.argmax(-1, keepdim=True)).squeeze(-1) - c).abs() > 1e-9  # away from the tie
    assert torch.allclose(greedy.law(p, q).emitted[keep], sglang.law(p, q).emitted[keep], atol=1e-12)


def test_lenient_is_the_clamp_at_one_over_l():
    """pi = min(p, q / l) + (1 - beta) (q - l p)_+ / Z: the clamp pi(a, b) of section 4 at
    1 + a = 1 - b = 1 / l, checked against its direct formula."""
    p, q = _pair(7, 3)
    for lenience in (0.2, 0.5, 0.9):
        kept = torch.minimum(p, q / lenience)
        resid = (q - lenience * p).clamp(min=0)
        want = kept + (1 - kept.sum()) * resid / resid.sum()
        assert torch.allclose(Lenient(lenience=lenience).law(p, q).emitted, want, atol=1e-12)


@pytest.mark.parametrize("rule", [Lenient(lenience=0.4), Typical(drafting="sampled"), Fuzzy(threshold=0.1),
                                  Fly(window_acceptance=0.5, drafting="sampled")], ids=repr)
def test_mentored_accepts_at_least_each_heuristic_at_its_achieved_divergence(rule):
    """MD is the optimum at every position: with the budget set to the divergence a heuristic
    achieves there, MD's acceptance is at least the heuristic's."""
    for seed in range(6):
        p, q = _pair(8, 300 + seed, alpha=0.5)
        law = rule.law(p, q)
        achieved = float(f_divergence(law.emitted, q, "kl"))
        if not math.isfinite(achieved):
            continue
        md = Mentored(max_divergence=achieved, drafting=rule.drafting)
        assert float(md.law(p, q).acceptance) >= float(law.acceptance) - 1e-9


def test_arguments_are_checked_by_name():
    with pytest.raises(ValueError, match=r"lenience must be a number in \(0.0, 1.0\], got 0"):
        Lenient(lenience=0)
    with pytest.raises(ValueError, match="epsilon must be a number"):
        Typical(epsilon=1.5)
    with pytest.raises(ValueError, match="delta must be a number"):
        Typical(delta=True)
    with pytest.raises(ValueError, match="threshold must be a number"):
        Fuzzy(threshold=-0.1)
    with pytest.raises(ValueError, match="divergence"):
        Fuzzy(divergence="nope")
    with pytest.raises(ValueError, match="window must be an int >= 1, got 0"):
        Fly(window=0)
    with pytest.raises(ValueError, match="entropy_top_k must be an int >= 1"):
        Fly(entropy_top_k=2.0)
    with pytest.raises(ValueError, match="window_acceptance must be a number"):
        Fly(window_acceptance=1.2)
    p, q = _pair(4, 0)
    with pytest.raises(ValueError, match="needs window_acceptance"):
        Fly().law(p, q)


def test_engines():
    assert Lenient(lenience=0.5).engines == ("mdboost", "hf")
    assert Typical().engines == ("mdboost", "hf")
    assert Fuzzy(threshold=0.1).engines == ("mdboost", "hf")
    assert Fly().engines == ("mdboost", "hf", "vllm")
    assert Lenient().lossless and not Lenient(lenience=0.5).lossless
