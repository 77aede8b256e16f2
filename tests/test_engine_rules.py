"""The engine runs every verification rule (mdboost.md.rules): the first emitted token of a
generation follows the rule's law at the prompt's last position (chi-square), greedy drafting
drafts the argmax, and the settings check the rule."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats as sps

from mdboost.engine import Drafter, DraftSession, GenerationSettings, ModelDrafter, generate
from mdboost.md.drafting import draft_confidence
from mdboost.md.probs import logits_to_probs
from mdboost.md.rules import Block, Match, Mentored, Rejection, Threshold
from mdboost.models.tiny import tiny_llama

VOCAB = 8
IDS = torch.tensor([[5, 6, 7, 5, 6]])


@pytest.fixture(scope="module")
def models():
    return tiny_llama(vocab_size=VOCAB, num_layers=2, seed=3), tiny_llama(vocab_size=VOCAB, num_layers=1, seed=4)


def _first_position(model):
    with torch.no_grad():
        return logits_to_probs(model(IDS).logits[0, -1].double(), temperature=1.0)


@pytest.mark.parametrize("rule", [Threshold(accept=0.5), Match(), Match(draft_p_min=0.3), Rejection(drafting="greedy"),
                                  Mentored(max_divergence=0.3, drafting="greedy"), Threshold(accept=0.6, drafting="sampled"),
                                  Block()],
                         ids=repr)
def test_first_token_follows_the_rules_law(models, rule):
    target, draft_model = models
    n = 6000
    out = generate(target, IDS.repeat(n, 1), GenerationSettings(gamma=2, max_new_tokens=2, temperature=1.0, rule=rule),
                   drafter=ModelDrafter(draft_model), generator=torch.Generator().manual_seed(2))
    q, p = _first_position(target), _first_position(draft_model)
    law = rule.law(p, q)
    counts = np.bincount(out.sequences[:, IDS.shape[1]].numpy(), minlength=VOCAB)  # the first new token
    expected = law.emitted.numpy() * n
    keep = expected > 5
    chi2 = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    assert sps.chi2.sf(chi2, keep.sum() - 1) > 1e-3
    assert counts[~keep].sum() <= 3 * expected[~keep].sum() + 5
    if rule.drafting == "greedy":  # greedy drafting: the law differs from sampled drafting's at this pair
        sampled = replace(rule, drafting="sampled", draft_p_min=0.0).law(p, q)
        assert not torch.allclose(sampled.acceptance, law.acceptance, atol=0.02)


def test_greedy_drafting_drafts_the_argmax(models):
    target, draft_model = models
    settings = GenerationSettings(gamma=3, max_new_tokens=6, temperature=1.0, rule=Threshold(accept=0.7))
    out = generate(target, IDS.repeat(4, 1), settings, drafter=ModelDrafter(draft_model),
                   generator=torch.Generator().manual_seed(0))
    # every emitted draft token is the drafter's argmax after the tokens before it
    seqs = out.sequences
    with torch.no_grad():
        argmax = draft_model(seqs).logits.argmax(-1)  # [B, L]: the argmax after each prefix
    assert out.stats.num_accepted_tokens > 0
    accepted_total = 0
    for b in range(seqs.shape[0]):
        for j in range(IDS.shape[1], seqs.shape[1]):
            if seqs[b, j] == argmax[b, j - 1]:
                accepted_total += 1
    assert accepted_total >= out.stats.num_accepted_tokens


def test_settings_check_the_rule():
    with pytest.raises(TypeError, match="rule must be a mdboost.md.rules.Rule"):
        GenerationSettings(rule="threshold")
    with pytest.raises(ValueError, match="rule sets the verification"):
        GenerationSettings(rule=Match(), max_divergence=0.1)
    with pytest.raises(ValueError, match="differs from the Mentored rule's divergence='tv'"):
        GenerationSettings(rule=Mentored(max_divergence=0.1, divergence="tv"), divergence="js")
    settings = GenerationSettings(rule=Mentored(max_divergence=0.1, divergence="tv"), md_solve="needed")
    assert settings.lossy and not settings.greedy_drafts
    assert settings.verify_args["rule"].solve == "needed" and settings.verify_args["divergence"] == "tv"
    assert not GenerationSettings(rule=Match()).lossy and GenerationSettings(rule=Match()).greedy_drafts


class _Recording(Drafter):
    """A drafter that records each proposal: the rows' contexts, drafts and lengths."""

    def __init__(self, inner):
        self.inner, self.proposals = inner, []

    def start(self, prompts, lm, settings):
        inner, proposals = self.inner.start(prompts, lm, settings), self.proposals

        class Session(DraftSession):
            def propose(self, contexts, max_tokens, generator):
                tokens, probs, lengths = inner.propose(contexts, max_tokens, generator)
                proposals.append(([list(c) for c in contexts], tokens.tolist(), list(lengths), max_tokens))
                return tokens, probs, lengths

            def commit(self, num_accepted, new_tokens):
                inner.commit(num_accepted, new_tokens)

            def update(self, num_accepted, lengths):
                inner.update(num_accepted, lengths)

        return Session()


@pytest.mark.parametrize("share", [False, True], ids=["private_cache", "shared_cache"])
def test_draft_floor_stops_before_the_first_unconfident_position(models, share):
    """llama.cpp's --spec-draft-p-min: each step drafts the argmax while the drafter's confidence
    (top-10 softmax of its logits) is at least the floor, and stops before the first position
    below it; checked against the drafter run afresh on every context and draft prefix."""
    target, draft_model = models
    if share:
        from mdboost.models.drafters import early_exit_model
        draft_model = early_exit_model(target, 1)
    gamma, floor = 4, 0.3
    recording = _Recording(ModelDrafter(draft_model))
    rows = IDS.repeat(6, 1)
    settings = GenerationSettings(gamma=gamma, max_new_tokens=24, temperature=1.0, rule=Match(draft_p_min=floor))
    generate(target, rows, settings, drafter=recording, generator=torch.Generator().manual_seed(5))
    seen = []
    for contexts, tokens, lengths, limit in recording.proposals:
        for context, drafts, length in zip(contexts, tokens, lengths):
            prefix, expected = list(context), 0
            with torch.no_grad():
                while expected < min(gamma, limit):
                    logits = draft_model(torch.tensor([prefix])).logits[0, -1]
                    if float(draft_confidence(logits)) < floor:
                        break
                    assert drafts[expected] == int(logits.argmax())
                    prefix.append(drafts[expected])
                    expected += 1
            assert length == expected, (context, drafts, length)
            seen.append(length)
    assert 0 in seen and min(gamma, 2) <= max(seen)  # the floor stopped some steps at once, others later


def test_a_draft_floor_needs_greedy_drafting_and_narrows_the_engines():
    with pytest.raises(ValueError, match="draft_p_min=0.5 needs drafting='greedy'"):
        Rejection(draft_p_min=0.5)
    with pytest.raises(ValueError, match=r"draft_p_min must be a number in \[0, 1\), got 1.0"):
        Match(draft_p_min=1.0)
    assert Match(draft_p_min=0.5).engines == ("mdboost", "hf", "llamacpp")
    assert Threshold(accept=0.5, draft_p_min=0.5).engines == ("mdboost", "hf")
    assert GenerationSettings(rule=Match(draft_p_min=0.25)).draft_p_min == 0.25
