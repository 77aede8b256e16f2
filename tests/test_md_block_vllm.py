"""vLLM's own tests of block verification, ported to :func:`mdboost.md.block.block_verify`.

Source: vllm-project/vllm, ``tests/v1/spec_decode/test_rejection_sampler_utils.py`` at commit
0822b17a5fbdb70b87c755232f3de0dff8a81b72 (tests of ``rejection_sample(...,
use_block_verification=True)`` in ``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py``,
the code vLLM 0.34.0 ships). Ported: ``test_block_verification_rejection_sample`` (every output
position follows the target, with draft logits and with one-hot drafts),
``test_block_verification_accepts_at_least_as_many`` and ``test_greedy_rejection_sample`` (a
temperature-0 target emits its argmax), with vLLM's chi-square criterion
``_assert_distribution_match``. Changed: probabilities instead of logits (vLLM divides the draft
logits by the temperature on load; here both softmaxes take it), a vocabulary of 64 instead of
4096 and 20000 trials (CPU memory: the ``[B, K + 1, V]`` target rows). Not ported: the
placeholder (``-1`` draft id) tests, as mdboost's contract has no placeholder drafts
(``draft_tokens`` outside ``[0, V)`` raise ValueError).
"""

from __future__ import annotations

import math

import pytest
import torch

from mdboost.md.block import block_verify
from mdboost.md.verify import verify

VOCAB_SIZE = 64
NUM_TRIALS = 20000


def _inputs(target_logits_1d, draft_logits_1d, k, temperature, num_trials, has_draft_logits, gen):
    """vLLM's ``_build_rejection_sample_inputs``: one fixed target and draft, drafts by multinomial."""
    target = torch.softmax(target_logits_1d.double() / temperature, -1)
    draft = torch.softmax(draft_logits_1d.double() / temperature, -1)
    tokens = torch.multinomial(draft.expand(num_trials, -1), k, replacement=True, generator=gen)  # [B, K]
    draft_probs = draft.expand(num_trials, k, -1)
    if not has_draft_logits:  # vLLM: draft_logits=None verifies the drafts as one-hot
        draft_probs = torch.nn.functional.one_hot(tokens, target.shape[-1]).double()
    return tokens, draft_probs.contiguous(), target.expand(num_trials, k + 1, -1).contiguous(), target


def _assert_distribution_match(sampled_tokens, target_probs, label="", min_expected=5.0):
    """vLLM's criterion: chi-square below ``df + 10 sqrt(2 df)``, bins expected under 5 merged."""
    num_samples = sampled_tokens.shape[0]
    observed = torch.bincount(sampled_tokens, minlength=target_probs.shape[0]).double()
    expected = target_probs * num_samples
    sufficient = expected >= min_expected
    obs, exp = observed[sufficient], expected[sufficient]
    if expected[~sufficient].sum() >= min_expected:
        obs = torch.cat([obs, observed[~sufficient].sum().unsqueeze(0)])
        exp = torch.cat([exp, expected[~sufficient].sum().unsqueeze(0)])
    chi2, df = ((obs - exp) ** 2 / exp).sum().item(), obs.shape[0] - 1
    if df < 1:  # too few rows reach this position to bin (vLLM returns here too)
        return
    assert chi2 < df + 10 * math.sqrt(2 * df), f"[{label}] chi2={chi2:.1f}, df={df}"


@pytest.mark.parametrize("num_speculative_steps,temperature", [(1, 0.6), (3, 0.6), (1, 1.0), (3, 1.0), (5, 1.0)])
@pytest.mark.parametrize("has_draft_logits", [True, False])
def test_block_verification_rejection_sample(num_speculative_steps, temperature, has_draft_logits):
    """Every output position follows the target, with draft logits and with one-hot drafts."""
    gen = torch.Generator().manual_seed(42)
    target_logits_1d = torch.randn(VOCAB_SIZE, generator=gen, dtype=torch.float64)
    draft_logits_1d = torch.randn(VOCAB_SIZE, generator=gen, dtype=torch.float64)
    tokens, draft_probs, target_probs, target = _inputs(target_logits_1d, draft_logits_1d, num_speculative_steps,
                                                        temperature, NUM_TRIALS, has_draft_logits, gen)
    res = block_verify(tokens, draft_probs, target_probs, generator=gen)
    num_sampled = res.num_accepted + 1
    for pos in range(num_speculative_steps + 1):
        accepted_mask = num_sampled >= pos + 1
        _assert_distribution_match(res.tokens[accepted_mask, pos], target, label=f"position {pos}")


@pytest.mark.parametrize("num_speculative_steps", [3, 5])
def test_block_verification_accepts_at_least_as_many(num_speculative_steps):
    """With a draft close to the target, the mean accepted length is no worse than token-wise."""
    gen = torch.Generator().manual_seed(0)
    target_logits_1d = torch.randn(VOCAB_SIZE, generator=gen, dtype=torch.float64)
    draft_logits_1d = target_logits_1d + 0.5 * torch.randn(VOCAB_SIZE, generator=gen, dtype=torch.float64)
    tokens, draft_probs, target_probs, _ = _inputs(target_logits_1d, draft_logits_1d, num_speculative_steps, 1.0,
                                                   NUM_TRIALS, True, gen)
    standard = verify(tokens, draft_probs, target_probs, generator=gen).num_accepted.double().mean().item()
    block = block_verify(tokens, draft_probs, target_probs, generator=gen).num_accepted.double().mean().item()
    assert block >= standard - 1e-2, f"block {block:.4f} < standard {standard:.4f}"


@pytest.mark.parametrize("num_speculative_steps", [1, 3])
def test_greedy_rejection_sample(num_speculative_steps):
    """A temperature-0 target (one-hot at its argmax) emits its argmax at every position."""
    gen = torch.Generator().manual_seed(42)
    target_logits_1d = torch.randn(VOCAB_SIZE, generator=gen, dtype=torch.float64)
    draft_logits_1d = torch.randn(VOCAB_SIZE, generator=gen, dtype=torch.float64)
    tokens, draft_probs, _, _ = _inputs(target_logits_1d, draft_logits_1d, num_speculative_steps, 1.0, NUM_TRIALS,
                                        True, gen)
    argmax = int(target_logits_1d.argmax())
    target_probs = torch.zeros(NUM_TRIALS, num_speculative_steps + 1, VOCAB_SIZE, dtype=torch.float64)
    target_probs[..., argmax] = 1.0
    res = block_verify(tokens, draft_probs, target_probs, generator=gen)
    steps = torch.arange(num_speculative_steps + 1).unsqueeze(0)
    assert (res.tokens[steps <= res.num_accepted.unsqueeze(1)] == argmax).all()
