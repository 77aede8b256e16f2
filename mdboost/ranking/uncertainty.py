"""Uncertainty of the ranking's predictions: a bootstrap over prompts.

Every predicted figure of a pair (speedup, acceptance, mean accepted length, tokens per target
call) is a ratio of sums over the cached sequences, one sequence per prompt. Positions within a
prompt are correlated (acceptance runs along a text), so the resampling unit is the prompt, not
the position: a resample draws ``B`` prompts with replacement, i.e. integer weights
``w ~ Multinomial(B, 1/B)`` over the ``B`` sequences, and every sum over sequences becomes the
weighted sum (:func:`resample_sums`). Ratios are formed per resample; the interval is the
percentile interval of the resampled values (:func:`percentile_interval`; Efron & Tibshirani
1993, ch. 13), *expanded* for the number of prompts ``B`` (Hesterberg 2015, "What teachers
should know about the bootstrap", The American Statistician 69(4), section 5): the
quantiles taken are ``alpha' / 2`` and ``1 - alpha' / 2`` with
``alpha' / 2 = Phi(-sqrt(B / (B - 1)) t_{B-1, (1 + level) / 2})`` (:func:`expanded_tail`),
which corrects the plain percentile interval's narrowness at small ``B`` (it covers about
``level`` only for large ``B``; ``bench/interval_coverage.py`` measures both). The point
estimate stays the full-sample value (weights 1), so it need not be the interval's midpoint,
and a skewed interval is reported as such.

The cost ratio of the drafter is measured, not known: when its repeated measurements are
given, each resample also draws one cost ratio (:func:`resample_values`), so the interval of
the speedup carries the timing spread as well as the prompt-to-prompt spread.

All randomness comes from a seeded ``torch.Generator``: the same inputs and seed give the same
intervals.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from scipy import stats

from mdboost.ranking.options import DEFAULT_LEVEL, DEFAULT_RESAMPLES  # torch-free (a config's defaults)


@dataclass(frozen=True)
class BootstrapSettings:
    """How intervals are computed.

    Attributes
    ----------
    num_resamples : int, default=1000
        Bootstrap resamples of the prompts (``>= 1``); 0 disables the bootstrap (intervals NaN).
    level : float, default=0.9
        Nominal coverage of the interval, in (0, 1) (the percentile interval expanded for the
        number of prompts, see the module docstring).
    seed : int, default=0
        Seeds the resampling generator.
    """

    num_resamples: int = DEFAULT_RESAMPLES
    level: float = DEFAULT_LEVEL
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.num_resamples, bool) or not isinstance(self.num_resamples, int) or self.num_resamples < 0:
            raise ValueError(f"num_resamples must be an int >= 0, got {self.num_resamples!r}")
        if isinstance(self.level, bool) or not isinstance(self.level, (int, float)) or not 0 < self.level < 1:
            raise ValueError(f"level must be a float in (0, 1), got {self.level!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")


def prompt_weights(num_prompts: int, settings: BootstrapSettings) -> torch.Tensor:  # -> [R, B] float64
    """Resampling weights: row ``r`` counts how often each of the ``B`` prompts is drawn.

    >>> w = prompt_weights(5, BootstrapSettings(num_resamples=3, seed=1))
    >>> w.shape, w.sum(dim=1).tolist()
    (torch.Size([3, 5]), [5.0, 5.0, 5.0])
    """
    if isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts < 1:
        raise ValueError(f"num_prompts must be an int >= 1, got {num_prompts!r}")
    gen = torch.Generator().manual_seed(settings.seed)
    draws = torch.randint(0, num_prompts, (settings.num_resamples, num_prompts), generator=gen)
    weights = torch.zeros(settings.num_resamples, num_prompts, dtype=torch.float64)
    return weights.scatter_add_(1, draws, torch.ones_like(draws, dtype=torch.float64))


def resample_sums(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:  # [..., B], [R, B] -> [R, ...]
    """Weighted sums over the last axis (the prompts), one per resample.

    >>> resample_sums(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[2.0, 0.0], [1.0, 1.0]])).tolist()
    [[2.0, 6.0], [3.0, 7.0]]
    """
    values = torch.as_tensor(values, dtype=torch.float64)
    weights = torch.as_tensor(weights, dtype=torch.float64)
    if values.shape[-1] != weights.shape[-1]:
        raise ValueError(f"values cover {values.shape[-1]} prompts, weights {weights.shape[-1]}")
    return torch.einsum("rb,...b->r...", weights, values)


def resample_tables(samples, num_resamples: int, seed: int = 0) -> torch.Tensor:  # [K, S] -> [R, K]
    """One measured repeat's whole table per resample: ``samples[k][j]`` is the ``k``-th entry of
    repeat ``j`` (a repeat measures all entries together, so they are drawn together).

    >>> resample_tables([[1.0, 1.0], [2.0, 3.0]], 3, seed=0).shape
    torch.Size([3, 2])
    """
    table = torch.as_tensor(samples, dtype=torch.float64)
    if table.ndim != 2 or table.shape[1] == 0:
        raise ValueError(f"samples must be a [K, S] table with S >= 1 repeats, got shape {tuple(table.shape)}")
    gen = torch.Generator().manual_seed(seed + 2)  # neither the prompts' nor the cost samples' stream
    return table[:, torch.randint(0, table.shape[1], (num_resamples,), generator=gen)].T


def resample_values(samples, num_resamples: int, seed: int = 0) -> torch.Tensor:  # [S] -> [R]
    """One of the measured ``samples`` per resample, drawn uniformly with replacement."""
    samples = torch.as_tensor(samples, dtype=torch.float64).reshape(-1)
    if samples.numel() == 0:
        raise ValueError("samples must hold at least one measurement, got none")
    gen = torch.Generator().manual_seed(seed + 1)  # not the prompts' stream
    return samples[torch.randint(0, samples.numel(), (num_resamples,), generator=gen)]


def expanded_tail(level: float, num_prompts: int) -> float:
    """``alpha' / 2 = Phi(-sqrt(B / (B - 1)) t_{B-1, (1 + level) / 2})``: the lower quantile of the
    expanded percentile interval over ``B = num_prompts`` (0 for one prompt: the resamples' range).

    It tends to ``(1 - level) / 2`` as ``B`` grows.

    >>> round(expanded_tail(0.9, 4), 4), round(expanded_tail(0.9, 16), 4), round(expanded_tail(0.9, 10**6), 4)
    (0.0033, 0.0351, 0.05)
    """
    if isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts < 1:
        raise ValueError(f"num_prompts must be an int >= 1, got {num_prompts!r}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if num_prompts == 1:
        return 0.0
    n = num_prompts
    return float(stats.norm.cdf(-((n / (n - 1)) ** 0.5) * stats.t.ppf((1 + level) / 2, n - 1)))


def percentile_interval(samples: torch.Tensor, level: float = DEFAULT_LEVEL,
                        num_prompts: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lo, hi)``: the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles over axis 0, or with
    ``num_prompts`` those of the expanded interval (:func:`expanded_tail`).

    NaN resamples (a ratio with an empty denominator in that resample) are ignored; an all-NaN
    column gives NaN bounds.

    >>> lo, hi = percentile_interval(torch.arange(101.0)[:, None], 0.9)
    >>> round(float(lo), 9), round(float(hi), 9)
    (5.0, 95.0)
    >>> lo, hi = percentile_interval(torch.arange(101.0)[:, None], 0.9, num_prompts=16)
    >>> round(float(lo), 2), round(float(hi), 2)
    (3.51, 96.49)
    """
    samples = torch.as_tensor(samples, dtype=torch.float64)
    if samples.shape[0] == 0:
        nan = torch.full(samples.shape[1:], float("nan"), dtype=torch.float64)
        return nan, nan.clone()
    tail = (1 - level) / 2 if num_prompts is None else expanded_tail(level, num_prompts)
    q = torch.tensor([tail, 1 - tail], dtype=torch.float64)
    bounds = torch.nanquantile(samples, q, dim=0)
    return bounds[0], bounds[1]
