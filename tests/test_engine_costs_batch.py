"""Engine costs at batch size ``B``: every timed step runs over ``B`` rows.

On the virtual clock (``conftest.py``) a target forward over ``[B, T]`` tokens takes
``a0 + a1 B + b B T``: a fixed launch, a per-row and a per-row-token part. Then the undrafted
step (``T = 1``) takes ``T_ar(B) = a0 + (a1 + b) B``, a step verifying ``K`` drafts in every row
``a0 + a1 B + b B (K + 1)``, and a ``[B, L]`` prompt forward has slope ``b B`` in ``L``; a
drafter forward of ``d B`` (one per draft position of the batch) gives ``c(B) = d B / T_ar(B)``.
"""

import pytest
import torch

from mdboost.engine.costs import measure_engine_cost, measure_engine_profile
from mdboost.engine.costs._timing import _prompt
from mdboost.models.ngram import NgramDrafter
from mdboost.models.tiny import tiny_llama

A0, A1, B_TOK, D_ROW = 0.01, 0.004, 0.002, 0.003


def batch_sleepy(model, clock, a0: float, a1: float, b: float):
    """A forward over ``[B, T]`` input ids taking ``a0 + a1 B + b B T`` on ``clock``."""
    def hook(module, args, kwargs):
        rows, width = kwargs["input_ids"].shape
        clock.sleep(a0 + a1 * rows + b * rows * width)
    model.register_forward_pre_hook(hook, with_kwargs=True)
    return model


def t_ar(rows: int) -> float:
    return A0 + (A1 + B_TOK) * rows


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_profile_at_batch_size(virtual_clock, rows):
    target = batch_sleepy(tiny_llama(), virtual_clock, A0, A1, B_TOK)
    profile = measure_engine_profile(target, 3, context_len=6, repeats=2, steps=1, warmup=0,
                                     prefill_lengths=(1, 5), batch_size=rows)
    expected = [(A0 + A1 * rows + B_TOK * rows * (k + 1)) / t_ar(rows) for k in range(4)]
    assert profile.verify_cost == pytest.approx(expected, rel=1e-9)
    assert profile.step_seconds == pytest.approx(t_ar(rows))
    assert profile.prefill_per_token == pytest.approx(B_TOK * rows / t_ar(rows))
    assert profile.md_overhead == pytest.approx({"dense": 0.0, "onehot": 0.0}, abs=1e-9)  # the solve takes no virtual time
    assert profile.batch_size == rows and profile.to_dict()["batch_size"] == rows
    assert (f"{rows} rows" in profile.method) == (rows > 1)


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_drafter_cost_at_batch_size(virtual_clock, rows):
    target = batch_sleepy(tiny_llama(seed=0), virtual_clock, A0, A1, B_TOK)
    drafter = batch_sleepy(tiny_llama(seed=1), virtual_clock, 0.0, D_ROW, 0.0)
    result = measure_engine_cost(drafter, target, context_len=6, repeats=3, steps=2, warmup=1, batch_size=rows,
                                 prefill_lengths=(1, 5))
    assert result.samples == pytest.approx([D_ROW * rows / t_ar(rows)] * 3, rel=1e-9)
    assert result.step_seconds == pytest.approx(t_ar(rows))
    assert result.prefill_per_token == pytest.approx(0.0, abs=1e-12)  # the drafter's forward does not grow with the prompt
    assert result.batch_size == rows and result.to_dict()["batch_size"] == rows


def test_drafter_prefill_at_batch_size(virtual_clock):
    """A drafter forward of ``e B L`` for a ``[B, L]`` prompt: ``beta(B) = e B / T_ar(B)``."""
    target = batch_sleepy(tiny_llama(seed=0), virtual_clock, A0, A1, B_TOK)
    drafter = batch_sleepy(tiny_llama(seed=1), virtual_clock, 0.0, 0.0, 0.001)
    result = measure_engine_cost(drafter, target, context_len=6, repeats=3, steps=1, warmup=1, batch_size=2,
                                 prefill_lengths=(1, 9))
    assert result.prefill_per_token == pytest.approx(0.001 * 2 / t_ar(2))


def test_every_timed_step_feeds_all_rows():
    target = tiny_llama()
    shapes = []
    target.register_forward_pre_hook(lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
                                     with_kwargs=True)
    measure_engine_profile(target, 2, context_len=6, repeats=1, steps=1, warmup=0, prefill_lengths=(1, 3), batch_size=3)
    assert {rows for rows, _ in shapes} == {3} and (3, 6) in shapes  # the prompt batch, then 3-row steps


def test_prompt_rows():
    """Each row its own repeated block; row 0 is the prompt of batch size 1."""
    one, three = _prompt(64, 12, 7), _prompt(64, 12, 7, 3)
    assert one.shape == (1, 12) and three.shape == (3, 12)
    assert torch.equal(three[:1], one)
    assert torch.equal(three[:, :6], three[:, 6:])  # a block of min(16, 12 // 2) tokens, twice
    assert len({tuple(row) for row in three.tolist()}) == 3


def test_prompt_lookup_at_batch_size():
    """Prompt lookup finds its match in every row: a full-length draft per row, its work per row adding up."""
    result = measure_engine_cost(NgramDrafter(2), tiny_llama(), context_len=16, repeats=2, steps=2, batch_size=3)
    assert all(s > 0 for s in result.samples) and "3 rows" in result.method
    assert result.prefill_per_token == 0 and result.batch_size == 3


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_batch_size(bad):
    with pytest.raises((ValueError, TypeError), match="batch_size"):
        measure_engine_cost(tiny_llama(seed=1), tiny_llama(), batch_size=bad)
    with pytest.raises((ValueError, TypeError), match="batch_size"):
        measure_engine_profile(tiny_llama(), batch_size=bad)
