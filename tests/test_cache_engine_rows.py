"""Cached rows are what the engine's drafter computes: members whose outputs depend on the other
tokens of a forward (``torch.ao`` dynamic int8 quantization) are cached one token per forward,
like drafting; the pool's ``int8`` quantizes each token alone, so one forward gives its rows."""

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.ao.quantization import quantize_dynamic

from mdboost.cache import LogitCache
from mdboost.cache.build import build_cache, member_logits
from mdboost.cache.settings import RunOptions, StoreSettings
from mdboost.engine.kv import CachedLM
from mdboost.models.drafters import TokenScaledInt8Linear, mixes_positions
from mdboost.models.pool import build_pool

RECORDS = [{"id": f"r{i}", "prompt": f"def h{i}(x):\n    y = x + {i}\n", "reference": "    return y * 2\n"}
           for i in range(2)]


@pytest.fixture(scope="module")
def pool():
    return build_pool("tiny", ["early_exit:2", "tuned:2", "int8"])


def _engine_rows(model, ids: torch.Tensor, start: int) -> torch.Tensor:  # [T] -> [T - start, V]
    """Logits the engine's drafter sees: prompt prefill, then one token per KV-cached forward."""
    lm = CachedLM(model, 1, ids.device)
    rows = [lm.forward(ids[None, :start], logits_to_keep=1)[0, -1]]
    for t in range(start, ids.numel() - 1):
        rows.append(lm.forward(ids[None, t:t + 1], logits_to_keep=1)[0, -1])
    return torch.stack(rows).float()


@pytest.fixture(scope="module")
def torch_ao_int8(pool):
    """The target with ``torch.ao``'s dynamic int8 ``Linear`` layers (one activation scale per call)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic(copy.deepcopy(pool["tiny"].model).float(), {nn.Linear}, dtype=torch.qint8).eval()


def test_only_torch_ao_dynamic_quantization_mixes_positions(pool, torch_ao_int8):
    assert mixes_positions(torch_ao_int8)
    assert not any(mixes_positions(pool[m].model) for m in ("tiny", "early_exit:2", "tuned:2", "int8"))


@torch.no_grad()
def test_torch_ao_int8_is_cached_the_way_the_engine_computes_it(torch_ao_int8):
    # the cause: one activation scale per forward, so a whole-sequence forward is not what the
    # engine's one-token draft steps compute; the stepwise cache path gives exactly the latter
    ids = torch.arange(3, 23) % 50
    whole = torch_ao_int8(input_ids=ids[None], use_cache=False).logits[0, 4:-1].float()
    engine = _engine_rows(torch_ao_int8, ids, 5)
    assert not torch.allclose(whole, engine, atol=1e-4)
    assert torch.equal(member_logits(torch_ao_int8, ids, 5), engine)


@torch.no_grad()
def test_int8_layers_quantize_each_row_alone(pool):
    layers = [m for m in pool["int8"].model.modules() if isinstance(m, TokenScaledInt8Linear)]
    assert layers and not any(isinstance(m, nn.Linear) for m in pool["int8"].model.modules())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        biased = quantize_dynamic(nn.Sequential(nn.Linear(layers[0].in_features, 6)), {nn.Linear}, dtype=torch.qint8)
    layers = [TokenScaledInt8Linear(biased[0]), *layers]  # a layer with a bias too
    x = torch.randn(3, 5, layers[0].in_features, generator=torch.Generator().manual_seed(0))
    x[1] *= 40  # a row of a far larger scale beside the others
    x[2, 3] = 0  # an all-zero token: its output is the bias alone
    for layer in layers[:4]:
        out = layer(x)  # [3, 5, N]
        alone = torch.stack([torch.cat([layer(x[b, t:t + 1]) for t in range(5)]) for b in range(3)])
        assert torch.equal(out, alone)  # bitwise: no row or token sees another's scale
        bias = torch.zeros(out.shape[-1]) if layer.bias is None else layer.bias
        assert torch.equal(out[2, 3], bias.expand_as(out[2, 3]))
        weight = torch.ops.quantized.linear_unpack(layer._packed)[0].dequantize()[:, :-2]  # [N, K]
        exact = x @ weight.T + bias  # the float product with the same int8 weights
        # per-token 7-bit activations: each entry off by at most half a step of 2 m / 127 per input
        bound = (x.abs().amax(-1, keepdim=True) / 127) * weight.abs().sum(-1) + 1e-5
        assert ((out - exact).abs() <= bound).all()


@torch.no_grad()
def test_int8_rows_are_the_same_alone_and_batched(pool, torch_ao_int8):
    ids = (torch.arange(2 * 12).reshape(2, 12) * 7 + 3) % 50
    ids[1, 4:] = 1  # rows of different content: a long run of one token
    for model, invariant in ((pool["int8"].model, True), (torch_ao_int8, False)):
        batched = model(input_ids=ids, use_cache=False).logits.float()
        alone = torch.cat([model(input_ids=ids[b:b + 1], use_cache=False).logits.float() for b in range(2)])
        assert torch.allclose(batched, alone, atol=1e-4) == invariant
    whole = pool["int8"].model(input_ids=ids[:1], use_cache=False).logits[0, 4:-1].float()
    torch.testing.assert_close(whole, _engine_rows(pool["int8"].model, ids[0], 5), atol=1e-4, rtol=1e-4)


def test_cached_rows_equal_the_engine_drafter_rows(pool, tmp_path):
    store, run = StoreSettings(k=8, keep_full=True), RunOptions(progress=False)
    folders = {m: build_cache(pool, RECORDS, tmp_path / m.replace(":", "_"), store, members=[m], run=run)
               for m in ("early_exit:2", "tuned:2", "int8")}
    for name, folder in folders.items():
        cache = LogitCache.open(folder)
        full = cache.full_logits(name).float()  # [R, V] (stored in fp16)
        seq = cache.row_sequence()
        for s in range(len(RECORDS)):
            ids, start = cache.sequence(s)
            engine = _engine_rows(pool[name].model, ids, start)
            cached = full[seq == s]
            assert cached.shape == engine.shape
            # position-independent members: one whole-sequence forward, the same numbers
            torch.testing.assert_close(cached, engine, atol=2e-3, rtol=2e-3)
