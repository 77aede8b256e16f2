"""Ranking plots (matplotlib, Agg backend), saved as PNG files for MLflow artifacts.

- :func:`plot_acceptance_vs_budget`: mean MD acceptance against the divergence budget ``D``,
  one panel per generator ``f`` and one line per pair, SD acceptance dotted (the paper's
  Table 2 view: how much acceptance a divergence budget buys for each f).
- :func:`plot_k_vs_acceptance`: the boosting coefficient ``k = sqrt((1+a)/(1-b))`` (median
  over positions) against mean MD acceptance along the budgets (the paper's Table 5).
- :func:`plot_margin_cdf`: empirical CDF of the normalized boosting margins per pair
  (target-first run), with the margin bound at ``theta = 0``.
- :func:`plot_frontier`: acceptance against achieved divergence for every rule and heuristic,
  MD's optimal curve on top (:mod:`mdboost.ranking.frontier`).
"""

from __future__ import annotations

from pathlib import Path

from mdboost._io import atomic_path

import numpy as np


def _plt():
    # deferred: matplotlib: about a second to import; only the plots need it
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # deferred: after choosing the Agg backend

    return plt


def _pair(row: dict) -> str:
    return f"{row['drafter']} -> {row['target']}"


def _save(fig, path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return Path(path)


def plot_acceptance_vs_budget(rows: list[dict], path) -> Path:
    """One panel per divergence: ``md_acceptance`` vs ``max_divergence`` per pair."""
    plt = _plt()
    divs = sorted({r["divergence"] for r in rows})
    fig, axes = plt.subplots(1, len(divs), figsize=(4.5 * len(divs), 3.6), squeeze=False, sharey=True)
    for ax, div in zip(axes[0], divs):
        ax.set_prop_cycle(color=plt.cm.tab20.colors)
        for pair in sorted({_pair(r) for r in rows}):
            mine = sorted((r for r in rows if r["divergence"] == div and _pair(r) == pair),
                          key=lambda r: r["max_divergence"])
            if not mine:
                continue
            line, = ax.plot([r["max_divergence"] for r in mine], [r["md_acceptance"] for r in mine],
                            marker="o", ms=3, label=pair)
            ax.axhline(mine[0]["sd_acceptance"], ls=":", lw=0.8, color=line.get_color())
        ax.set_title(f"f = {div}")
        ax.set_xlabel("divergence budget D")
    axes[0][0].set_ylabel("mean acceptance (MD; SD dotted)")
    axes[0][-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return _save(fig, path)


def plot_k_vs_acceptance(rows: list[dict], path) -> Path:
    """Median ``k`` against mean MD acceptance along the budgets, per pair and divergence."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.set_prop_cycle(color=plt.cm.tab20.colors)
    for key in sorted({(_pair(r), r["divergence"]) for r in rows}):
        mine = sorted((r for r in rows if (_pair(r), r["divergence"]) == key), key=lambda r: r["max_divergence"])
        k = np.array([r["k_median"] for r in mine], dtype=float)
        keep = np.isfinite(k)
        if keep.any():
            ax.plot(np.array([r["md_acceptance"] for r in mine])[keep], k[keep], marker="o", ms=3,
                    label=f"{key[0]} ({key[1]})")
    ax.set_xlabel("mean MD acceptance")
    ax.set_ylabel("median k = sqrt((1+a)/(1-b))")
    ax.legend(fontsize=5, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return _save(fig, path)


def plot_margin_cdf(margins: dict[str, np.ndarray], bounds: dict[str, float], path) -> Path:
    """Empirical CDF of normalized margins per pair; the bound at theta = 0 as a marker."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.set_prop_cycle(color=plt.cm.tab20.colors)
    for name, m in sorted(margins.items()):
        m = np.sort(np.asarray(m, dtype=float))
        if m.size == 0:
            continue
        line, = ax.step(m, np.arange(1, m.size + 1) / m.size, where="post", label=name)
        if name in bounds:
            ax.plot([0.0], [min(bounds[name], 1.0)], marker="x", color=line.get_color())
    ax.set_xlabel("normalized margin theta")
    ax.set_ylabel("fraction of positions with margin <= theta")
    ax.set_xlim(-1, 1)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return _save(fig, path)


def plot_frontier(fr, path, title: str | None = None) -> Path:
    """Acceptance against achieved mean divergence: one panel per drafting, each heuristic along its
    parameter grid (markers), a dotted rise from each point to MD's acceptance at the point's own
    per-position divergences (the optimality gap), and MD's curve at one budget for every position
    on top (:class:`mdboost.ranking.frontier.Frontier`)."""
    plt = _plt()
    modes = list(fr.curves)
    fig, axes = plt.subplots(1, len(modes), figsize=(4.8 * len(modes), 3.8), squeeze=False, sharey=True)
    markers = dict(lenient="o", typical="s", fuzzy="^", threshold="D", fly="v")
    for ax, mode in zip(axes[0], modes):
        ax.set_prop_cycle(color=plt.cm.tab10.colors)
        for rule in sorted({pt.rule for pt in fr.points if pt.drafting == mode}):
            mine = sorted((pt for pt in fr.points if pt.drafting == mode and pt.rule == rule and
                           np.isfinite(pt.divergence_mean)), key=lambda pt: pt.divergence_mean)
            if mine:
                line, = ax.plot([pt.divergence_mean for pt in mine], [pt.acceptance for pt in mine], lw=0.6,
                                marker=markers.get(rule, "x"), ms=4, label=rule)
                for pt in mine:  # the optimality gap: MD at the point's own per-position divergences
                    ax.plot([pt.divergence_mean] * 2, [pt.acceptance, pt.md_acceptance], lw=0.8, ls=":",
                            color=line.get_color())
        curve = sorted((pt for pt in fr.curves[mode] if np.isfinite(pt.divergence_mean)),
                       key=lambda pt: pt.divergence_mean)
        ax.plot([pt.divergence_mean for pt in curve], [pt.acceptance for pt in curve], color="black", lw=1.6,
                zorder=5, label="MD, one budget")
        ax.set_xscale("symlog", linthresh=1e-3)
        ax.set_title(f"{mode} drafts" if title is None else f"{title}: {mode} drafts", fontsize=9)
        ax.set_xlabel(f"achieved mean D_{fr.divergence}(pi || q)")
    axes[0][0].set_ylabel("mean acceptance")
    axes[0][-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return _save(fig, path)
