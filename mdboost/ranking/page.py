"""``ranking.html``: the ranking as a page a person reads (``docs/ranking.md``, "Outputs").

It opens with the verdict and why (:func:`mdboost.ranking.breakeven.reason_line`), where the
costs were measured, and the call that runs the recommendation; then the predicted speedup per
drafter (:func:`mdboost.ranking.plots.plot_speedup_by_drafter`), the top points in a table of a
dozen columns with a glossary of each, the other plots, and a link to the full table
(``ranking_full.html``: every column of every point at its best gamma). Plots are linked by their
path relative to the page (the ``plots/`` folder beside it). Pure HTML and CSS, no script, so it
opens from the file system and in MLflow's artifact view alike.
"""

from __future__ import annotations

import html
import math
import os
from pathlib import Path

from mdboost._io import atomic_write_text
from mdboost.ranking.report import csv_float

# the top table: column -> (header, glossary entry); docs/ranking.md "Metrics" defines each at length
TOP_COLUMNS = {
    "rank": ("rank", "order by predicted speedup among the points whose quality is within the tolerance "
                     "(the others after them)"),
    "drafter": ("drafter", "the drafter: early_exit:N (the target's first N layers), tuned:N (with a tuned-lens "
                           "translator), int8 (dynamic int8 copy of the target), ngram:N (prompt lookup), or a model"),
    "temperature": ("T", "sampling temperature of the target (0: greedy decoding)"),
    "rule": ("rule", "verification rule and how drafts are drawn: mentored (MD: accept as often as the divergence "
                     "budget allows), rejection (lossless SD), block (vLLM's block verification), threshold "
                     "(SGLang's), match (llama.cpp's); sampled or greedy drafts"),
    "budget": ("budget", "the divergence budget f <= D per position of the emitted distribution from the target's "
                         "(SD: 0, lossless)"),
    "gamma": ("gamma", "draft length: tokens drafted per target call (the best one for the point)"),
    "predicted_speedup": ("speedup [90%]", "predicted tokens per second over plain decoding with the target, with "
                                           "its 90% interval over prompts and cost repeats; above 1 is faster"),
    "engine_acceptance": ("acceptance", "expected fraction of drafted tokens the engine accepts"),
    "engine_tokens_per_call": ("tokens / call", "tokens emitted per target call (undrafted calls included)"),
    "cost_ratio": ("c", "drafter cost: one drafted token's time over one target step, measured on this machine"),
    "verify_cost": ("v(gamma)", "time of one target call verifying gamma + 1 tokens, in target steps (1 token = 1)"),
    "quality_ok": ("quality ok", "the point's text NLL under the target is within the tolerance of the target's own"),
}


def _number(value, digits: int = 3) -> str:
    x = csv_float(value)
    if not math.isfinite(x):
        return "n/a" if value in (None, "") else html.escape(str(value))
    return f"{x:.{digits}g}"


def _cell(row: dict, column: str) -> str:
    if column == "rule":
        rule = row.get("rule") or "mentored"
        floor = csv_float(row.get("draft_p_min"), 0.0)
        return html.escape(f"{rule}, {row.get('drafting') or 'sampled'}" + (f", p_min {floor:g}" if floor else ""))
    if column == "budget":
        budget = csv_float(row.get("max_divergence"), 0.0)
        return "0 (lossless)" if budget == 0 else html.escape(f"{row.get('divergence')} <= {budget:g}")
    if column == "predicted_speedup":
        x, lo, hi = (csv_float(row.get(k)) for k in ("predicted_speedup", "predicted_speedup_lo",
                                                     "predicted_speedup_hi"))
        interval = f" [{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) and math.isfinite(hi) else ""
        return f"{x:.2f}x{interval}"
    if column == "quality_ok":
        return "yes" if str(row.get(column)) in ("True", "true", "1") else "no"
    if column in ("rank", "gamma"):
        x = csv_float(row.get(column))
        return str(int(x)) if math.isfinite(x) else "n/a"
    if column == "drafter":
        return html.escape(str(row.get(column, "")))
    return _number(row.get(column))


def top_table(rows: list[dict], top: int) -> str:
    """The first ``top`` rows (rank order) as an HTML table of :data:`TOP_COLUMNS`."""
    head = "".join(f"<th title='{html.escape(TOP_COLUMNS[c][1], quote=True)}'>{html.escape(TOP_COLUMNS[c][0])}</th>"
                   for c in TOP_COLUMNS)
    body = "\n".join("<tr>" + "".join(f"<td>{_cell(r, c)}</td>" for c in TOP_COLUMNS) + "</tr>" for r in rows[:top])
    return f"<table class='points'><tr>{head}</tr>\n{body}</table>"


def glossary() -> str:
    """Every column of the top table, defined."""
    items = "".join(f"<dt>{html.escape(label)}</dt><dd>{html.escape(text)}</dd>" for label, text in TOP_COLUMNS.values())
    return f"<dl class='glossary'>{items}</dl>"


_STYLE = """
body{font:15px/1.45 system-ui,sans-serif;max-width:1180px;margin:24px auto;padding:0 16px;color:#222}
h1{font-size:24px;margin-bottom:4px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
.verdict{background:#f4f7fb;border-left:5px solid #3b6ea5;padding:10px 16px;margin:12px 0}
.verdict .answer{font-size:17px;font-weight:600;margin:0 0 6px} .verdict p{margin:4px 0}
pre{background:#f6f6f6;padding:10px;overflow-x:auto;font-size:13px;white-space:pre-wrap;word-break:break-word}
table.points{border-collapse:collapse;font-size:13px;width:100%}
table.points td,table.points th{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap}
table.points th{background:#eee;cursor:help} table.points td:nth-child(2),table.points td:nth-child(4){text-align:left}
dl.glossary{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;font-size:13px}
dl.glossary dt{font-weight:600} dl.glossary dd{margin:0}
img{max-width:100%;height:auto;display:block;margin:8px 0}
"""


def write_report(path: str | os.PathLike, *, title: str, verdict: str, reason: str | None, costs: str,
                 snippet: str, rows: list[dict], top: int, n_points: int, plots: dict, full_table: str,
                 notes=()) -> Path:
    """Write ``ranking.html`` (atomic): see the module docstring.

    Parameters
    ----------
    path : path
        The page to write.
    title : str
        Its heading.
    verdict : str
        The recommendation's one-line answer (:meth:`mdboost.ranking.recommend.Recommendation.verdict`).
    reason : str or None
        Why (:func:`mdboost.ranking.breakeven.reason_line`), None when unknown.
    costs : str
        Where the costs were measured and what the pick depends on.
    snippet : str
        The code (or command) that runs the recommendation.
    rows : list of dict
        The points at their best gamma, in rank order.
    top : int
        How many of them the table shows.
    n_points : int
        How many points the ranking has (the full table's).
    plots : dict
        Heading -> the image's path relative to the page, in the order shown (the first one right
        after the verdict).
    full_table : str
        The full table's path relative to the page.
    notes : sequence of str
        Further lines under the verdict (warnings).
    """
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be a positive int, got {top!r}")
    items = list(plots.items())
    first = items[:1]
    rest = items[1:]
    img = lambda heading, src: (f"<h2>{html.escape(heading)}</h2>"  # noqa: E731
                                f"<img src='{html.escape(src, quote=True)}' alt='{html.escape(heading, quote=True)}'>")
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<meta name='viewport' content='width=device-width'><title>{html.escape(title)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<div class='verdict'>",
        f"<p class='answer'>{html.escape(verdict)}</p>",
        *([f"<p><b>Why:</b> {html.escape(reason)}</p>"] if reason else []),
        f"<p>{html.escape(costs)}</p>",
        *(f"<p>{html.escape(n)}</p>" for n in notes),
        "</div>",
        "<h2>Run it</h2>",
        f"<pre>{html.escape(snippet)}</pre>",
        *(img(h, s) for h, s in first),
        f"<h2>Top {min(top, len(rows))} of {n_points} points</h2>",
        top_table(rows, top),
        f"<p><a href='{html.escape(full_table, quote=True)}'>Every point, every column</a> "
        "(definitions: docs/ranking.md, \"Metrics\").</p>",
        "<h2>Columns</h2>",
        glossary(),
        *(img(h, s) for h, s in rest),
        "</body></html>\n",
    ]
    return atomic_write_text(path, "\n".join(parts))
