"""Ranking plots (matplotlib, Agg backend), saved as PNG files for MLflow artifacts.

- :func:`plot_speedup_by_drafter`: the predicted speedup with its interval, each drafter's best
  point per temperature, against plain decoding's 1 (the verdict's picture).
- :func:`plot_acceptance_vs_budget`: mean MD acceptance against the divergence budget ``D``,
  one panel per generator ``f``, one colour per drafter, one line style per temperature (the
  paper's Table 2 view: how much acceptance a divergence budget buys for each f).
- :func:`plot_k_vs_acceptance`: the boosting coefficient ``k = sqrt((1+a)/(1-b))`` (median
  over positions, log scale) against mean MD acceptance along the budgets (the paper's Table 5).

Every plot gives a drafter the same colour (:func:`drafter_colours`).
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


def drafter_colours(drafters) -> dict:
    """One colour per drafter, the same in every plot of a ranking (tab10, then tab20's light
    shades), in the drafters' sorted order."""
    plt = _plt()
    names = sorted(set(drafters))
    palette = list(plt.cm.tab10.colors) + list(plt.cm.tab20.colors[1::2])
    return {name: palette[i % len(palette)] for i, name in enumerate(names)}


_STYLES = ("-", "--", ":", "-.")


def _temperature_styles(rows: list[dict]) -> dict:
    return {t: _STYLES[i % len(_STYLES)] for i, t in enumerate(sorted({float(r["temperature"]) for r in rows}))}


def _style_legend(ax, colours: dict, styles: dict, what: str) -> None:
    """A legend of the drafters' colours, then the line styles of ``what`` (e.g. temperatures)."""
    from matplotlib.lines import Line2D  # deferred: matplotlib: only the plots need it

    handles = [Line2D([], [], color=c, marker="o", ms=4, label=d) for d, c in colours.items()]
    if len(styles) > 1:
        handles += [Line2D([], [], color="gray", ls=ls, label=f"{what} {value:g}" if isinstance(value, float)
                           else f"{what} {value}") for value, ls in styles.items()]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))


def plot_acceptance_vs_budget(rows: list[dict], path) -> Path:
    """One panel per divergence: ``md_acceptance`` vs ``max_divergence``, one colour per drafter
    and one line style per temperature; SD's acceptance (budget 0) is the line's first point."""
    plt = _plt()
    divs = sorted({r["divergence"] for r in rows})
    colours, styles = drafter_colours(r["drafter"] for r in rows), _temperature_styles(rows)
    fig, axes = plt.subplots(1, len(divs), figsize=(4.2 * len(divs), 3.4), squeeze=False, sharey=True)
    for ax, div in zip(axes[0], divs):
        for key in sorted({(_pair(r), r["drafter"], float(r["temperature"])) for r in rows}):
            mine = sorted((r for r in rows if r["divergence"] == div and (_pair(r), r["drafter"],
                                                                         float(r["temperature"])) == key),
                          key=lambda r: float(r["max_divergence"]))
            if mine:
                ax.plot([float(r["max_divergence"]) for r in mine], [float(r["md_acceptance"]) for r in mine],
                        marker="o", ms=3, color=colours[key[1]], ls=styles[key[2]])
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set_title(f"f = {div}")
        ax.set_xlabel("divergence budget D (symlog)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("mean acceptance (budget 0: SD)")
    _style_legend(axes[0][-1], colours, styles, "T =")
    return _save(fig, path)


def plot_k_vs_acceptance(rows: list[dict], path) -> Path:
    """Median ``k`` (log scale: it spans orders of magnitude) against mean MD acceptance along the
    budgets, one colour per drafter, one line style per divergence (temperatures as separate lines)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    colours = drafter_colours(r["drafter"] for r in rows)
    styles = {d: _STYLES[i % len(_STYLES)] for i, d in enumerate(sorted({r["divergence"] for r in rows}))}
    for key in sorted({(_pair(r), r["drafter"], r["divergence"], float(r["temperature"])) for r in rows}):
        mine = sorted((r for r in rows if (_pair(r), r["drafter"], r["divergence"], float(r["temperature"])) == key),
                      key=lambda r: float(r["max_divergence"]))
        k = np.array([float(r["k_median"]) for r in mine], dtype=float)
        keep = np.isfinite(k) & (k > 0)
        if keep.any():
            ax.plot(np.array([float(r["md_acceptance"]) for r in mine])[keep], k[keep], marker="o", ms=3,
                    color=colours[key[1]], ls=styles[key[2]])
    ax.set_yscale("log")
    ax.set_xlabel("mean MD acceptance")
    ax.set_ylabel("median k = sqrt((1+a)/(1-b)) (log)")
    ax.grid(alpha=0.3, which="both")
    _style_legend(ax, colours, styles, "f =")
    return _save(fig, path)


def plot_speedup_by_drafter(rows: list[dict], path) -> Path:
    """Predicted speedup over plain decoding with its interval: per drafter and temperature, its
    best point (the first in rank order among the rows given), one colour per drafter, the line
    at 1 where plain decoding is as fast."""
    plt = _plt()
    best: dict = {}
    for r in rows:  # rank order: the first row of a (drafter, temperature) is its best
        best.setdefault((r["drafter"], float(r["temperature"])), r)
    keys = sorted(best, key=lambda k: (-float(best[k]["predicted_speedup"]), k))
    colours = drafter_colours(k[0] for k in keys)
    fig, ax = plt.subplots(figsize=(7.0, 0.34 * len(keys) + 1.2))
    for y, key in enumerate(reversed(keys)):
        r = best[key]
        x, lo, hi = (float(r.get(k, "nan") or "nan") for k in ("predicted_speedup", "predicted_speedup_lo",
                                                                "predicted_speedup_hi"))
        err = None if not (np.isfinite(lo) and np.isfinite(hi)) else [[max(x - lo, 0)], [max(hi - x, 0)]]
        ax.errorbar([x], [y], xerr=err, fmt="o", color=colours[key[0]], capsize=3, ms=5)
    ax.axvline(1.0, color="black", lw=0.8, ls="--")
    ax.set_yticks(range(len(keys)), [f"{d}, T={t:g}" for d, t in reversed(keys)], fontsize=8)
    ax.set_xlabel("predicted speedup over plain decoding (90% interval); 1 = as fast")
    ax.grid(alpha=0.3, axis="x")
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
