"""Predicted-vs-realized scatter plot of a validation run (matplotlib, Agg backend).

Two panels, acceptance and speedup: one labelled point per cell (x = predicted by the ranking,
y = realized by real generation), the predicted 90% interval as a horizontal bar where the
ranking has one, the identity line, and for acceptance a +-tolerance band (the validation
goal of 0.03, ``docs/validation.md``, "Prediction quality"). Saved atomically as PNG, next to
``validation.csv`` and for MLflow artifacts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from mdboost._io import atomic_path

import numpy as np


def _plt():
    # deferred: matplotlib: about a second to import; only the plots need it
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # deferred: after choosing the Agg backend

    return plt


def _panel(ax, predicted, realized, labels, title, tolerance=None, interval=None) -> None:
    lo_b, hi_b = interval if interval is not None else (np.full_like(predicted, np.nan),) * 2
    shown = np.isfinite(realized) & np.isfinite(predicted)  # an acceptance is NaN where a cell drafts nothing: no point
    predicted, realized, lo_b, hi_b = predicted[shown], realized[shown], lo_b[shown], hi_b[shown]
    labels = [label for label, keep in zip(labels, shown) if keep]
    has = np.isfinite(lo_b) & np.isfinite(hi_b)
    values = np.concatenate([predicted, realized, lo_b[has], hi_b[has]])
    lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)
    pad = 0.05 * (hi - lo) if hi > lo else 0.05
    line = np.array([lo - pad, hi + pad])
    ax.plot(line, line, color="grey", lw=0.8, ls="--", label="predicted = realized")
    if tolerance is not None:
        ax.fill_between(line, line - tolerance, line + tolerance, color="grey", alpha=0.15,
                        label=f"+-{tolerance:g}")
    if has.any():
        err = np.vstack([predicted[has] - lo_b[has], hi_b[has] - predicted[has]])  # [2, n_with_interval]
        ax.errorbar(predicted[has], realized[has], xerr=np.clip(err, 0, None), fmt="none", ecolor="tab:blue",
                    alpha=0.5, lw=0.8, label="predicted 90% interval")
    ax.scatter(predicted, realized, s=18, zorder=3)
    for x, y, label in zip(predicted, realized, labels):
        ax.annotate(label, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xlim(*line)
    ax.set_ylim(*line)
    ax.set_xlabel("predicted")
    ax.set_ylabel("realized")
    ax.set_title(title)
    ax.legend(fontsize=6, loc="upper left")


def plot_predicted_vs_realized(labels: Sequence[str], predicted_acceptance, realized_acceptance,
                               predicted_speedup, realized_speedup, path, *,
                               tolerance: float = 0.03, acceptance_interval=None, speedup_interval=None) -> Path:
    """Save the two-panel scatter (acceptance, speedup) to ``path``; returns the path.

    Parameters
    ----------
    labels : sequence of str
        One name per pair (e.g. ``"drafter -> target @ kl 0.1"``).
    predicted_acceptance, realized_acceptance, predicted_speedup, realized_speedup : array-like
        Shape (n_pairs,) each, finite; a realized acceptance may be NaN (a cell whose runs drafted
        nothing, e.g. under a draft floor), and the predicted one with it (the drafter decoding
        alone predicts none): its point is left out of the acceptance panel.
    path : str or Path
        PNG file to write (parent folders are created).
    tolerance : float
        Half-width of the acceptance band around the identity line.
    acceptance_interval, speedup_interval : (lo, hi) of array-likes of shape (n_pairs,), optional
        The predicted intervals, drawn as horizontal bars (NaN bounds: no bar).
    """
    arrays = [np.asarray(a, dtype=float) for a in
              (predicted_acceptance, realized_acceptance, predicted_speedup, realized_speedup)]
    n = len(labels)
    if n == 0:
        raise ValueError("labels must name at least one pair, got none")
    for name, arr in zip(("predicted_acceptance", "realized_acceptance", "predicted_speedup",
                          "realized_speedup"), arrays):
        # a realized acceptance may be NaN (nothing drafted); a predicted one only where the realized one is too
        nan_ok = {"realized_acceptance": np.isnan(arr),
                  "predicted_acceptance": np.isnan(arr) & (np.isnan(arrays[1]) if arrays[1].shape == arr.shape else False)}
        finite = np.isfinite(arr) | nan_ok.get(name, False)
        if arr.shape != (n,) or not np.all(finite):
            raise ValueError(f"{name} must be {n} finite numbers (one per label), got {arr.tolist()}")
    plt = _plt()
    fig, (ax_acc, ax_spd) = plt.subplots(1, 2, figsize=(9, 4.2))
    bounds = [None if b is None else tuple(np.asarray(x, dtype=float).reshape(n) for x in b)
              for b in (acceptance_interval, speedup_interval)]
    _panel(ax_acc, arrays[0], arrays[1], labels, "acceptance", tolerance, bounds[0])
    _panel(ax_spd, arrays[2], arrays[3], labels, "speedup vs AR", interval=bounds[1])
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return Path(path)
