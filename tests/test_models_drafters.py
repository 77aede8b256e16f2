"""Derived drafters: early exit equals the first N layers by hand, shared weights, tuned lens, int8."""

import pytest
import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from mdboost.models.loading import cache_kwarg
from mdboost.models.drafters import (
    early_exit_model,
    fit_translator,
    hidden_pairs,
    int8_model,
    tuned_translators,
)
from mdboost.models.tiny import tiny_llama

IDS = torch.tensor([[1, 9, 4, 12, 30, 7, 22, 5]])


@pytest.fixture(scope="module")
def target():
    return tiny_llama(num_layers=4, seed=3)


def by_hand(target, ids, n, translator=None):
    """Embed, run layers 0..n-1 through the decoder's own forward, then norm + LM head."""
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states[n]
        if translator is not None:
            hidden = translator(hidden)
        return target.lm_head(target.model.norm(hidden))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_early_exit_equals_first_layers_by_hand(target, n):
    draft = early_exit_model(target, n)
    with torch.no_grad():
        logits = draft(IDS).logits
    torch.testing.assert_close(logits, by_hand(target, IDS, n), atol=1e-5, rtol=1e-5)


def test_early_exit_shares_parameters_without_copy(target):
    draft = early_exit_model(target, 2)
    target_params = {id(p) for p in target.parameters()}
    assert all(id(p) in target_params for p in draft.parameters())
    assert draft.model.layers[1] is target.model.layers[1] and len(draft.model.layers) == 2
    assert draft.config.num_hidden_layers == 2 and target.config.num_hidden_layers == 4
    assert isinstance(draft, PreTrainedModel)


def test_early_exit_kv_cache_and_assisted_generation(target):
    draft = early_exit_model(target, 2)
    with torch.no_grad():
        cache = DynamicCache(config=draft.config)
        first = draft(input_ids=IDS[:, :5], use_cache=True, **{cache_kwarg(draft): cache}).logits
        rest = draft(input_ids=IDS[:, 5:], use_cache=True, **{cache_kwarg(draft): cache}).logits
        torch.testing.assert_close(torch.cat([first, rest], 1), draft(IDS).logits, atol=1e-5, rtol=1e-5)
        plain = target.generate(IDS, max_new_tokens=6, do_sample=False, pad_token_id=0)
        assisted = target.generate(IDS, assistant_model=draft, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(plain, assisted)  # greedy speculative decoding is exact


def test_early_exit_rejects_bad_depth(target):
    for n in (0, 4, 2.5):
        with pytest.raises(ValueError, match="num_layers"):
            early_exit_model(target, n)


def test_fit_translator_recovers_an_affine_map():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(400, 8, generator=gen)
    weight, bias = torch.randn(8, 8, generator=gen), torch.randn(8, generator=gen)
    linear = fit_translator(x, x @ weight.T + bias, ridge=0.0)
    torch.testing.assert_close(linear.weight, weight, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(linear.bias, bias, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="hidden_in"):
        fit_translator(x, x[:, :3])


def test_fit_translator_is_least_squares_optimal():
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(300, 6, generator=gen), torch.randn(300, 6, generator=gen)
    linear = fit_translator(x, y, ridge=0.0)
    xs = torch.cat([x, torch.ones(300, 1)], 1).double()
    reference = torch.linalg.lstsq(xs, y.double()).solution  # [7, 6]
    torch.testing.assert_close(linear.weight.double(), reference[:-1].T, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(linear.bias.double(), reference[-1], atol=1e-5, rtol=1e-5)


def test_hidden_pairs_capture_after_n_layers_and_prenorm_final(target):
    pairs = hidden_pairs(target, [IDS[0]], [2])
    x, final = pairs[2]
    with torch.no_grad():
        states = target(IDS, output_hidden_states=True).hidden_states
    torch.testing.assert_close(x, states[2][0])
    torch.testing.assert_close(target.model.norm(final), states[-1][0], atol=1e-5, rtol=1e-5)


def test_tuned_exit_applies_translator_before_norm_and_is_stored(target, tmp_path):
    sequences = lambda: [torch.randint(0, 64, (120,), generator=torch.Generator().manual_seed(i)) for i in range(4)]  # noqa: E731
    translators = tuned_translators(target, [2], sequences, store=tmp_path, max_positions=400)
    assert (tmp_path / "tuned_lens_layer2.safetensors").is_file()
    again = tuned_translators(target, [2], lambda: pytest.fail("refit instead of loading"), store=tmp_path)
    torch.testing.assert_close(again[2].weight, translators[2].weight)
    draft = early_exit_model(target, 2, translators[2])
    with torch.no_grad():
        logits = draft(IDS).logits
    torch.testing.assert_close(logits, by_hand(target, IDS, 2, translators[2]), atol=1e-5, rtol=1e-5)


def test_tuned_exit_fits_final_hidden_better_than_plain_exit(target):
    seqs = [torch.randint(4, 64, (150,), generator=torch.Generator().manual_seed(i)) for i in range(6)]
    (x, y), = hidden_pairs(target, seqs, [2]).values()
    translator = fit_translator(x, y)
    with torch.no_grad():
        assert ((translator(x) - y) ** 2).mean() < ((x - y) ** 2).mean()


def test_int8_quantizes_a_copy(target):
    from mdboost.models.drafters import TokenScaledInt8Linear

    quant = int8_model(target)
    assert isinstance(quant, PreTrainedModel)
    assert isinstance(quant.model.layers[0].mlp.up_proj, TokenScaledInt8Linear)
    assert isinstance(target.model.layers[0].mlp.up_proj, nn.Linear)  # the target is untouched
    with torch.no_grad():
        a, b = quant(IDS).logits.flatten(), target(IDS).logits.flatten()
    assert torch.isfinite(a).all()
    assert torch.corrcoef(torch.stack([a, b]))[0, 1] > 0.95


def test_int8_shares_the_unquantized_parameters_of_a_float32_target(target):
    quant = int8_model(target)
    assert quant.model.embed_tokens.weight is target.model.embed_tokens.weight
    assert quant.model.norm.weight is target.model.norm.weight
    assert quant.model.layers[0].input_layernorm.weight is target.model.layers[0].input_layernorm.weight
    target_params = {id(p) for p in target.parameters()}
    assert all(id(p) in target_params for p in quant.parameters())  # packed Linear weights are not parameters


def test_int8_copies_a_target_in_another_dtype():
    bf16 = tiny_llama(num_layers=2, seed=5).to(torch.bfloat16)
    quant = int8_model(bf16)
    assert quant.model.embed_tokens.weight.dtype == torch.float32
    assert bf16.model.embed_tokens.weight.dtype == torch.bfloat16  # the target is not cast
    assert quant.model.embed_tokens.weight.data_ptr() != bf16.model.embed_tokens.weight.data_ptr()
