"""Ranking outputs: ``ranking.csv`` (atomic), an HTML table and a terminal table of top pairs.

``COLUMNS`` lists the CSV columns in order: the core ranking columns first, then the extra
diagnostics (definitions of all of them: ``docs/ranking.md``). Columns present in the rows but
not listed are appended in sorted order so nothing computed is dropped.
"""

from __future__ import annotations

import csv
import hashlib
import html
import io
import math
import os
from pathlib import Path

from mdboost._io import atomic_write_bytes, atomic_write_text

ALONE = "alone"  # the rule column of the drafter decoding alone (``docs/ranking.md``, "The drafter alone")

COLUMNS = [
    "batch_size", "rank", "drafter", "target", "temperature", "divergence", "max_divergence", "rule", "drafting", "draft_p_min", "engines",
    "threshold_acc", "threshold_single", "gamma", "best_gamma", "is_best_gamma",
    "predicted_speedup", "predicted_speedup_lo", "predicted_speedup_hi",
    "predicted_speedup_prompts_lo", "predicted_speedup_prompts_hi",
    "engine_acceptance", "engine_acceptance_lo", "engine_acceptance_hi",
    "engine_mean_accepted_length", "engine_mean_accepted_length_lo", "engine_mean_accepted_length_hi",
    "engine_tokens_per_call", "engine_tokens_per_call_lo", "engine_tokens_per_call_hi",
    "sd_acceptance", "md_acceptance", "acceptance_gain", "cost_ratio", "md_solve",
    "mu_target", "mu_drafter", "boosting_advantage", "eps_pq_median", "rho_pq_median", "k_median",
    "nll_target", "nll_drafter", "nll_mentored", "nll_boosted", "beats_target", "quality_ok",
    "md_acceptance_q10", "md_acceptance_median", "md_acceptance_q90", "achieved_divergence",
    "achieved_divergence_mean", "achieved_divergence_max", "drafter_share",
    "sd_best_gamma", "sd_speedup", "engine_acceptance_conditional", "sd_engine_acceptance", "best_gamma_iid", "predicted_speedup_iid", "sd_best_gamma_iid",
    "sd_speedup_iid", "verify_cost", "md_overhead", "prefill_target", "prefill_drafter", "proposal_rate", "tail_mass", "n_positions", "acceptance_source",
    "acceptance_positions",
    "c_target", "c_drafter", "nll_boosted_rescaled", "boosted_scale", "margin_median", "eps_pq_q10", "eps_pq_q90", "rho_pq_q10", "rho_pq_q90", "k_q90",
]

TABLE_COLUMNS = [
    ("batch_size", "B"), ("rank", "rank"), ("drafter", "drafter"), ("target", "target"), ("temperature", "T"), ("divergence", "f"),
    ("max_divergence", "D"), ("rule", "rule"), ("drafting", "drafts"), ("draft_p_min", "p_min"),
    ("sd_acceptance", "SD acc"), ("md_acceptance", "MD acc"), ("engine_acceptance", "eng acc"),
    ("cost_ratio", "c"), ("gamma", "gamma"), ("predicted_speedup", "speedup"), ("predicted_speedup_lo", "lo"),
    ("predicted_speedup_hi", "hi"),
    ("boosting_advantage", "A"), ("k_median", "k"), ("nll_target", "NLL q"),
    ("nll_mentored", "NLL md"), ("quality_ok", "ok"),
]


def columns_of(rows: list[dict]) -> list[str]:
    """``COLUMNS`` present in the rows, then any other keys, sorted."""
    keys = set().union(*(r.keys() for r in rows)) if rows else set()
    return [c for c in COLUMNS if c in keys] + sorted(keys - set(COLUMNS))


def csv_bytes(rows: list[dict]) -> bytes:
    """The ranking rows as CSV, UTF-8: the bytes :func:`write_csv` writes (and a summary's digest is taken of)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns_of(rows), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode("utf-8")


def write_csv(rows: list[dict], path: str | os.PathLike) -> Path:
    """Write the ranking rows as CSV (atomically); returns the path."""
    return atomic_write_bytes(path, csv_bytes(rows))


def csv_float(value, default: float = math.nan) -> float:
    """A ranking value as a float: CSV rows read back hold strings; ``default`` when it is
    missing or not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def csv_bool(value) -> bool:
    """A ranking flag: ``True`` or its CSV spellings ``"True"`` / ``"true"`` / ``"1"`` / ``"yes"``."""
    return value is True or str(value).strip().lower() in ("true", "1", "yes")


def read_csv(path: str | os.PathLike) -> list[dict]:
    """Rows of a ranking CSV as dicts of strings."""
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def csv_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a ranking CSV's bytes on disk, checked against ``summary.json``'s
    ``ranking_csv_sha256`` (which the run took of the bytes it wrote, :func:`csv_bytes`)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def check_csv_digest(path: str | os.PathLike, digest: str | None, source: str) -> None:
    """Raise ValueError naming ``source`` when the CSV at ``path`` is not the one a summary's
    ``digest`` was written with (an interrupted rerun); None (rankings from before it was recorded): no check."""
    if digest is not None and csv_sha256(path) != digest:
        raise ValueError(f"{source}: ranking.csv is not the one its summary.json was written with "
                         f"(an interrupted rerun?): run `mdboost rank` again")


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.3e}"
    return str(value)


def _html_table(rows: list[dict]) -> str:
    cols = columns_of(rows)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "\n".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c, '')))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>\n{body}</table>"


def write_html(rows: list[dict], path: str | os.PathLike, title: str = "mdboost pool ranking",
               sections=()) -> Path:
    """A standalone HTML table of all rows, then one table per ``(heading, rows)`` of ``sections`` (atomic)."""
    extra = "".join(f"<h2>{html.escape(heading)}</h2>{_html_table(part)}" for heading, part in sections)
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>table{border-collapse:collapse;font:12px sans-serif}td,th{border:1px solid #ccc;"
        "padding:2px 6px;text-align:right}th{background:#eee;position:sticky;top:0}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{_html_table(rows)}{extra}</body></html>\n"
    )
    return atomic_write_text(path, page)


def format_table(rows: list[dict], top: int = 10) -> str:
    """A fixed-width text table of the first ``top`` rows (already sorted by rank)."""
    shown = rows[:top]
    header = [label for _, label in TABLE_COLUMNS]
    cells = [[_fmt(r.get(key, "")) for key, _ in TABLE_COLUMNS] for r in shown]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def row_draft_p_min(row: dict) -> float:
    """A ``ranking.csv`` row's draft floor (0 where the column is missing or empty: no floor).

    >>> row_draft_p_min({"draft_p_min": "0.5"}), row_draft_p_min({})
    (0.5, 0.0)
    """
    value = csv_float(row.get("draft_p_min"), 0.0)
    return 0.0 if math.isnan(value) else value


def row_batch_size(row: dict) -> int:
    """A ``ranking.csv`` row's batch size (1 where the column is missing: a ranking before batch
    sizes were ranked)."""
    value = row.get("batch_size")
    return 1 if value in (None, "") else int(float(value))


def at_batch_size(rows: list[dict], batch_size: int) -> list[dict]:
    """The rows predicted for ``batch_size`` sequences per engine batch, in their order."""
    return [r for r in rows if row_batch_size(r) == batch_size]


def batch_sizes_of(rows: list[dict]) -> list[int]:
    """The batch sizes of ``rows``, ascending."""
    return sorted({row_batch_size(r) for r in rows})
