"""SGLang's own tests of ``tree_speculative_sampling_target_only``, run against the torch port.

Ported (expected outputs unchanged; ``device="cuda"`` becomes the CPU, ``torch.rand`` draws from
a seeded generator) from sgl-project/sglang:

* ``python/sglang/kernels/aot/tests/speculative/test_speculative_sampling.py`` at commit
  04efa5146629cc716f3c9fcd96d5faa99ff837b2: the two-request tree with thresholds (1, 1) and
  (0, 0), zero-probability candidates, the zero coin, the coin on a bucket boundary;
* ``python/sglang/jit_kernel/tests/test_speculative_sampling.py`` at commit
  561ab38e622bdb3459fc7a099392a94729a4814a: the linear-chain smoke test and the two
  accept-all thresholds (its JIT-versus-AOT comparison needs both GPU builds and is not ported).

The kernel is SGLang 0.5.23's (``tests/engines/sglang_tree.py`` names the files and lines).
Two tests of our own follow: the port at thresholds (1, 1) samples the target exactly on a tree
with siblings, and the first emitted token on a chain follows the threshold rule's closed form.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import chisquare

from tests.engines.sglang_tree import tree_speculative_sampling_target_only, verify_chain

# --- sglang python/sglang/kernels/aot/tests/speculative/test_speculative_sampling.py @ 04efa51 ---

TREE_CASES = [
    (1, 1, [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18], [[0, 3, 4, 5], [6, 10, 11, -1]], [3, 2]),
    # (0, 0): zero-probability candidates must not be accepted just because the single-token
    # threshold is zero (kernel line 80, has_target_mass).
    (0, 0, [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18], [[0, 3, 4, 5], [6, 10, 11, -1]], [3, 2]),
]


@pytest.mark.parametrize("threshold_single, threshold_acc, expected_predicts, expected_accept_index, "
                         "expected_accept_token_num", TREE_CASES)
def test_tree_speculative_sampling_target_only(threshold_single, threshold_acc, expected_predicts,
                                               expected_accept_index, expected_accept_token_num):
    gen = torch.Generator().manual_seed(0)
    candidates = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])
    retrive_index = torch.tensor([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]])
    retrive_next_token = torch.tensor([[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]])
    retrive_next_sibling = torch.tensor([[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]])
    target_logits = torch.full((2, 6, 20), 1.0)
    target_logits[0, 0, 3] = 10
    target_logits[0, 3, 4] = 10
    target_logits[0, 4, 5] = 10
    target_logits[1, 0, 11] = 10
    target_logits[1, 4, 12] = 10
    for i in range(target_logits.shape[0]):
        for j in range(target_logits.shape[1]):
            if torch.max(target_logits[i, j]) < 10:
                target_logits[i, j, 18] = 10
    temperatures = torch.tensor([0.01, 0.01])
    bs, num_draft_tokens = candidates.shape
    num_spec_step = len(expected_accept_index[0])
    predicts = torch.full((len(expected_predicts),), -1, dtype=torch.int32)
    accept_index = torch.full((bs, num_spec_step), -1, dtype=torch.int32)
    accept_token_num = torch.full((bs,), 0, dtype=torch.int32)
    target_probs = F.softmax(target_logits / temperatures.unsqueeze(1).unsqueeze(1), dim=-1)
    draft_probs = torch.full_like(target_probs, 0)
    coins = torch.rand(bs, num_draft_tokens, generator=gen)
    coins_for_final_sampling = torch.rand(bs, generator=gen)

    tree_speculative_sampling_target_only(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_token_num, candidates=candidates,
        retrive_index=retrive_index, retrive_next_token=retrive_next_token, retrive_next_sibling=retrive_next_sibling,
        uniform_samples=coins, uniform_samples_for_final_sampling=coins_for_final_sampling,
        target_probs=target_probs, draft_probs=draft_probs, threshold_single=threshold_single,
        threshold_acc=threshold_acc, deterministic=True)

    assert predicts.tolist() == expected_predicts
    assert accept_index.tolist() == expected_accept_index
    assert accept_token_num.tolist() == expected_accept_token_num


def _run_target_only_sampling(candidates, retrive_next_token, retrive_next_sibling, target_probs, uniform_samples,
                              threshold_single=1.0, threshold_acc=1.0):
    num_draft_tokens = len(candidates)
    target_probs = torch.tensor([target_probs], dtype=torch.float32)
    predicts = torch.full((num_draft_tokens,), -1, dtype=torch.int32)
    accept_index = torch.full((1, 2), -1, dtype=torch.int32)
    accept_token_num = torch.zeros(1, dtype=torch.int32)
    tree_speculative_sampling_target_only(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_token_num,
        candidates=torch.tensor([candidates]), retrive_index=torch.arange(num_draft_tokens).unsqueeze(0),
        retrive_next_token=torch.tensor([retrive_next_token]), retrive_next_sibling=torch.tensor([retrive_next_sibling]),
        uniform_samples=torch.tensor([uniform_samples], dtype=torch.float32),
        uniform_samples_for_final_sampling=torch.zeros(1), target_probs=target_probs,
        draft_probs=torch.zeros_like(target_probs), threshold_single=threshold_single, threshold_acc=threshold_acc)
    return predicts, accept_index, accept_token_num


@pytest.mark.parametrize("threshold_single", [0.0, 1.0])
def test_zero_probability_candidate_is_never_accepted(threshold_single):
    _, _, accept_token_num = _run_target_only_sampling(
        candidates=[0, 1], retrive_next_token=[1, -1], retrive_next_sibling=[-1, -1],
        target_probs=[[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0]], uniform_samples=[0.0, 0.0],
        threshold_single=threshold_single)
    assert accept_token_num.item() == 0


def test_zero_coin_accepts_positive_probability_candidate():
    _, _, accept_token_num = _run_target_only_sampling(
        candidates=[0, 1], retrive_next_token=[1, -1], retrive_next_sibling=[-1, -1],
        target_probs=[[0.0, 0.25, 0.75, 0.0], [0.0, 0.0, 1.0, 0.0]], uniform_samples=[0.0, 0.0])
    assert accept_token_num.item() == 1


def test_coin_at_bucket_boundary_skips_zero_mass_bucket():
    predicts, _, accept_token_num = _run_target_only_sampling(
        candidates=[0, 1, 2, 3], retrive_next_token=[1, -1, -1, -1], retrive_next_sibling=[-1, 2, 3, -1],
        target_probs=[[0.0, 0.25, 0.0, 0.75], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0]],
        uniform_samples=[0.25, 0.0, 0.0, 0.0])
    assert accept_token_num.item() == 1
    assert predicts[0].item() == 3


# --- sglang python/sglang/jit_kernel/tests/test_speculative_sampling.py @ 561ab38 ---

def make_linear_chain(bs, num_draft_tokens, vocab_size):
    retrive_index = torch.stack([torch.arange(num_draft_tokens)] * bs)
    next_token = torch.arange(1, num_draft_tokens + 1)
    next_token[-1] = -1
    retrive_next_token = next_token.unsqueeze(0).expand(bs, -1).contiguous()
    retrive_next_sibling = torch.full((bs, num_draft_tokens), -1)
    candidates = (torch.arange(num_draft_tokens) % vocab_size).unsqueeze(0).expand(bs, -1).contiguous()
    return retrive_index, retrive_next_token, retrive_next_sibling, candidates


def make_inputs(bs, num_draft_tokens, num_spec_step, vocab_size, seed=42):
    gen = torch.Generator().manual_seed(seed)
    retrive_index, retrive_next_token, retrive_next_sibling, candidates = make_linear_chain(
        bs, num_draft_tokens, vocab_size)
    raw = torch.rand(bs, num_draft_tokens, vocab_size, generator=gen)
    target_probs = raw / raw.sum(dim=-1, keepdim=True)
    return dict(
        predicts=torch.zeros(bs * num_draft_tokens, dtype=torch.int32),
        accept_index=torch.zeros(bs, num_spec_step, dtype=torch.int32),
        accept_token_num=torch.zeros(bs, dtype=torch.int32), candidates=candidates, retrive_index=retrive_index,
        retrive_next_token=retrive_next_token, retrive_next_sibling=retrive_next_sibling,
        uniform_samples=torch.rand(bs, num_draft_tokens, generator=gen),
        uniform_samples_for_final_sampling=torch.rand(bs, generator=gen),
        target_probs=target_probs, draft_probs=target_probs.clone())


@pytest.mark.parametrize("bs,num_draft_tokens,num_spec_step,vocab_size",
                         [(1, 4, 4, 32), (2, 8, 5, 64), (4, 16, 8, 128), (1, 1, 1, 32)])
def test_smoke(bs, num_draft_tokens, num_spec_step, vocab_size):
    inputs = make_inputs(bs, num_draft_tokens, num_spec_step, vocab_size)
    tree_speculative_sampling_target_only(**inputs, threshold_single=0.9, threshold_acc=0.9)
    assert inputs["accept_token_num"].min() >= 0
    assert inputs["accept_token_num"].max() < num_spec_step


@pytest.mark.parametrize("bs", [1, 2])
def test_accept_all_when_threshold_acc_zero(bs):
    """threshold_acc = 0 is floored to 1e-9 and the coins are 0: every draft is accepted."""
    inputs = make_inputs(bs, 4, 4, 32, seed=123)
    inputs["uniform_samples"].fill_(0.0)
    tree_speculative_sampling_target_only(**inputs, threshold_single=0.0, threshold_acc=0.0)
    assert (inputs["accept_token_num"] == 4 - 1).all()


@pytest.mark.parametrize("bs", [1, 2])
def test_accept_all_when_threshold_single_zero(bs):
    """threshold_single = 0 accepts every draft of positive target probability."""
    inputs = make_inputs(bs, 4, 4, 32, seed=456)
    tree_speculative_sampling_target_only(**inputs, threshold_single=0.0, threshold_acc=1.0)
    assert (inputs["accept_token_num"] == 4 - 1).all()


# --- our own ---

def test_largest_coin_still_accepts_a_certain_draft():
    """``_seeded_verify_coins`` clamps coins to ``1 - 2**-24`` (srt/speculative/eagle_utils.py,
    line 447): a draft with ``q_x = 1`` is accepted even then, and the bonus is the target's."""
    predicts, _, accept_token_num = _run_target_only_sampling(
        candidates=[0, 1], retrive_next_token=[1, -1], retrive_next_sibling=[-1, -1],
        target_probs=[[0.0, 1.0], [1.0, 0.0]], uniform_samples=[1.0 - 2**-24, 0.0])
    assert accept_token_num.item() == 1
    assert predicts[:2].tolist() == [1, 0]


def _first_token_counts(q_root, children, draws, seed, **thresholds):
    """First emitted token of a depth-1 tree whose root has ``children`` as siblings, over
    ``draws`` requests of one batched call."""
    n, v = len(children) + 1, q_root.shape[-1]
    gen = torch.Generator().manual_seed(seed)
    target = torch.zeros((draws, n, v))
    target[:, 0], target[:, 1:, 0] = q_root, 1.0
    rows = lambda row: torch.tensor([row]).expand(draws, n).contiguous()  # noqa: E731
    predicts = torch.full((draws * n,), -1)
    tree_speculative_sampling_target_only(
        predicts, torch.full((draws, 2), -1), torch.zeros(draws, dtype=torch.long), rows([0, *children]),
        torch.arange(draws * n).view(draws, n), rows([1] + [-1] * (n - 1)), rows([-1, *range(2, n), -1]),
        torch.rand((draws, n), generator=gen), torch.rand(draws, generator=gen), target, torch.zeros_like(target),
        **thresholds)
    return np.bincount(predicts.view(draws, n)[:, 0].numpy(), minlength=v).astype(float)


def _assert_follows(counts, law):
    """Chi-square of ``counts`` against ``law`` (a point mass must be hit every time)."""
    law = np.asarray(law, float) / np.sum(law)
    keep = law > 0
    assert counts[~keep].sum() == 0, "emitted a token outside the law's support"
    if keep.sum() > 1:
        assert chisquare(counts[keep], counts.sum() * law[keep]).pvalue > 1e-3


def test_target_only_tree_samples_the_target_at_thresholds_one():
    """At (1, 1) the siblings share one coin against the target's CDF over them, and the final
    draw excludes every rejected sibling: the first token follows ``q`` exactly (lossless)."""
    q = torch.tensor([0.05, 0.3, 0.0, 0.25, 0.15, 0.25])
    _assert_follows(_first_token_counts(q, [1, 3, 2], draws=3000, seed=0), q.double().numpy())


@pytest.mark.parametrize("single, acc", [(1.0, 0.5), (0.2, 0.9), (0.0, 0.3)])
def test_chain_first_token_follows_the_threshold_closed_form(single, acc):
    """One draft ``x``: accepted with ``a = 1`` if ``0 < s <= q_x``, else ``min(1, q_x / c)``;
    otherwise a draw from ``q`` without ``x``. Emitted law: ``a`` at ``x``, ``(1 - a) q_y / (1 - q_x)``
    elsewhere."""
    q = torch.tensor([0.1, 0.35, 0.0, 0.15, 0.4])
    for x in (1, 3, 2):
        q_x = float(q[x])
        a = 1.0 if 0 < q_x and q_x >= single else min(1.0, q_x / acc)
        law = (1 - a) * q.double().numpy() / (1 - q_x)
        law[x] = a
        _assert_follows(_first_token_counts(q, [x], draws=2000, seed=x, threshold_single=single, threshold_acc=acc),
                        law)


def test_chain_layout_matches_mdboost():
    """``verify_chain`` lays the kernel's outputs out as mdboost's ``VerifyResult.tokens``."""
    q = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]])
    tokens, accepted = verify_chain(torch.tensor([[1, 0]]), q, torch.tensor([[0.5, 0.5, 0.5]]))
    assert tokens.tolist() == [[1, 2, -1]] and accepted.tolist() == [1]


def test_thresholds_outside_the_unit_interval_are_refused():
    with pytest.raises(ValueError, match="threshold_acc must be in"):
        verify_chain(torch.tensor([[1]]), torch.full((1, 2, 3), 1 / 3), torch.zeros((1, 2)), threshold_acc=1.5)
