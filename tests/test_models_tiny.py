"""Tiny models and tokenizer: determinism, shapes, exact round trips."""

import pytest
import torch
from transformers import DynamicCache, LlamaForCausalLM, PreTrainedTokenizerFast

from mdboost.models.loading import cache_kwarg
from mdboost.models.tiny import BOS_ID, EOS_ID, PAD_ID, tiny_llama, tiny_tokenizer


def test_tokenizer_round_trip_and_specials():
    tok = tiny_tokenizer(64)
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert len(tok) == 64
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (PAD_ID, BOS_ID, EOS_ID)
    text = "def f(x):\n  return x + 1"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert max(ids) < 64
    assert tok("Z")["input_ids"] == [tok.unk_token_id]  # beyond the 64 tokens kept


def test_tokenizer_sizes_and_errors():
    assert len(tiny_tokenizer(200)) == 200
    with pytest.raises(ValueError, match="vocab_size"):
        tiny_tokenizer(3)


def test_tokenizer_chat_template():
    tok = tiny_tokenizer()
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<s>user: hi\n<s>assistant: "


def test_tiny_llama_is_deterministic_and_leaves_global_rng():
    state = torch.get_rng_state()
    a, b, c = tiny_llama(seed=0), tiny_llama(seed=0), tiny_llama(seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    assert isinstance(a, LlamaForCausalLM) and not a.training
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        la, lb, lc = a(ids).logits, b(ids).logits, c(ids).logits
    assert la.shape == (1, 5, 64)
    assert torch.equal(la, lb) and not torch.equal(la, lc)
    assert la.std() > 0.3  # not a near-uniform distribution


def test_tiny_llama_kv_cache_matches_full_forward():
    model = tiny_llama(num_layers=2)
    ids = torch.tensor([[1, 9, 4, 12, 30, 7]])
    with torch.no_grad():
        full = model(ids).logits
        cache = DynamicCache(config=model.config)
        first = model(input_ids=ids[:, :4], use_cache=True, **{cache_kwarg(model): cache}).logits
        rest = model(input_ids=ids[:, 4:], use_cache=True, **{cache_kwarg(model): cache}).logits
    torch.testing.assert_close(torch.cat([first, rest], 1), full, atol=1e-5, rtol=1e-5)


def test_tiny_llama_overrides_and_errors():
    model = tiny_llama(vocab_size=100, num_layers=3, hidden_size=16, intermediate_size=20)
    assert model.config.num_hidden_layers == 3 and model.config.intermediate_size == 20
    assert model.lm_head.out_features == 100
    with pytest.raises(ValueError, match="num_layers"):
        tiny_llama(num_layers=0)
