"""Drafting (mdboost.md.drafting): llama.cpp's draft confidence against a direct port of its chain."""

import math

import pytest
import torch

from mdboost.md.drafting import FLOOR_TOP_K, check_draft_floor, draft_confidence, greedy_proposal


def llama_cpp_confidence(logits: list[float]) -> float:
    """common/speculative.cpp's draft sampler (llama-cpp-python 0.3.36): sort the candidates by
    logit, keep the first 10 (top-k), softmax what is left (dist), read the first's p."""
    kept = sorted(logits, reverse=True)[:10]
    top = kept[0]
    return 1.0 / sum(math.exp(x - top) for x in kept)


@pytest.mark.parametrize("vocab", [1, 3, 10, 11, 257])
def test_confidence_is_llama_cpp_top10_softmax(vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=gen, dtype=torch.float64) * 3
    got = draft_confidence(logits)
    assert got.dtype == torch.float64 and got.shape == (5,)
    assert got.tolist() == pytest.approx([llama_cpp_confidence(row) for row in logits.tolist()], rel=1e-12)


def test_confidence_ignores_all_but_the_top_ten():
    logits = torch.zeros(FLOOR_TOP_K + 5)
    logits[0] = 1.0
    assert float(draft_confidence(logits)) == pytest.approx(math.e / (math.e + FLOOR_TOP_K - 1))
    assert draft_confidence(torch.tensor([1.0, 2.0], dtype=torch.bfloat16)).dtype == torch.float32


def test_floor_checks_and_greedy_proposal():
    assert check_draft_floor(0, "sampled") == 0.0 and check_draft_floor(0.5, "greedy") == 0.5
    for bad in (-0.1, 1, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="draft_p_min must be a number in"):
            check_draft_floor(bad, "greedy")
    with pytest.raises(ValueError, match="draft_logits"):
        draft_confidence(torch.zeros(3, 0))
    p = torch.tensor([[0.2, 0.5, 0.3]])
    assert greedy_proposal(p).tolist() == [[0.0, 1.0, 0.0]]
