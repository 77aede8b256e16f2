"""Cost measurements of the speed model: what they measure, shapes, argument checks.

The verification ratios are checked against a fake target whose forward sleeps a known time
per input token, so its true ratios are known (a wrong chunk size, a swapped ratio or a clamp
in the measurement would fail). On the tiny pool's real model no time is asserted (a shared
machine): only shapes, the method string and that the KV cache the timed steps run on is
restored after every step."""

import time
from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache, LlamaConfig

from mdboost.models.cost import (
    _chunk_steppers,
    measure_md_overhead,
    measure_verify_costs,
    measure_verify_ratios,
    verify_cost_table,
)
from mdboost.models.pool import build_pool


@pytest.fixture(scope="module")
def pool():
    return build_pool("tiny", ["ngram:2"])


class SleepyLM(torch.nn.Module):
    """A causal-LM stand-in whose forward costs ``seconds(n)`` for ``n`` input tokens (a sleep),
    appending ``n`` positions to the KV cache it is given like a real model."""

    def __init__(self, seconds, vocab_size=16):
        super().__init__()
        self.config = LlamaConfig(num_hidden_layers=1, hidden_size=4, num_attention_heads=1,
                                  num_key_value_heads=1, intermediate_size=4, vocab_size=vocab_size)
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # the device is read from a parameter
        self.seconds = seconds
        self.calls = []  # input lengths of every forward

    def forward(self, input_ids, cache=None, use_cache=True):  # input_ids: [1, n]
        n = input_ids.shape[1]
        self.calls.append(n)
        if cache is not None:
            kv = torch.zeros(1, 1, n, 4)  # [B, heads, n, head_dim]
            cache.update(kv, kv, 0)
        time.sleep(self.seconds(n))
        return SimpleNamespace(logits=torch.zeros(1, n, self.config.vocab_size))


def sleepy_target(seconds):
    model = SleepyLM(seconds)
    return SimpleNamespace(model=model, tokenizer=range(model.config.vocab_size), kind="model")


def test_verify_ratios_measure_the_forward_time():
    """Forward time ``base + per_token * n``: the ratio for ``g`` is ``(base + per_token (g + 1))
    / (base + per_token)``, here ``1 + (g / 2)``, measured within a sleep's jitter."""
    target = sleepy_target(lambda n: 0.010 + 0.010 * n)
    ratios, method = measure_verify_ratios(target, gamma_max=3, context_len=5, repeats=3, warmup=0)
    assert ratios[0] == 1.0
    for g, ratio in enumerate(ratios):
        assert ratio == pytest.approx(1 + g / 2, rel=0.15), (g, ratios)
    # the prefill of the context, then each round forwards chunks of 1..gamma_max + 1 tokens in turn
    assert target.model.calls == [5] + [1, 2, 3, 4] * 3
    assert "1..4 tokens" in method and "context 5" in method


def test_verify_ratios_are_not_clamped_but_the_table_is():
    """A target whose longer chunks cost less (not a real model, but a real measurement) shows
    ratios below 1; the speed model's table raises them to the running maximum."""
    target = sleepy_target(lambda n: {1: 0.030, 2: 0.015, 3: 0.045}[n])
    ratios, _ = measure_verify_ratios(target, gamma_max=2, context_len=3, repeats=3, warmup=0)
    assert ratios[1] == pytest.approx(0.5, rel=0.2) and ratios[2] == pytest.approx(1.5, rel=0.15)
    assert verify_cost_table(ratios) == [1.0, 1.0, ratios[2]]
    table, _ = measure_verify_costs(target, gamma_max=2, context_len=3, repeats=3, warmup=0)
    assert table[:2] == [1.0, 1.0] and table[2] == pytest.approx(1.5, rel=0.15)


def test_verify_cost_table_is_a_running_maximum():
    assert verify_cost_table([1.0, 1.4, 1.3, 2.0, 1.9]) == [1.0, 1.4, 1.4, 2.0, 2.0]
    assert verify_cost_table([1.0, 0.8, 0.9]) == [1.0, 1.0, 1.0]
    assert verify_cost_table([1.0]) == [1.0]


def test_verify_costs_on_a_real_model(pool):
    ratios, method = measure_verify_ratios(pool.target, gamma_max=4, context_len=8, repeats=2, warmup=1)
    assert len(ratios) == 5 and ratios[0] == 1.0 and all(r > 0 for r in ratios)
    assert "1..5 tokens" in method and "context 8" in method


def test_chunk_steps_restore_the_cache(pool):
    """Every timed chunk sees the same prefix: after any number of steps the cache holds the
    prefix only and each step's logits equal those of a full forward."""
    model = pool.target.model
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (12,), generator=gen)
    full = model(input_ids=ids[None]).logits[0, 8:]  # [4, V]
    steps, cache = _chunk_steppers(model, ids[:8], [ids[8:9], ids[8:12]])
    for step, n in [(steps[0], 1), (steps[1], 4), (steps[1], 4), (steps[0], 1)]:
        torch.testing.assert_close(step()[0], full[:n], atol=1e-4, rtol=1e-4)
        assert cache.get_seq_length() == 8


def test_md_overhead(pool):
    overhead, method = measure_md_overhead(pool.target, context_len=8, repeats=2, warmup=1)
    assert set(overhead) == {"dense", "onehot"} and all(v >= 0 for v in overhead.values())
    assert "kl<=0.05" in method


@pytest.mark.parametrize("kwargs,name", [(dict(gamma_max=0), "gamma_max"), (dict(repeats=0), "repeats"),
                                         (dict(context_len=0), "context_len")])
def test_verify_cost_bad_arguments(pool, kwargs, name):
    with pytest.raises(ValueError, match=name):
        measure_verify_costs(pool.target, **kwargs)


def test_bad_targets_and_budget(pool):
    with pytest.raises(ValueError, match="target"):
        measure_verify_costs(pool["ngram:2"])
    with pytest.raises(ValueError, match="max_divergence"):
        measure_md_overhead(pool.target, max_divergence=0.0)
    with pytest.raises(ValueError, match="target"):
        measure_md_overhead(pool["ngram:2"])
