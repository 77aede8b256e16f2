"""The engine-step cost ratio: what it times, its result, argument checks.

The ratio is checked on tiny models whose forward takes a known time per call on a virtual
clock (a forward pre-hook advances it; ``virtual_clock`` in ``conftest.py``), so the true ratio is
known exactly, whatever the load of the machine: a drafter forward of 30 ms against a target forward of
60 ms is ``c = 0.5`` (one drafter forward per draft token, one target forward per step).
"""

import pytest
import torch

from mdboost.engine.costs import COST_UNIT, CostMeasurement, measure_engine_cost, measure_engine_profile
from mdboost.models.drafters import early_exit_model
from mdboost.models.ngram import NgramDrafter
from mdboost.models.tiny import tiny_llama


def sleepy(model, clock, seconds: float):
    model.register_forward_pre_hook(lambda module, args: clock.sleep(seconds))
    return model


def test_ratio_of_known_forward_times(virtual_clock):
    target = sleepy(tiny_llama(seed=0), virtual_clock, 0.06)
    drafter = sleepy(tiny_llama(seed=1), virtual_clock, 0.03)
    result = measure_engine_cost(drafter, target, context_len=8, repeats=3, steps=2, warmup=1)
    assert len(result.samples) == 3 and result.threads == 1
    assert result.samples == pytest.approx([0.5] * 3), result.samples
    lo, hi = result.spread()
    assert lo <= result.median <= hi


def test_early_exit_drafts_on_the_target_cache():
    """An early exit takes the engine's shared-cache path (no private cache: no drafter prefill)."""
    target = tiny_llama(num_layers=4)
    calls = []
    drafter = early_exit_model(target, 2)
    drafter.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape[1]),
                                      with_kwargs=True)
    result = measure_engine_cost(drafter, target, context_len=12, repeats=2, steps=1, warmup=0, prefill_lengths=(1, 2))
    assert result.median > 0 and max(calls) <= 2  # pending tokens, then one token per draft (prefill: 1-2 tokens)


@pytest.mark.parametrize("context_len", [2, 16, 40])
def test_ngram_proposals_are_timed(context_len):
    """Prompt lookup finds its match in the periodic prompt (else no draft token: an error)."""
    result = measure_engine_cost(NgramDrafter(2), tiny_llama(), context_len=context_len, repeats=2, steps=2)
    assert all(s > 0 for s in result.samples) and "engine steps" in result.method


def test_threads_are_set_and_restored():
    before = torch.get_num_threads()
    result = measure_engine_cost(tiny_llama(seed=1), tiny_llama(), context_len=4, repeats=1, steps=1, threads=1)
    assert torch.get_num_threads() == before and result.threads == 1 and "1 threads" in result.method
    assert "load" in result.method


def test_spread_is_the_central_range():
    result = CostMeasurement([0.1, 0.2, 0.3, 0.4, 0.5], "m", 1, 0.0, 0.0)
    assert result.median == 0.3
    assert result.spread(0.5) == pytest.approx((0.2, 0.4))
    assert result.spread() == pytest.approx((0.12, 0.48))
    with pytest.raises(ValueError, match="level"):
        result.spread(0)


@pytest.mark.parametrize("kwargs, name", [
    ({"context_len": 0}, "context_len"), ({"repeats": 0}, "repeats"), ({"steps": 0}, "steps"),
    ({"warmup": -1}, "warmup"), ({"threads": 0}, "threads"),
])
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        measure_engine_cost(tiny_llama(seed=1), tiny_llama(), **kwargs)


def test_bad_settings_and_drafter():
    with pytest.raises(TypeError, match="settings"):
        measure_engine_cost(tiny_llama(seed=1), tiny_llama(), settings={"gamma": 2})
    with pytest.raises(TypeError, match="drafter"):
        measure_engine_cost("int8", tiny_llama())


def per_token_sleepy(model, clock, base: float, per_token: float):
    """A forward taking ``base + per_token * n`` on ``clock`` for ``n`` input tokens."""
    model.register_forward_pre_hook(lambda module, args, kwargs: clock.sleep(base + per_token * kwargs["input_ids"].shape[1]),
                                    with_kwargs=True)
    return model


def test_profile_of_known_forward_times(virtual_clock):
    """Target forwards of ``20 + 10 n`` ms: ``v(K) = (20 + 10 (K + 1)) / 30 = 1 + K / 3``, the
    prefill slope ``10 / 30`` per token (on the virtual clock the engine's own work takes no time)."""
    target = per_token_sleepy(tiny_llama(), virtual_clock, 0.02, 0.01)
    profile = measure_engine_profile(target, 3, context_len=4, repeats=2, steps=1, warmup=0,
                                     prefill_lengths=(1, 5))
    assert profile.verify_cost[0] == 1.0 and len(profile.verify_cost) == 4
    for k, v in enumerate(profile.verify_cost):
        assert v == pytest.approx(1 + k / 3), profile.verify_cost
    assert [len(s) for s in profile.verify_samples] == [2] * 4
    assert profile.prefill_per_token == pytest.approx(1 / 3)
    assert set(profile.md_overhead) == {"dense", "onehot"} and min(profile.md_overhead.values()) >= 0
    assert profile.step_seconds == pytest.approx(0.03)
    assert profile.to_dict()["unit"] == COST_UNIT and "1 threads" in profile.method


def test_model_drafter_prefill(virtual_clock):
    """A model drafter feeds the prompt at its first proposal: its slope is its per-token time over
    the target's undrafted step (``5 / 30``); prompt lookup has none."""
    target = per_token_sleepy(tiny_llama(seed=0), virtual_clock, 0.02, 0.01)
    drafter = per_token_sleepy(tiny_llama(seed=1), virtual_clock, 0.0, 0.005)
    result = measure_engine_cost(drafter, target, context_len=4, repeats=3, steps=1, warmup=0, prefill_lengths=(1, 9))
    assert result.prefill_per_token == pytest.approx(5 / 30)
    ngram_target = per_token_sleepy(tiny_llama(), virtual_clock, 0.02, 0.01)
    assert measure_engine_cost(NgramDrafter(2), ngram_target, context_len=4, repeats=1, steps=1).prefill_per_token == 0


def test_early_exit_feeds_the_prompt_at_its_first_proposal(virtual_clock):
    """On the target's cache an early exit's first proposal runs its layers over the whole prompt
    (what its prefill slope prices): the engine's first step with a drafter."""
    from mdboost.engine import GenerationSettings, as_drafter, generate

    target = tiny_llama(num_layers=4)
    drafter = early_exit_model(target, 2)
    calls = []
    drafter.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape[1]),
                                      with_kwargs=True)
    generate(target, torch.arange(1, 10)[None], GenerationSettings(max_new_tokens=4, gamma=2), drafter=as_drafter(drafter),
             generator=torch.Generator().manual_seed(0))
    assert calls[0] == 9 and max(calls[1:]) <= 2
    # known forward times (the hooks fire on the top-level modules only): the early exit's
    # 1 ms per prompt token over the target's 20 ms undrafted step
    per_token_sleepy(target, virtual_clock, 0.02, 0.0)
    per_token_sleepy(drafter, virtual_clock, 0.0, 0.001)
    slope = measure_engine_cost(drafter, target, context_len=4, repeats=3, steps=1, prefill_lengths=(1, 33)).prefill_per_token
    assert slope == pytest.approx(1 / 20)


@pytest.mark.parametrize("kwargs, name", [
    ({"gamma_max": 0}, "gamma_max"), ({"md_draft_len": 0}, "md_draft_len"), ({"max_divergence": 0.0}, "max_divergence"),
    ({"prefill_lengths": (4, 4)}, "prefill_lengths"), ({"repeats": 0}, "repeats"),
])
def test_profile_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        measure_engine_profile(tiny_llama(), **{"repeats": 1, "steps": 1, "context_len": 4, **kwargs})


def shape_sleepy(model, clock, base: float, per_token: float, rebuild: float):
    """A forward of ``n`` tokens taking ``base + per_token * n``, plus ``rebuild`` when the previous
    forward had another width (as llama.cpp rebuilds its compute graph when a batch's shape changes)."""
    last = {"width": None}

    def hook(module, args, kwargs):
        width = kwargs["input_ids"].shape[1]
        clock.sleep(base + per_token * width + (rebuild if width != last["width"] else 0.0))
        last["width"] = width

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return model


def test_t_ar_is_plain_decodings_step_not_one_after_a_drafted_step(virtual_clock):
    """Plain decoding's steps all have one shape; a target that pays 5 ms when the shape changes
    costs 30 ms a plain step, and 45 ms for an undrafted step right after a drafted one. ``T_ar``
    is the 30 ms, so ``v(K) = (20 + 10 (K + 1) + 5) / 30`` and a 15 ms drafter forward is
    ``c = 0.5``, as the engine's plain decoding would see them."""
    target = shape_sleepy(tiny_llama(), virtual_clock, 0.02, 0.01, 0.005)
    profile = measure_engine_profile(target, 3, context_len=4, repeats=2, steps=1, warmup=0, prefill_lengths=(1, 5))
    assert profile.step_seconds == pytest.approx(0.03)
    for k, v in enumerate(profile.verify_cost[1:], start=1):
        assert v == pytest.approx((0.02 + 0.01 * (k + 1) + 0.005) / 0.03), profile.verify_cost
    target = shape_sleepy(tiny_llama(seed=0), virtual_clock, 0.02, 0.01, 0.005)
    drafter = sleepy(tiny_llama(seed=1), virtual_clock, 0.015)
    cost = measure_engine_cost(drafter, target, context_len=8, repeats=3, steps=2, warmup=1)
    assert cost.samples == pytest.approx([0.5] * 3) and cost.step_seconds == pytest.approx(0.03)
