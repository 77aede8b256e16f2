"""Cost measurements of the speed model on the tiny pool: shapes, invariants, argument checks.

Times are never asserted (a shared machine); the tests check what the measurement guarantees
whatever the timings: ``v(0) = 1``, a non-decreasing table, non-negative overheads, and that
the KV cache the timed steps run on is restored after every step."""

import pytest
import torch

from mdboost.models.cost import (
    _chunk_steppers,
    measure_md_overhead,
    measure_verify_costs,
)
from mdboost.models.pool import build_pool


@pytest.fixture(scope="module")
def pool():
    return build_pool("tiny", ["ngram:2"])


def test_verify_cost_table(pool):
    table, method = measure_verify_costs(pool.target, gamma_max=4, context_len=8, repeats=2, warmup=1)
    assert len(table) == 5 and table[0] == 1.0
    assert all(b >= a for a, b in zip(table, table[1:]))  # running maximum
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
