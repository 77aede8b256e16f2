"""Prediction quality of a ranking: predicted vs realized acceptance and speedup per pair.

The ranking predicts, per drafter/target pair and operating point, the mean acceptance
(exact f-MD solution over cached logits, the curve C(p, q) of
``docs/theory.md``, "The clamp solution and the curve C(p, q)") and the walltime speedup
(Leviathan et al.'s speed model, ``docs/theory.md``, "Speed model for ranking"). Real mentored
decoding runs realize both. This module compares them: per-pair absolute errors, Spearman's
rank correlation across pairs (average ranks for ties, like ``scipy.stats.spearmanr``), and
whether the pair predicted best is also best in reality. Validation goals (``docs/validation.md``, "Prediction
quality"): acceptance within 0.03 per pair, Spearman >= 0.9, top pair agreement.

The predicted acceptance is the ranking's ``engine_acceptance`` (the draft-start process of
:mod:`mdboost.ranking.process`: position-0 acceptance weighted by where the engine drafts) when
present, else ``md_acceptance`` (:func:`predicted_acceptance`). Realized acceptance comes in two estimators of the same expectation: the position-0 accept
rate (``realized_acceptance``) and its Rao-Blackwellized version (``expected_acceptance``, mean
``P_acc`` over the same drafts); the acceptance metrics are reported for both, the latter with
the suffix ``_expected``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mdboost.ranking.report import ALONE


def predicted_acceptance(row: dict) -> tuple[float, bool]:
    """``(value, from_process)``: the acceptance a ranking row predicts for the engine.

    The draft-start process's ``engine_acceptance`` (expected acceptance at draft position 0
    where the engine actually drafts; ``docs/ranking.md``) when the row has a finite one, else
    the i.i.d. mean over all cached positions, ``md_acceptance``; NaN for the drafter decoding
    alone (rule ``"alone"``: nothing is drafted). Rows may hold strings (CSV).
    """
    if row.get("rule") == ALONE:
        return math.nan, False
    value = row.get("engine_acceptance")
    try:
        value = float(value)
    except (TypeError, ValueError):
        value = math.nan
    if math.isfinite(value):
        return value, True
    value = float(row["md_acceptance"])
    if not math.isfinite(value):
        raise ValueError(f"row must hold a finite md_acceptance, got {row['md_acceptance']!r}")
    return value, False


def _vector(name: str, values) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {arr.tolist()}")
    return arr


def _pair_of(name_a: str, a, name_b: str, b) -> tuple[np.ndarray, np.ndarray]:
    x, y = _vector(name_a, a), _vector(name_b, b)
    if x.shape != y.shape:
        raise ValueError(f"{name_a} and {name_b} must have the same length, got {x.size} and {y.size}")
    return x, y


def absolute_errors(predicted, realized) -> np.ndarray:
    """Per-pair ``|predicted - realized|``."""
    x, y = _pair_of("predicted", predicted, "realized", realized)
    return np.abs(x - y)


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing the mean of their positions."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    starts = np.r_[True, sorted_x[1:] != sorted_x[:-1]]
    group = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.r_[first[1:], x.size] - 1
    ranks = np.empty(x.size)
    ranks[order] = (first[group] + last[group]) / 2.0 + 1.0
    return ranks


def spearman(predicted, realized) -> float:
    """Spearman rank correlation; NaN when fewer than 2 pairs or either side is constant."""
    x, y = _pair_of("predicted", predicted, "realized", realized)
    if x.size < 2:
        return float("nan")
    rx, ry = _average_ranks(x) - (x.size + 1) / 2.0, _average_ranks(y) - (y.size + 1) / 2.0
    denom = np.sqrt(np.sum(rx * rx) * np.sum(ry * ry))
    return float(np.sum(rx * ry) / denom) if denom > 0 else float("nan")


def top_pair_agrees(predicted, realized) -> bool:
    """True if the pair predicted best is (one of) the best realized (ties count as agreement)."""
    x, y = _pair_of("predicted", predicted, "realized", realized)
    return bool(y[int(np.argmax(x))] == np.max(y))


@dataclass(frozen=True)
class PredictionQuality:
    """Prediction-quality summary across pairs (arrays follow the input order)."""

    acceptance_error: np.ndarray  # [n_pairs] |predicted - realized| acceptance
    speedup_error: np.ndarray     # [n_pairs] |predicted - realized| speedup
    acceptance_spearman: float
    speedup_spearman: float
    top_pair_agrees: bool
    tolerance: float
    expected_acceptance_error: np.ndarray | None = None  # [n_finite] |predicted - expected| acceptance
    expected_acceptance_spearman: float = math.nan

    def as_metrics(self) -> dict[str, float]:
        """Flat metric dict for MLflow (NaN Spearman when undefined)."""
        acc, spd = self.acceptance_error, self.speedup_error
        out = {} if self.expected_acceptance_error is None else _acceptance_metrics(
            self.expected_acceptance_error, self.expected_acceptance_spearman, self.tolerance, "_expected")
        return out | {
            "acceptance_mae": float(acc.mean()), "acceptance_max_error": float(acc.max()),
            "acceptance_within_tolerance": float(np.mean(acc <= self.tolerance)),
            "speedup_mae": float(spd.mean()), "speedup_max_error": float(spd.max()),
            "acceptance_spearman": self.acceptance_spearman,
            "speedup_spearman": self.speedup_spearman,
            "top_pair_agrees": float(self.top_pair_agrees),
        }


def _acceptance_metrics(err: np.ndarray, rho: float, tolerance: float, suffix: str) -> dict[str, float]:
    return {f"acceptance_mae{suffix}": float(err.mean()), f"acceptance_max_error{suffix}": float(err.max()),
            f"acceptance_within_tolerance{suffix}": float(np.mean(err <= tolerance)),
            f"acceptance_spearman{suffix}": rho, f"acceptance_points{suffix}": float(err.size)}


def prediction_quality(predicted_acceptance, realized_acceptance, predicted_speedup,
                       realized_speedup, *, tolerance: float = 0.03, expected_acceptance=None) -> PredictionQuality:
    """Compare a ranking's predictions with realized runs, pair by pair.

    Parameters
    ----------
    predicted_acceptance, realized_acceptance : array-like of shape (n_pairs,)
        Mean per-token acceptance in [0, 1].
    predicted_speedup, realized_speedup : array-like of shape (n_pairs,)
        Walltime speedup over autoregressive decoding (> 0).
    tolerance : float
        Absolute acceptance error counted as "within tolerance" (>= 0; the validation goal is 0.03).
    expected_acceptance : array-like of shape (n_pairs,), optional
        The Rao-Blackwellized realized acceptance; NaN entries (not measurable) are left out of
        its metrics, which are absent when no entry is finite.

    Returns
    -------
    PredictionQuality

    Examples
    --------
    >>> q = prediction_quality([0.5, 0.7], [0.52, 0.69], [1.2, 1.5], [1.1, 1.6])
    >>> round(q.as_metrics()["acceptance_mae"], 3), q.acceptance_spearman, q.top_pair_agrees
    (0.015, 1.0, True)
    """
    if not (isinstance(tolerance, (int, float)) and tolerance >= 0):
        raise ValueError(f"tolerance must be a number >= 0, got {tolerance!r}")
    pa, ra = _pair_of("predicted_acceptance", predicted_acceptance, "realized_acceptance", realized_acceptance)
    ps, rs = _pair_of("predicted_speedup", predicted_speedup, "realized_speedup", realized_speedup)
    if pa.size != ps.size:
        raise ValueError(f"acceptance and speedup must cover the same pairs, got {pa.size} and {ps.size}")
    for name, arr in (("predicted_acceptance", pa), ("realized_acceptance", ra)):
        if np.any((arr < 0) | (arr > 1)):
            raise ValueError(f"{name} must lie in [0, 1], got {arr.tolist()}")
    exp_err, exp_rho = None, math.nan
    if expected_acceptance is not None:
        ea = np.asarray(expected_acceptance, dtype=float)
        if ea.shape != pa.shape:
            raise ValueError(f"expected_acceptance must have {pa.size} entries, got shape {ea.shape}")
        keep = np.isfinite(ea)
        if np.any((ea[keep] < 0) | (ea[keep] > 1)):
            raise ValueError(f"expected_acceptance must lie in [0, 1], got {ea.tolist()}")
        if keep.any():
            exp_err, exp_rho = np.abs(pa[keep] - ea[keep]), spearman(pa[keep], ea[keep])
    return PredictionQuality(
        acceptance_error=np.abs(pa - ra), speedup_error=np.abs(ps - rs),
        acceptance_spearman=spearman(pa, ra), speedup_spearman=spearman(ps, rs),
        top_pair_agrees=top_pair_agrees(ps, rs), tolerance=float(tolerance),
        expected_acceptance_error=exp_err, expected_acceptance_spearman=exp_rho)
