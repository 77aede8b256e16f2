"""Are the ranking's intervals and its pick right? Coverage, errors, rank correlation, regret.

Over a set of validated cells (operating points run for real), each with a predicted value, its
predicted interval ``[lo, hi]`` and the realized value:

- **coverage**: the share of realized values inside their predicted interval (a calibrated 90%
  interval covers about 90% of cells; far less means over-confident, far more too wide);
- **MAE** and **Spearman** of predicted vs realized (:mod:`mdboost.validation.prediction`);
- **regret of the pick**: ``1 - realized[pick] / max(realized)``, with ``pick`` the cell with the
  largest predicted value: 0 when the predicted-best cell is also the realized best among the
  validated cells, 0.2 when it realizes 20% less than the best one.

The ranking's intervals are for the expected value over prompts like its ``n`` cached ones; a
validation realizes the mean over ``m`` other prompts, which varies by itself.
:func:`predictive_scale` is the factor that turns the first into an interval for the second.
A realized speedup is also a timing: the same generations timed again give another value.
:func:`timing_noise` estimates that spread from repeated passes, and :func:`predictive_interval`
adds it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from mdboost.validation.prediction import spearman


def _arrays(**named) -> list[np.ndarray]:
    out = [np.asarray(v, dtype=float).reshape(-1) for v in named.values()]
    sizes = {name: a.size for name, a in zip(named, out)}
    if len(set(sizes.values())) != 1 or not next(iter(sizes.values())):
        raise ValueError(f"{', '.join(named)} must be non-empty and of one length, got sizes {sizes}")
    return out


def coverage(realized, lo, hi) -> float:
    """Share of ``realized`` values with ``lo <= realized <= hi`` (NaN bounds count as misses).

    >>> coverage([1.0, 2.0, 3.0, 4.0], [0.5, 2.5, 2.0, 3.0], [1.5, 3.0, 3.5, 5.0])
    0.75
    """
    r, a, b = _arrays(realized=realized, lo=lo, hi=hi)
    if np.isnan(r).any():
        raise ValueError(f"realized must be finite, got {r.tolist()}")
    return float(np.mean((a <= r) & (r <= b)))


def predictive_scale(fit_prompts: int, new_prompts: int) -> float:
    """``sqrt(1 + n / m)``: widen an interval for a mean over prompts, estimated from ``n`` prompts,
    into one for the mean over ``m`` new prompts.

    A mean over prompts with per-prompt spread ``sigma`` is estimated with standard error
    ``sigma / sqrt(n)``; the mean over ``m`` new prompts differs from the expected value by a
    further ``sigma / sqrt(m)``, independently, so the predictive half-width is
    ``z sigma sqrt(1/n + 1/m)`` = the interval's ``z sigma / sqrt(n)`` times ``sqrt(1 + n/m)``
    (normal approximation; applied to each side of the interval about its point).

    >>> predictive_scale(16, 16) == 2 ** 0.5
    True
    """
    for name, value in (("fit_prompts", fit_prompts), ("new_prompts", new_prompts)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return float(np.sqrt(1 + fit_prompts / new_prompts))


@dataclass(frozen=True)
class TimingNoise:
    """The realized figures' timing noise, from passes that repeat the same generations.

    ``sd_log``: the pooled standard deviation of one pass's ``log`` realized speedup about its
    cell's mean (``df`` degrees of freedom); ``half_width_log``: the half-width, on the log scale,
    of a ``level`` interval for the mean over ``passes`` passes (``t_df sd_log / sqrt(passes)``).
    """

    passes: int
    cells: int
    df: int
    sd_log: float
    level: float
    half_width_log: float

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """The noise and the intervals' widening in one line (the terminal's and ``bench/RESULTS.md``'s).

        >>> TimingNoise(2, 13, 13, 0.02, 0.9, 0.025).describe()
        "2 passes of the same generations: a pass's realized speedup varies by 2.0% (pooled sd over 13 cells, 13 df); the speedup intervals add +-2.5% for it"
        """
        return (f"{self.passes} passes of the same generations: a pass's realized speedup varies by "
                f"{math.expm1(self.sd_log):.1%} (pooled sd over {self.cells} cells, {self.df} df); "
                f"the speedup intervals add +-{math.expm1(self.half_width_log):.1%} for it")


ONE_PASS = "one pass: the realized speedups' timing noise not measured, not in the intervals"
"""What :meth:`TimingNoise.describe` says when there is no estimate (``generation.passes: 1``)."""


def timing_noise(per_pass, level: float) -> TimingNoise | None:
    """How much a realized speedup moves when the same generations are timed again.

    ``per_pass`` holds, per cell, its realized speedup in each pass (the passes repeat the same
    work with the same seeds, so they differ only in the machine's timing). A cell's figure is
    the ratio over all its passes; the log of a pass's figure varies about the cell's with one
    spread ``sigma`` for every cell (the machine's, pooled: ``sum (x - mean_cell)^2 / df`` over
    ``df = sum (passes - 1)``), so the mean over ``R`` passes has standard error
    ``sigma / sqrt(R)``, and a ``level`` interval for it takes Student's ``t`` at ``df``
    (the spread is estimated). None with one pass per cell (no spread to estimate).

    >>> t = timing_noise([[1.0, 1.1], [0.5, 0.55]], 0.9)
    >>> t.df, round(t.sd_log, 6) == round(math.log(1.1) / math.sqrt(2), 6)
    (2, True)
    >>> timing_noise([[1.0], [0.5]], 0.9) is None
    True
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    cells = [np.asarray(v, dtype=float).reshape(-1) for v in per_pass]
    if not cells or len({c.size for c in cells}) != 1 or not cells[0].size:
        raise ValueError(f"per_pass must hold one non-empty list of passes per cell, all of one length, "
                         f"got lengths {[c.size for c in cells]}")
    if not all(np.isfinite(c).all() and (c > 0).all() for c in cells):
        raise ValueError(f"per_pass must hold positive finite speedups, got {[c.tolist() for c in cells]}")
    passes = int(cells[0].size)
    if passes < 2:
        return None
    logs = [np.log(c) for c in cells]
    df = len(logs) * (passes - 1)
    sd = float(np.sqrt(sum(float(np.sum((x - x.mean()) ** 2)) for x in logs) / df))
    t = float(stats.t.ppf((1 + level) / 2, df))
    return TimingNoise(passes, len(logs), df, sd, float(level), t * sd / math.sqrt(passes))


def predictive_interval(point: float, lo: float, hi: float, scale: float, prompts: tuple[float, float] | None = None,
                        timing: float = 0.0) -> tuple[float, float]:
    """``[lo, hi]`` made predictive for a measured run on new prompts, each side of ``point`` on its
    own (NaN stays NaN).

    ``prompts`` is the interval's part that comes from the prompts alone (``(lo, hi)`` at fixed
    costs); only that part grows on new prompts, the rest (the costs' measured spread) does not.
    A side of half-width ``h`` whose prompt part is ``h_p`` becomes
    ``sqrt(h^2 + (scale^2 - 1) h_p^2)``: the variances add, and the new prompts' mean adds
    ``(scale^2 - 1)`` times the prompt variance (:func:`predictive_scale`).
    Without ``prompts`` the whole interval is the prompts' (``scale * h``).
    ``timing`` is the realized figure's own timing noise, a half-width on the log scale
    (:attr:`TimingNoise.half_width_log`): it adds ``point (1 - exp(-timing))`` below and
    ``point (exp(timing) - 1)`` above, in quadrature too.

    >>> [round(x, 6) for x in predictive_interval(1.0, 0.8, 1.2, 2.0)]
    [0.6, 1.4]
    >>> [round(x, 6) for x in predictive_interval(1.0, 0.8, 1.2, 2.0, prompts=(1.0, 1.0))]
    [0.8, 1.2]
    >>> [round(x, 6) for x in predictive_interval(1.0, 1.0, 1.0, 1.0, timing=math.log(1.25))]
    [0.8, 1.25]
    """
    if not (timing >= 0 and math.isfinite(timing)):
        raise ValueError(f"timing must be a finite half-width >= 0, got {timing!r}")
    p_lo, p_hi = (lo, hi) if prompts is None else prompts
    grow = scale ** 2 - 1
    below, above = point * -math.expm1(-timing), point * math.expm1(timing)
    return (point - math.sqrt((point - lo) ** 2 + grow * (point - p_lo) ** 2 + below ** 2),
            point + math.sqrt((hi - point) ** 2 + grow * (p_hi - point) ** 2 + above ** 2))


def regret(predicted, realized) -> float:
    """``1 - realized[argmax predicted] / max(realized)`` (first maximum on ties).

    >>> regret([1.1, 1.3, 0.9], [1.2, 1.0, 0.8])
    0.16666666666666663
    """
    p, r = _arrays(predicted=predicted, realized=realized)
    if not (np.isfinite(p).all() and np.isfinite(r).all()) or r.max() <= 0:
        raise ValueError(f"predicted and realized must be finite with a positive realized maximum, got {p.tolist()}, {r.tolist()}")
    return float(1 - r[int(np.argmax(p))] / r.max())


@dataclass(frozen=True)
class Calibration:
    """Prediction quality of one figure over the validated cells."""

    cells: int
    coverage: float
    mae: float
    max_error: float
    spearman: float
    regret: float

    def to_dict(self) -> dict:
        return asdict(self)


def calibration(predicted, lo, hi, realized) -> Calibration:
    """All metrics of the module docstring for one figure (e.g. the speedup).

    Spearman is NaN with fewer than two cells or constant values; the regret is NaN when no
    realized value is positive (every cell realized an acceptance of 0, say: no pick is worse).

    >>> calibration([0.2, 0.1], [0.1, 0.0], [0.3, 0.2], [0.0, 0.0]).regret
    nan
    """
    p, a, b, r = _arrays(predicted=predicted, lo=lo, hi=hi, realized=realized)
    err = np.abs(p - r)
    rho = spearman(p, r)
    lost = regret(p, r) if np.isfinite(r).all() and r.max() > 0 else math.nan
    return Calibration(int(p.size), coverage(r, a, b), float(err.mean()), float(err.max()), rho, lost)
