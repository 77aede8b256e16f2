"""The bare cost estimate (``Pool.measure_costs``): the KV cache it times on, its ratio, arguments.

The engine-step costs the speed model uses are tested in ``tests/test_engine_costs.py``."""

import pytest
import torch

from mdboost.models.cost import _chunk_steppers, measure_cost_ratio
from mdboost.models.pool import build_pool


@pytest.fixture(scope="module")
def pool():
    return build_pool("tiny", ["ngram:2", "early_exit:1"])


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


def test_ratio_of_known_step_times(pool, virtual_clock):
    """A drafter whose forward takes 20 ms against a target taking 60 ms (on the virtual clock,
    ``conftest.py``): ``c = 1/3`` exactly."""
    target, drafter = pool.target, pool["early_exit:1"]
    hooks = [target.model.register_forward_pre_hook(lambda m, a: virtual_clock.sleep(0.06)),
             drafter.model.register_forward_pre_hook(lambda m, a: virtual_clock.sleep(0.02))]
    try:
        ratio, method = measure_cost_ratio(drafter, target, context_len=8, repeats=5, warmup=1)
    finally:
        for h in hooks:
            h.remove()
    # the hooks sit on the two top-level models (an early exit shares only their layers)
    assert ratio == pytest.approx(1 / 3), ratio
    assert "context 8" in method


@pytest.mark.parametrize("kwargs,name", [(dict(repeats=0), "repeats"), (dict(context_len=0), "context_len")])
def test_bad_arguments(pool, kwargs, name):
    with pytest.raises(ValueError, match=name):
        measure_cost_ratio(pool["ngram:2"], pool.target, **kwargs)
