"""The engine's mentor: an explicit emitted distribution per drafted position, whatever the drafter."""

import numpy as np
import pytest
import torch
from scipy import stats as sps

from mdboost.engine import GenerationSettings, ModelDrafter, NgramAdapter, generate
from mdboost.md.probs import logits_to_probs
from mdboost.md.tv_set import BoostedMentor
from mdboost.models.ngram import NgramDrafter
from mdboost.models.tiny import tiny_llama


def _probs(model, ids):  # [n, T] -> [n, V] next-token distribution, float64
    with torch.no_grad():
        return logits_to_probs(model(ids).logits[:, -1].double())


def test_boosted_mentor_first_two_tokens_follow_the_mentored_joint():
    """``pi_1(x1) q(x2 | x1)`` with ``pi_1 = mentor(p_1, q_1)``: with two new tokens the engine drafts
    one token; the second is the target's (the bonus token, or an undrafted step after a rejection)."""
    vocab, n = 8, 6000
    target = tiny_llama(vocab_size=vocab, num_layers=2, seed=3)
    draft_model = tiny_llama(vocab_size=vocab, num_layers=1, seed=4)
    mentor = BoostedMentor(c_target=0.6, c_drafter=0.9, max_divergence=0.15)
    ids = torch.tensor([[5, 6, 7, 5, 6]])
    out = generate(target, ids.repeat(n, 1), GenerationSettings(gamma=2, max_new_tokens=2, mentor=mentor),
                   drafter=ModelDrafter(draft_model), generator=torch.Generator().manual_seed(1))
    assert out.stats.mode == "md" and out.stats.num_draft_tokens > 0
    pi1 = mentor(_probs(draft_model, ids)[None], _probs(target, ids)[None])[0, 0]  # [V]
    seqs = torch.cat([ids.repeat(vocab, 1), torch.arange(vocab)[:, None]], dim=1)
    expected = (pi1[:, None] * _probs(target, seqs)).numpy() * n
    assert float((pi1 - _probs(target, ids)[0]).abs().max()) > 0.01  # pi_1 is not the target's
    pairs = out.sequences[:, -2:].numpy()
    counts = np.zeros((vocab, vocab))
    np.add.at(counts, (pairs[:, 0], pairs[:, 1]), 1)
    keep = expected > 1e-9
    assert counts[~keep].sum() == 0
    chi2 = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    assert sps.chi2.sf(chi2, keep.sum() - 1) > 1e-3


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_target_as_mentor_is_speculative_decoding_token_for_token(drafter):
    vocab = 16
    target = tiny_llama(vocab_size=vocab, num_layers=2, seed=0)
    d = (NgramAdapter(NgramDrafter(1)) if drafter == "ngram"
         else ModelDrafter(tiny_llama(vocab_size=vocab, num_layers=1, seed=1)))
    ids = torch.randint(4, vocab, (6, 7), generator=torch.Generator().manual_seed(0))
    base = dict(gamma=3, max_new_tokens=10)
    sd = generate(target, ids, GenerationSettings(**base), drafter=d, generator=torch.Generator().manual_seed(5))
    towards = generate(target, ids, GenerationSettings(**base, mentor=lambda p, q: q), drafter=d,
                       generator=torch.Generator().manual_seed(5))
    assert torch.equal(sd.sequences, towards.sequences)
    assert towards.stats.mode == "md" and towards.stats.num_budget_accepted == 0


def test_mentor_settings_are_checked():
    with pytest.raises(ValueError, match="mentor sets the emitted distribution"):
        GenerationSettings(mentor=lambda p, q: q, max_divergence=0.1)
    with pytest.raises(ValueError, match="mentor sets the emitted distribution"):
        GenerationSettings(mentor=lambda p, q: q, md_top_k=4)
    with pytest.raises(TypeError, match="mentor must be callable"):
        GenerationSettings(mentor=0.1)
    s = GenerationSettings(mentor=BoostedMentor(1.0, 1.0, 0.1))
    assert s.lossy and s.verify_args["mentor"] is s.mentor
    assert "mentor" not in GenerationSettings(max_divergence=0.1).verify_args
