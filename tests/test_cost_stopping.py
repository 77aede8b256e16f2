"""The repeats' stopping rule (``mdboost.engine.costs._stopping``; ``docs/engine.md``, "Costs measured once, well").

The sign-test interval is checked against scipy's binomial distribution and an exact integer
count; the rule inside the measurements on the virtual clock (``conftest.py``) with a drafter
whose forward time in repeat ``r`` is a chosen ``TIMES[r]`` (the ``progress`` callback counts
the repeats), so each repeat's ``c`` is exactly ``TIMES[r]`` and the stopping repeat is known by
hand (worked out at :data:`TIMES`).
"""

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import binom

from mdboost.engine.costs import (SPREAD_RATIO, StoppingRule, measure_engine_cost, measure_engine_profile,
                                  median_interval, median_ranks, relative_half_width, spread_half_width)
from mdboost.models.tiny import tiny_llama


def exact_coverage(n: int, lo: int, hi: int) -> Fraction:
    """``P(lo <= Bin(n, 1/2) < hi)``, counted exactly."""
    return Fraction(sum(math.comb(n, j) for j in range(lo, hi)), 2 ** n)


@pytest.mark.parametrize("level", [0.5, 0.8, 0.9, 0.95, 0.99])
def test_ranks_are_the_narrowest_symmetric_pair_that_covers(level):
    for n in range(1, 80):
        ranks = median_ranks(n, level)
        covering = [k for k in range(1, (n + 1) // 2 + 1) if exact_coverage(n, k, n + 1 - k) >= Fraction(level)]
        if not covering:
            assert ranks is None, n
            continue
        k = max(covering)
        assert ranks == (k, n + 1 - k), n
        assert binom.cdf(n - k, n, 0.5) - binom.cdf(k - 1, n, 0.5) >= level - 1e-12  # scipy's P(k <= Bin < n+1-k)
        assert binom.cdf(n - k - 1, n, 0.5) - binom.cdf(k, n, 0.5) < level  # one rank narrower falls short


def test_the_smallest_sample_with_a_90_percent_interval_is_5():
    assert [median_ranks(n) for n in range(1, 6)] == [None] * 4 + [(1, 5)]
    assert exact_coverage(5, 1, 5) == Fraction(15, 16)


def test_interval_covers_the_median_at_its_exact_rate():
    """Distribution-free: exponential samples (median ln 2) are covered at ``P(l <= Bin(n, 1/2) < u)``."""
    rng = np.random.default_rng(0)
    for n in (5, 9, 21):
        lo, hi = median_ranks(n)
        draws = np.sort(rng.exponential(size=(20000, n)), axis=1)
        rate = np.mean((draws[:, lo - 1] <= math.log(2)) & (math.log(2) < draws[:, hi - 1]))
        exact = float(exact_coverage(n, lo, hi))
        assert abs(rate - exact) < 4 * math.sqrt(exact * (1 - exact) / 20000), (n, rate, exact)


def test_half_width():
    assert median_interval([3.0, 1.0, 2.0, 5.0]) is None and relative_half_width([1.0] * 4) == math.inf
    assert relative_half_width([2.0, 1.0, 2.0, 3.0, 2.0]) == 0.5
    assert relative_half_width([0.0] * 5) == 0.0 and relative_half_width([-1.0, 0.0, 0.0, 0.0, 1.0]) == math.inf
    assert relative_half_width([-1.0, 0.0, 0.0, 0.0, 1.0], scale=2.0) == 0.5


@pytest.mark.parametrize("kwargs, name", [
    ({"max_repeats": 0}, "max_repeats"), ({"min_repeats": 0}, "min_repeats"), ({"min_repeats": 2.5}, "min_repeats"),
    ({"rel_tol": -0.01}, "rel_tol"), ({"rel_tol": math.nan}, "rel_tol"), ({"rel_tol": math.inf}, "rel_tol"),
    ({"rel_tol": "0.02"}, "rel_tol"), ({"min_repeats": True}, "min_repeats"),
    ({"spread_ratio": -0.1}, "spread_ratio"), ({"spread_ratio": math.inf}, "spread_ratio"),
])
def test_bad_rule(kwargs, name):
    with pytest.raises(ValueError, match=name):
        StoppingRule(**{"max_repeats": 10, **kwargs})
    if name != "max_repeats":
        with pytest.raises(ValueError, match=name):
            measure_engine_cost(tiny_llama(seed=1), tiny_llama(), **kwargs)
        with pytest.raises(ValueError, match=name):
            measure_engine_profile(tiny_llama(), **kwargs)


# Each repeat's c. Sorted prefixes and the 90% ranks (median_ranks): n = 5..7 take (1, n), the
# extremes 1.0 and 2.0: half-width 0.5; n = 8 (2, 7), n = 9 (2, 8), n = 10 (2, 9) reach 1.3:
# (1.3 - 1.0) / 2 = 0.15; n = 11 takes (3, 9), all 1.0: 0. So rel_tol 0.1 stops at 11, 0.2 at 8
# (with the spread criterion off: spread_ratio=0). The spread criterion: the single repeats'
# central 90% (linear-interpolated quantiles) at n = 5: [1.0, 1.8], half 0.4; n = 6: [1.0, 1.75],
# n = 7: [1.0, 1.7], halves 0.375 and 0.35, each x 0.458 < 0.5; n = 8: [1.0, 1.3 + 0.65 x 0.7 =
# 1.755], half 0.3775, x 0.458 = 0.173 >= 0.15: rel_tol 0 stops at 8, "spread".
TIMES = [1.0, 1.0, 1.0, 1.0, 2.0, 1.0, 1.0, 1.3, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
WIDTHS = [math.inf] * 4 + [0.5] * 3 + [0.15] * 3 + [0.0] * 4


def noisy_cost(clock, repeats: int, **kwargs):
    """``measure_engine_cost`` where the drafter's forward in repeat ``r`` takes ``TIMES[r]`` x the target's."""
    seen = []

    def progress(done, total, width):
        seen.append((done, total, width))

    target, drafter = tiny_llama(seed=0), tiny_llama(seed=1)
    target.register_forward_pre_hook(lambda module, args: clock.sleep(0.01))
    drafter.register_forward_pre_hook(lambda module, args: clock.sleep(0.01 * TIMES[min(len(seen), len(TIMES) - 1)]))
    kwargs = {"spread_ratio": 0, **kwargs}
    result = measure_engine_cost(drafter, target, context_len=6, repeats=repeats, steps=2, warmup=1,
                                 prefill_lengths=(1, 2), progress=progress, **kwargs)
    return result, seen


@pytest.mark.parametrize("rel_tol, stop", [(0.1, 11), (0.2, 8)])
def test_drafter_cost_stops_where_the_hand_computation_says(virtual_clock, rel_tol, stop):
    result, seen = noisy_cost(virtual_clock, 14, rel_tol=rel_tol)
    assert result.samples == pytest.approx(TIMES[:stop])
    assert result.repeats_run == stop and result.stopped == "tight"
    assert [d for d, _, _ in seen] == list(range(1, stop + 1)) and {t for _, t, _ in seen} == {14}
    assert [w for _, _, w in seen] == pytest.approx(WIDTHS[:stop], abs=1e-9)
    lo, hi = result.c_interval
    assert lo == pytest.approx(1.0) and hi == pytest.approx(1.3 if stop == 8 else 1.0)
    entry = result.to_dict()
    assert entry["repeats_run"] == stop and entry["stopped"] == "tight" and entry["c_interval"] == [lo, hi]
    assert (entry["max_repeats"], entry["min_repeats"], entry["rel_tol"], entry["confidence"]) == (14, 5, rel_tol, 0.9)
    assert entry["spread_ratio"] == 0
    assert f"{stop} repeats" in result.method and "sign-test" in result.method


def test_drafter_cost_stops_when_its_median_is_known_within_the_spread(virtual_clock):
    """``rel_tol = 0``, the default ``spread_ratio``: 8 repeats (worked out at :data:`TIMES`)."""
    result, seen = noisy_cost(virtual_clock, 14, rel_tol=0, spread_ratio=SPREAD_RATIO)
    assert result.repeats_run == 8 and result.stopped == "spread" and len(seen) == 8
    assert result.to_dict()["spread_ratio"] == pytest.approx(0.458, abs=5e-4)
    assert "0.458 x half the single repeats' central 90% range" in result.method
    both, _ = noisy_cost(virtual_clock, 14, rel_tol=0.1, spread_ratio=SPREAD_RATIO)
    assert both.repeats_run == 8 and both.stopped == "spread"  # either criterion stops it: the first to hold


def test_spread_ratio_widens_a_single_repeat_interval_by_at_most_10_percent():
    """Independent variances add: ``sqrt(1 + r^2)`` at ``r = SPREAD_RATIO`` is 1.1."""
    assert math.hypot(1.0, SPREAD_RATIO) == pytest.approx(1.1, rel=1e-12)


def test_spread_half_width_is_numpys_central_range():
    rng = np.random.default_rng(3)
    for n in (2, 5, 8, 21):
        x = rng.lognormal(size=n)
        want = (np.percentile(x, 95) - np.percentile(x, 5)) / 2
        assert spread_half_width(list(x)) == pytest.approx(want, rel=1e-12), n


def test_the_spread_criterion_alone_needs_8_repeats_and_stops_every_tie():
    """Up to 7 repeats the median's interval is the whole range (module docstring), wider than the
    central 90%: no stop whatever the samples; a figure without spread stops at the first chance."""
    rng = np.random.default_rng(0)
    rule = StoppingRule(21, rel_tol=0)
    for _ in range(200):
        x = list(rng.normal(1.0, 0.1, size=7))
        assert all(rule.stops(n, [(x[:n], None)]) is None for n in range(1, 8))
    assert rule.stops(5, [([2.0] * 5, None)]) == "spread"
    assert StoppingRule(21, rel_tol=0, spread_ratio=0).stops(21, [([2.0] * 21, None)]) is None


def test_rel_tol_0_runs_every_repeat(virtual_clock):
    result, seen = noisy_cost(virtual_clock, 12, rel_tol=0)  # spread_ratio=0 (noisy_cost)
    assert result.repeats_run == 12 and result.stopped == "max_repeats" and len(seen) == 12
    assert "12 repeats (fresh generations; a fixed count of 12, no early stop" in result.method


def test_fewer_repeats_than_the_minimum(virtual_clock):
    result, seen = noisy_cost(virtual_clock, 3)
    assert result.repeats_run == 3 and result.stopped == "max_repeats" and result.c_interval is None
    assert [w for _, _, w in seen] == [math.inf] * 3
    assert "no early stop" in result.method


def test_min_repeats_holds_the_rule_back(virtual_clock):
    result, _ = noisy_cost(virtual_clock, 14, rel_tol=0.2, min_repeats=9)
    assert result.repeats_run == 9 and result.stopped == "tight"  # tight from 8 on, allowed from 9


def test_profile_stops_on_its_widest_figure(virtual_clock):
    """``v(1)``'s step (2 tokens per row) takes ``TIMES[r]`` x the undrafted step in repeat ``r``;
    every other step (the MD and SD steps: 5 tokens) a fixed time, so ``s`` is tight from 5 repeats
    on and ``v(1)`` decides: 11 repeats at ``rel_tol = 0.1``."""
    seen = []
    target = tiny_llama()

    def hook(module, args, kwargs):
        width = kwargs["input_ids"].shape[1]
        virtual_clock.sleep(0.01 * (TIMES[min(len(seen), len(TIMES) - 1)] if width == 2 else 1.0))

    target.register_forward_pre_hook(hook, with_kwargs=True)
    profile = measure_engine_profile(target, 1, context_len=6, repeats=14, steps=1, warmup=0, prefill_lengths=(1, 3),
                                     rel_tol=0.1, spread_ratio=0, progress=lambda *a: seen.append(a))
    assert profile.repeats_run == 11 and profile.stopped == "tight"
    assert profile.verify_samples[1] == pytest.approx(TIMES[:11]) and profile.verify_samples[0] == [1.0] * 11
    assert profile.verify_interval[0] == [1.0, 1.0] and profile.verify_interval[1] == pytest.approx([1.0, 1.0])
    assert profile.md_overhead_interval == {"dense": pytest.approx([0.0, 0.0], abs=1e-9),
                                            "onehot": pytest.approx([0.0, 0.0], abs=1e-9)}
    data = profile.to_dict()
    assert data["repeats_run"] == 11 and data["verify_interval"] == profile.verify_interval and data["rel_tol"] == 0.1


def test_exact_profile_stops_at_5_and_rel_tol_0_keeps_the_old_count(virtual_clock):
    target = tiny_llama()
    target.register_forward_pre_hook(lambda module, args: virtual_clock.sleep(0.01))
    kwargs = dict(context_len=4, repeats=7, steps=1, warmup=0, prefill_lengths=(1, 3))
    assert measure_engine_profile(target, 2, **kwargs).repeats_run == 5
    old = measure_engine_profile(target, 2, rel_tol=0, spread_ratio=0, **kwargs)
    assert old.repeats_run == 7 and old.stopped == "max_repeats" and len(old.verify_samples[2]) == 7


def test_measurements_in_turn_stop_each_by_its_own_rule(virtual_clock):
    """Two drafters' costs run in turn (``run_in_turn``): one repeat of each per round. Drafter 0's
    forward takes ``TIMES[r]`` in its repeat ``r`` (it stops at 11, as alone), drafter 1's a fixed
    time (exact from the first repeat: it stops at 5, the least the interval needs). The repeats
    alternate while both are open, drafter 1 is done (and handed to ``done``) first, and each
    result is the one it gives alone."""
    from mdboost.engine.costs import cost_repeats, run_in_turn

    runs = {0: 0, 1: 0}
    order, finished = [], []

    def progress(i, done, total, width):
        runs[i] += 1
        order.append(i)

    target, noisy, steady = tiny_llama(seed=0), tiny_llama(seed=1), tiny_llama(seed=2)
    target.register_forward_pre_hook(lambda module, args: virtual_clock.sleep(0.01))
    noisy.register_forward_pre_hook(lambda module, args: virtual_clock.sleep(0.01 * TIMES[min(runs[0], len(TIMES) - 1)]))
    steady.register_forward_pre_hook(lambda module, args: virtual_clock.sleep(0.005))
    kwargs = dict(context_len=6, repeats=14, steps=2, warmup=1, prefill_lengths=(1, 2), rel_tol=0.1, spread_ratio=0)
    first, second = run_in_turn([cost_repeats(noisy, target, **kwargs), cost_repeats(steady, target, **kwargs)],
                                progress, lambda i, result: finished.append((i, result.repeats_run)))
    assert order == [0, 1] * 5 + [0] * 6 and finished == [(1, 5), (0, 11)]
    assert first.samples == pytest.approx(TIMES[:11]) and first.stopped == "tight"
    assert second.samples == pytest.approx([0.5] * 5) and second.stopped == "tight"


def test_a_measurement_checks_its_arguments_when_made():
    """A generator runs nothing until asked: the measurements check their arguments at the call,
    so a bad figure of a pool fails before any other figure's repeats are spent."""
    from mdboost.engine.costs import cost_repeats, profile_repeats

    with pytest.raises(ValueError, match="repeats"):
        cost_repeats(tiny_llama(seed=1), tiny_llama(), repeats=0)
    with pytest.raises(ValueError, match="gamma_max"):
        profile_repeats(tiny_llama(), 0)
