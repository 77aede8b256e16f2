"""A ranking's ``summary.json`` read back: its fields checked by type, its recommendations found
in ``ranking.csv``.

Every reader of a ranking's summary (``mdboost export``, ``mdboost validate``) goes through
:func:`check_summary`, then :func:`check_recommendations_in_rows` once ``ranking.csv`` has
matched the summary's digest (:func:`mdboost.ranking.report.check_csv_digest`). A field of the
wrong type (``"beats_plain_decoding": "false"``, ``"gamma": "four"``, ``"max_divergence":
"nan"``) is a ``ValueError`` naming the file, the field and the value: read unchecked, the
string ``"false"`` is truthy and a snippet would carry a drafter it should not.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from mdboost.ranking.report import ALONE, at_batch_size, batch_sizes_of, csv_float

_HEX64 = re.compile(r"[0-9a-f]{64}")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite_at_least(low: float):
    def check(value) -> bool:
        return _number(value) and math.isfinite(value) and value >= low
    return check


def _optional(check):
    return lambda value: value is None or check(value)


def _text(value) -> bool:
    return isinstance(value, str) and bool(value)


def _gamma(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# recommendation field -> (check, what it must be); the fields of mdboost.ranking.recommend.Recommendation
RECOMMENDATION_FIELDS = {
    "drafter": (_text, "a non-empty string"),
    "target": (_text, "a non-empty string"),
    "temperature": (_finite_at_least(0.0), "a finite number >= 0"),
    "divergence": (_text, "a non-empty string"),
    "max_divergence": (_finite_at_least(0.0), "a finite number >= 0"),
    "gamma": (_gamma, "an integer >= 1 (0: the drafter alone)"),
    "predicted_speedup": (_finite_at_least(0.0), "a finite number >= 0"),
    "predicted_speedup_lo": (_number, "a number"),
    "predicted_speedup_hi": (_number, "a number"),
    "beats_plain_decoding": (lambda v: isinstance(v, bool), "true or false"),
    "quality_ok": (lambda v: isinstance(v, bool), "true or false"),
    "nll_target": (_number, "a number"),
    "nll_mentored": (_number, "a number"),
    "rule": (_text, "a non-empty string"),
    "drafting": (_text, "a non-empty string"),
    "threshold_acc": (_optional(_number), "a number or null"),
    "threshold_single": (_optional(_number), "a number or null"),
    "draft_p_min": (_finite_at_least(0.0), "a finite number >= 0"),
    "drafter_share": (_optional(lambda v: _number(v) and 0 <= v <= 1), "a number in [0, 1] or null"),
}
REQUIRED = ("drafter", "target", "temperature", "divergence", "max_divergence", "gamma", "beats_plain_decoding")


def _bad(where: str, field: str, value, what: str) -> ValueError:
    return ValueError(f"{where}: summary.json's {field} must be {what}, got {value!r}")


def check_recommendation(rec, where: str, field: str = "recommendation") -> dict:
    """``rec`` (a summary's recommendation) if every field it has is of its type
    (:data:`RECOMMENDATION_FIELDS`) and the :data:`REQUIRED` ones are there; else a ValueError
    naming ``where``, the field and the value.

    >>> check_recommendation({"drafter": "int8", "target": "t", "temperature": 1.0, "divergence": "kl",
    ...     "max_divergence": 0.1, "gamma": "four", "beats_plain_decoding": True}, "ranking 'out'")
    Traceback (most recent call last):
    ...
    ValueError: ranking 'out': summary.json's recommendation.gamma must be an integer >= 1 (0: the drafter alone), got 'four'
    """
    if not isinstance(rec, Mapping):
        raise _bad(where, field, rec, "a mapping")
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        raise ValueError(f"{where}: summary.json's {field} lacks {', '.join(missing)}")
    for key, (check, what) in RECOMMENDATION_FIELDS.items():
        if key in rec and not check(rec[key]):
            raise _bad(where, f"{field}.{key}", rec[key], what)
    if (rec["gamma"] == 0) != (rec.get("rule") == ALONE):
        raise _bad(where, f"{field}.gamma", rec["gamma"], f"0 exactly for the rule {ALONE!r} (got rule {rec.get('rule')!r})")
    return dict(rec)


def _check_sampling(sampling, where: str) -> None:
    if sampling is None:
        return
    if not isinstance(sampling, Mapping):
        raise _bad(where, "sampling", sampling, "a mapping")
    top_k, top_p = sampling.get("top_k"), sampling.get("top_p")
    if not (top_k is None or (isinstance(top_k, int) and not isinstance(top_k, bool) and top_k >= 1)):
        raise _bad(where, "sampling.top_k", top_k, "an integer >= 1 or null")
    if not (top_p is None or (_number(top_p) and 0 < top_p <= 1)):
        raise _bad(where, "sampling.top_p", top_p, "a number in (0, 1] or null")
    temps = sampling.get("temperatures")
    if temps is not None and not (isinstance(temps, list) and temps and all(_finite_at_least(0.0)(t) for t in temps)):
        raise _bad(where, "sampling.temperatures", temps, "a non-empty list of finite numbers >= 0")


def _check_engines(recommendations, where: str) -> None:
    if recommendations is None:
        return
    if not isinstance(recommendations, Mapping):
        raise _bad(where, "recommendations", recommendations, "a mapping of engines")
    for engine, entry in recommendations.items():
        if not isinstance(entry, Mapping) or "recommendation" not in entry:
            raise _bad(where, f"recommendations.{engine}", entry, "a mapping with a recommendation")
        if entry["recommendation"] is not None:
            check_recommendation(entry["recommendation"], where, f"recommendations.{engine}.recommendation")


def _check_by_batch(by_batch, where: str) -> None:
    if by_batch is None:
        return
    if not isinstance(by_batch, Mapping):
        raise _bad(where, "recommendations_by_batch_size", by_batch, "a mapping of batch sizes")
    for size, rec in by_batch.items():
        if not (isinstance(size, str) and size.isdigit() and int(size) >= 1):
            raise _bad(where, "recommendations_by_batch_size", size, "keyed by batch sizes ('1', '4', ...)")
        check_recommendation(rec, where, f"recommendations_by_batch_size.{size}")


def check_summary(summary, where: str, *, recommendation: bool = True) -> dict:
    """``summary`` (a ranking's ``summary.json``) with every field a reader uses checked by type:
    the recommendation (:func:`check_recommendation`), the per-engine and per-batch-size ones,
    ``batch_sizes``, ``ranking_csv_sha256`` (64 lowercase hex digits), ``sampling``, ``device``, ``home``,
    ``run_id``, ``md_solve`` and ``bootstrap``. A field a ranking of an older version did not
    write may be absent (the recommendation too with ``recommendation=False``: validation picks
    its cells without one); one that is there and of the wrong type is a ValueError naming
    ``where``, the field and the value.

    >>> check_summary({"recommendation": {"drafter": "int8", "target": "t", "temperature": 1.0,
    ...     "divergence": "kl", "max_divergence": "nan", "gamma": 4, "beats_plain_decoding": True}}, "x")
    Traceback (most recent call last):
    ...
    ValueError: x: summary.json's recommendation.max_divergence must be a finite number >= 0, got 'nan'
    """
    if not isinstance(summary, Mapping):
        raise _bad(where, "top level", summary, "a JSON object")
    if recommendation and "recommendation" not in summary:
        raise ValueError(f"{where}: summary.json has no recommendation: run `mdboost rank --config ...` first")
    if "recommendation" in summary:
        check_recommendation(summary["recommendation"], where)
    digest = summary.get("ranking_csv_sha256")
    if digest is not None and not (isinstance(digest, str) and _HEX64.fullmatch(digest)):
        raise _bad(where, "ranking_csv_sha256", digest, "a SHA-256 (64 hex digits)")
    for key in ("device", "home", "run_id", "md_solve"):
        if summary.get(key) is not None and not _text(summary[key]):
            raise _bad(where, key, summary[key], "a non-empty string or null")
    sizes = summary.get("batch_sizes")
    if sizes is not None and not (isinstance(sizes, list) and sizes and all(_gamma(b) for b in sizes)):
        raise _bad(where, "batch_sizes", sizes, "a non-empty list of integers >= 1")
    _check_sampling(summary.get("sampling"), where)
    _check_engines(summary.get("recommendations"), where)
    _check_by_batch(summary.get("recommendations_by_batch_size"), where)
    boot = summary.get("bootstrap")
    if boot is not None and not isinstance(boot, Mapping):
        raise _bad(where, "bootstrap", boot, "a mapping")
    if boot and boot.get("prompts") is not None and not _gamma(boot["prompts"]):
        raise _bad(where, "bootstrap.prompts", boot["prompts"], "an integer >= 1")
    return dict(summary)


_TEXT_KEYS = ("drafter", "target", "divergence")
_NUMBER_KEYS = ("temperature", "max_divergence", "gamma")


def _same_number(a: float, b: float) -> bool:
    """Equal to float32 precision (rows may hold float32 values, whose CSV spelling is float32's
    shortest one), or both NaN."""
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def _is_row(rec: Mapping, row: Mapping) -> bool:
    return (all(str(row.get(k)) == str(rec[k]) for k in _TEXT_KEYS)
            and str(row.get("rule", "mentored")) == str(rec.get("rule", "mentored"))
            and str(row.get("drafting", "sampled")) == str(rec.get("drafting", "sampled"))
            and all(_same_number(csv_float(row.get(k)), float(rec[k])) for k in _NUMBER_KEYS)
            and ("predicted_speedup" not in rec
                 or _same_number(csv_float(row.get("predicted_speedup")), float(rec["predicted_speedup"]))))


def find_row(rec: Mapping, rows: list[dict]) -> dict | None:
    """The row of ``rows`` that is the recommendation ``rec`` (its point and predicted speedup,
    as :func:`check_in_rows` matches them), or None."""
    return next((row for row in rows if _is_row(rec, row)), None)


def check_in_rows(rec: Mapping, rows: list[dict], where: str, field: str = "recommendation") -> None:
    """ValueError naming ``where`` unless the recommendation ``rec`` is one of ``rows`` (its point:
    drafter, target, temperature, divergence, budget, gamma, rule and drafting; and its predicted
    speedup): a summary whose recommendation is not in its table was not written with it."""
    if find_row(rec, rows) is None:
        speedup = rec.get("predicted_speedup")
        raise ValueError(
            f"{where}: summary.json's {field} ({rec['drafter']} -> {rec['target']}, T={rec['temperature']}, "
            f"{rec['divergence']} {rec['max_divergence']}, gamma {rec['gamma']}"
            + ("" if speedup is None else f", predicted speedup {speedup}")
            + ") is not a row of its ranking.csv: the two come from different runs; run `mdboost rank` again")


def check_recommendations_in_rows(summary: Mapping, rows: list[dict], where: str) -> None:
    """The recommendations of ``summary`` (checked by :func:`check_summary`) are rows of ``rows``
    (``ranking.csv``'s, every batch size): the headline one among the rows of the summary's first
    ``batch_sizes`` (else the smallest batch size), each batch size's among its own. (The
    per-engine ones are checked by type only: each is the best row an engine runs, kept in the
    summary for the engine's section of ``mdboost export``.)"""
    if not rows:
        return
    sizes = batch_sizes_of(rows)
    if "recommendation" in summary:
        check_in_rows(summary["recommendation"], at_batch_size(rows, (summary.get("batch_sizes") or sizes)[0]), where)
    for size, rec in (summary.get("recommendations_by_batch_size") or {}).items():
        if int(size) in sizes:
            check_in_rows(rec, at_batch_size(rows, int(size)), where, f"recommendations_by_batch_size.{size}")
