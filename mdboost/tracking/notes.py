"""Markdown for MLflow run descriptions (the ``mlflow.note.content`` tag the UI renders).

:func:`ranking_note` is a ranking parent run's description: the recommendation (its verdict,
its point, the engine call), then the ranking's summary and its top points at their best
gamma. :func:`validation_note` is a validation parent run's: the verdict, then the cells,
predicted (with interval) against realized. :func:`markdown_table` renders any rows.

Pure functions over plain dicts (ranking rows, ``summary.json`` fields, validation records);
the pipelines set the tag. Definitions of the figures: ``docs/ranking.md`` and
``docs/validation.md``. No paper result lives here.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from mdboost.ranking.recommend import Recommendation, batch_lines, rule_label
from mdboost.tracking.runs import point_name

POINT_COLUMNS = (("rank", "rank"), ("point", "point"), ("target", "target"), ("speedup", "speedup [90%]"),
                 ("acceptance", "acceptance [90%]"), ("length", "mean accepted length [90%]"),
                 ("cost_ratio", "c"), ("nll_mentored", "NLL md"), ("quality_ok", "quality ok"))
"""The ranking note's table of points: (key of :func:`point_cells`, header)."""

CELL_COLUMNS = (("cell", "#"), ("point", "point"), ("speedup", "speedup pred [90%]"), ("speedup_real", "real"),
                ("acceptance", "acceptance pred [90%]"), ("acceptance_real", "real"),
                ("length", "length pred [90%]"), ("length_real", "real"))
"""The validation note's table of cells: (key of :func:`cell_cells`, header)."""


def _num(value, spec: str = ".3g") -> str:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return str(value)
    return format(x, spec) if math.isfinite(x) else "n/a"


def _interval(row: Mapping, key: str, spec: str) -> str:
    """``1.23 [1.10, 1.35]``; the point alone when the bounds are missing or not finite."""
    point = _num(row.get(key), spec)
    lo, hi = row.get(f"{key}_lo"), row.get(f"{key}_hi")
    try:
        bounded = math.isfinite(float(lo)) and math.isfinite(float(hi))
    except (TypeError, ValueError):
        bounded = False
    return f"{point} [{_num(lo, spec)}, {_num(hi, spec)}]" if bounded else point


def _cell(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = _num(value) if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[Mapping], columns: Sequence[tuple[str, str]]) -> str:
    """A GitHub-flavoured markdown table: one line per row, ``columns`` as (key, header).

    Floats print with 3 significant digits (non-finite as ``n/a``), booleans as yes/no, and
    ``|`` inside a value is escaped.

    Examples
    --------
    >>> print(markdown_table([{"a": 1.23456, "b": "x|y"}, {"a": float("nan"), "b": True}], [("a", "A"), ("b", "B")]))
    | A | B |
    |---|---|
    | 1.23 | x\\|y |
    | n/a | yes |
    """
    if not columns:
        raise ValueError("columns must name at least one (key, header) pair, got none")
    head = "| " + " | ".join(h for _, h in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_cell(r.get(k, "")) for k, _ in columns) + " |" for r in rows]
    return "\n".join([head, rule, *body])


def point_cells(row: Mapping) -> dict:
    """The cells of :data:`POINT_COLUMNS` for one ranking row (numbers or CSV strings)."""
    return {"rank": int(float(row["rank"])),
            "point": point_name(str(row["drafter"]), str(row["divergence"]), row["max_divergence"], row["gamma"],
                                row["temperature"]) + rule_label(row),
            "target": str(row["target"]), "speedup": _interval(row, "predicted_speedup", ".3f"),
            "acceptance": _interval(row, "engine_acceptance", ".3f"),
            "length": _interval(row, "engine_mean_accepted_length", ".2f"),
            "cost_ratio": _num(row.get("cost_ratio")), "nll_mentored": _num(row.get("nll_mentored"), ".4f"),
            "quality_ok": row.get("quality_ok") in (True, "True", "true", "1")}


def costed_verdict(rec: Recommendation, costs: str | None = None) -> str:
    """The recommendation's verdict, then (when given) the line naming where its costs were measured.

    >>> rec = Recommendation("int8", "t", 1.0, "kl", 0.1, 5, 1.43, 1.2, 1.6, True, True, 1.0, 1.01)
    >>> costed_verdict(rec, "costs measured on CPU X (avx2)")
    'recommended: int8 -> t, T=1, kl <= 0.1, gamma 5: predicted speedup 1.43x [1.20, 1.60] over plain decoding; costs measured on CPU X (avx2)'
    """
    return rec.verdict() if not costs else f"{rec.verdict()}; {costs}"


def ranking_note(rec: Recommendation, points: Sequence[Mapping], *, bootstrap: Mapping, snippet: str,
                 n_pairs: int, n_rows: int, nll_tolerance: float, top: int = 10,
                 cache: str | None = None, costs: str | None = None, by_batch: Mapping | None = None) -> str:
    """A ranking parent run's description: the recommendation, then the ranking's summary.

    Parameters
    ----------
    rec : Recommendation
        The ranking's answer (:func:`mdboost.ranking.recommend.recommend`).
    points : sequence of dict
        The operating points at their best gamma, in rank order (ranking rows).
    bootstrap : mapping
        ``summary.json``'s ``bootstrap``: ``prompts``, ``resamples``, ``level``.
    snippet : str
        Python that runs the recommendation (shown as a code block).
    n_pairs, n_rows : int
        Pairs ranked, and rows with every gamma (``ranking.csv``).
    nll_tolerance : float
        The ranking rule's quality tolerance (nats).
    top : int
        Points shown in the table (>= 1); the rest are in the table artifact.
    cache : str or None
        A line about the cache (folder, reused or built), shown when given.
    costs : str or None
        Where the costs were measured (``mdboost.cache.profile.costs_line``): the speedups hold
        on that hardware; appended to the verdict when given (:func:`costed_verdict`).
    by_batch : mapping or None
        ``{batch_size: Recommendation}`` when several batch sizes were ranked: a section with
        each one's verdict and the batch size from which plain decoding wins
        (:func:`mdboost.ranking.recommend.batch_lines`).

    Returns
    -------
    str
        Markdown; its first line is the recommendation's verdict with its costs'
        hardware (:func:`costed_verdict`) in bold.
    """
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be an integer >= 1, got {top!r}")
    level = float(bootstrap.get("level", math.nan))
    shown = list(points)[:top]
    lines = [
        f"**{costed_verdict(rec, costs)}**", "",
        markdown_table([{"drafter": rec.drafter, "target": rec.target, "T": f"{rec.temperature:g}",
                         "divergence": rec.divergence, "budget": f"{rec.max_divergence:g}", "gamma": rec.gamma,
                         "speedup": _num(rec.predicted_speedup, ".3f"),
                         "interval": f"[{rec.predicted_speedup_lo:.3f}, {rec.predicted_speedup_hi:.3f}]"}],
                       [("drafter", "drafter"), ("target", "target"), ("T", "T"), ("divergence", "divergence"),
                        ("budget", "budget"), ("gamma", "gamma"), ("speedup", "speedup"),
                        ("interval", f"{level:.0%} interval")]),
        "",
        f"Intervals: bootstrap over {bootstrap.get('prompts')} prompts, {bootstrap.get('resamples')} resamples "
        f"(level {level:g}). Quality: NLL {rec.nll_mentored:.4f} vs target {rec.nll_target:.4f} "
        f"({'within' if rec.quality_ok else 'outside'} the tolerance).", "",
        "```python", snippet, "```", "",
        "### Ranking", "",
        f"{n_pairs} pairs, {len(points)} operating points at their best gamma ({n_rows} rows with every gamma: "
        f"`ranking.csv`, table `ranking_table.json`). Rule: the largest predicted speedup among points with "
        f"NLL <= target + {nll_tolerance:g} nats. Nested runs: one per point, best first.", "",
    ]
    if by_batch and len(by_batch) > 1:
        lines += ["### Batch sizes", "", *[f"- {line}" for line in batch_lines(by_batch)], ""]
    if cache:
        lines += [cache, ""]
    lines.append(markdown_table([point_cells(r) for r in shown], POINT_COLUMNS))
    if len(points) > len(shown):
        lines += ["", f"Top {len(shown)} of {len(points)} points shown."]
    return "\n".join(lines)


def cell_cells(record: Mapping) -> dict:
    """The cells of :data:`CELL_COLUMNS` for one validation record (``summary.json`` ``cells``);
    a realized figure outside its predicted interval is marked ``*``."""
    mark = {True: "", False: " *", None: ""}
    batch = int(record.get("batch_size", 1))  # the cell's nested run has the same name
    out = {"cell": record["cell"],
           "point": point_name(record["drafter"], record["divergence"], record["max_divergence"], record["gamma"],
                               record["temperature"]) + (f" B{batch}" if batch > 1 else "")}
    for key, pred, real, spec in (("speedup", "predicted_speedup", "realized_speedup", ".2f"),
                                  ("acceptance", "predicted_acceptance", "realized_acceptance", ".3f"),
                                  ("length", "predicted_mean_accepted_length", "realized_mean_accepted_length", ".2f")):
        figure = "mean_accepted_length" if key == "length" else key
        out[key] = _interval(record, pred, spec)
        out[f"{key}_real"] = _num(record.get(real), spec) + mark[record.get(f"{figure}_inside")]
    return out


def validation_note(verdict: str, records: Sequence[Mapping], *, prompts: int, max_new_tokens: int,
                    ranking_run_id: str | None = None) -> str:
    """A validation parent run's description: the verdict, then the cells' table.

    Parameters
    ----------
    verdict : str
        :func:`mdboost.validation.report.verdict`'s line.
    records : sequence of dict
        The validated cells (:func:`mdboost.validation.report.cell_record`), cell 0 first.
    prompts, max_new_tokens : int
        Held-out prompts generated on, and tokens per generation.
    ranking_run_id : str or None
        The ranking's parent run, named when known.

    Returns
    -------
    str
        Markdown; its first line is the verdict in bold.
    """
    ranking = f" Ranking run: `{ranking_run_id}`." if ranking_run_id else ""
    return "\n".join([
        f"**{verdict}**", "",
        f"{len(records)} cells of the ranking, run on {prompts} held-out prompts of {max_new_tokens} new tokens "
        f"each; cell 0 is the recommendation; * = realized outside the predicted interval.{ranking}", "",
        markdown_table([cell_cells(r) for r in records], CELL_COLUMNS),
    ])
