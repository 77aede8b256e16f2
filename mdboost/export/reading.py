"""Reading a ranking back: an output folder of ``mdboost rank`` or its MLflow parent run, checked
field by field (:func:`load_ranking`)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from mdboost._io import read_json_object, read_yaml_mapping
from mdboost.models.home import mdboost_home
from mdboost.ranking.report import at_batch_size, batch_sizes_of, check_csv_digest, read_csv
from mdboost.ranking.summary_check import REQUIRED, check_recommendation, check_recommendations_in_rows, check_summary
from mdboost.tracking.store import check_tracking_uri, existing_run

_RUN_ID = re.compile(r"[0-9a-f]{32}")


def _bool_param(text: str) -> bool:
    """``"True"`` / ``"False"`` (how MLflow params hold a bool), else ValueError."""
    if text not in ("True", "False"):
        raise ValueError(text)
    return text == "True"

_RECOMMENDATION_TYPES = {"temperature": float, "max_divergence": float, "gamma": int, "predicted_speedup": float,
                         "predicted_speedup_lo": float, "predicted_speedup_hi": float, "nll_target": float,
                         "nll_mentored": float, "beats_plain_decoding": _bool_param, "quality_ok": _bool_param,
                         "draft_p_min": float, "threshold_acc": float, "threshold_single": float}


def load_ranking(source: str | os.PathLike, *, tracking_uri: str | None = None) -> dict:
    """The recommendation, sampling settings, rows, device and mdboost home of a ranking.

    Parameters
    ----------
    source : str or os.PathLike
        An output folder of ``mdboost rank`` (``summary.json`` and ``ranking.csv``), or the
        32-hex-digit id of its MLflow parent run (artifacts ``ranking.csv``, and
        ``summary.json`` or the run's ``recommendation.*`` parameters).
    tracking_uri : str or None
        The MLflow store of a run id (``None``: MLflow's own default resolution).

    Returns
    -------
    dict with ``recommendation``, ``sampling`` (``top_k``, ``top_p``), ``rows``, ``device``,
    ``home`` (the folder of the ranking's converted models and tuned translators when its config
    named one, ``pool.home``; None: the default home of whoever runs the snippets), ``source``
    and ``speed_engine`` (whose steps its costs timed, the config's ``speed.engine``: ``mdboost``
    or ``llamacpp``).
    """
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str):
        raise TypeError(f"source must be a ranking folder (str or os.PathLike) or an MLflow run id (str), "
                        f"got {type(source).__name__} {source!r}")
    if not source:
        raise ValueError(f"ranking must be a ranking folder or an MLflow run id, got {source!r}")
    folder = Path(source)
    if folder.is_dir():
        summary = read_json_object(folder / "summary.json")
        if summary is None or "recommendation" not in summary:
            raise ValueError(f"ranking folder {source!r} has no summary.json with a recommendation: "
                             f"run `mdboost rank --config ...` first")
        return _from_summary(summary, folder, source)
    if _RUN_ID.fullmatch(source):
        return _from_run(source, tracking_uri)
    raise ValueError(f"ranking must be a ranking folder or an MLflow run id (32 hex digits), got {source!r}: "
                     "no such folder")


def _from_summary(summary: dict, folder: Path, source: str) -> dict:
    """The ranking of ``folder`` as its ``summary.json`` describes it, checked field by field
    (:func:`mdboost.ranking.summary_check.check_summary`) and its recommendations found in ``ranking.csv``."""
    where = f"ranking {source!r}"
    summary = check_summary(summary, where)
    out = _ranking(summary["recommendation"], summary.get("sampling") or {}, folder, source,
                   summary.get("ranking_csv_sha256"), summary.get("device"), summary.get("home"),
                   summary.get("recommendations"))
    check_recommendations_in_rows(summary, out["batch_rows"], where)
    return out


def _param_value(key: str, value: str, run_id: str):
    """A ``recommendation.*`` parameter of an MLflow run as its type (ValueError naming it)."""
    if value == "None" and key in ("threshold_acc", "threshold_single"):
        return None
    try:
        return _RECOMMENDATION_TYPES.get(key, str)(value)
    except ValueError:
        kind = "True or False" if _RECOMMENDATION_TYPES[key] is _bool_param else _RECOMMENDATION_TYPES[key].__name__
        raise ValueError(f"MLflow run {run_id!r}: parameter recommendation.{key} must be {kind}, got {value!r}") from None


# what export_plan reads of the recommendation, and of every ranking row (nearest_lossless)
_REC_KEYS = REQUIRED
_ROW_KEYS = ("drafter", "target", "temperature", "max_divergence", "gamma", "rank", "predicted_speedup",
             "predicted_speedup_lo", "predicted_speedup_hi")


def _checked(rec, rows: list[dict], source: str) -> None:
    if not isinstance(rec, dict):
        raise ValueError(f"ranking {source!r}: the recommendation must be a mapping, got {type(rec).__name__}")
    missing = [k for k in _REC_KEYS if k not in rec]
    if missing:
        raise ValueError(f"ranking {source!r}: the recommendation lacks {', '.join(missing)}")
    absent = [k for k in _ROW_KEYS if rows and k not in rows[0]]
    if absent:
        raise ValueError(f"ranking {source!r}: ranking.csv lacks the columns {', '.join(absent)}")


def _ranking(rec: dict, sampling: dict, folder: Path, source: str, csv_sha256: str | None = None,
             device: str | None = None, home: str | None = None, recommendations: dict | None = None) -> dict:
    """The ranking of ``folder``; ``csv_sha256``: the digest of ``ranking.csv`` its summary
    records (rankings from before it recorded one: None, not checked); ``device``: the one the
    ranking ran on, as its summary records it (older rankings: the config's ``pool.device``, else CPU);
    ``home``: the absolute mdboost home its summary records (older rankings: the config's
    ``pool.home``, resolved here; None where the config named none); ``recommendations``: its
    summary's best point per engine (rankings from before rules were ranked: None)."""
    csv = folder / "ranking.csv"
    if not csv.is_file():
        raise ValueError(f"ranking {source!r} has no ranking.csv")
    check_csv_digest(csv, csv_sha256, f"ranking {source!r}")
    every = read_csv(csv)
    rows = at_batch_size(every, batch_sizes_of(every)[0]) if every else every  # the headline batch size's
    _checked(rec, rows, source)
    config, configured, speed_engine = folder / "config.resolved.yaml", None, "mdboost"
    if config.is_file():
        resolved = read_yaml_mapping(config)
        pool, speed = resolved.get("pool"), resolved.get("speed")
        for name, section in (("pool", pool), ("speed", speed)):
            if section is not None and not isinstance(section, dict):
                raise ValueError(f"{config}: {name} must be a mapping, got {section!r}")
        configured = (pool or {}).get("device")
        speed_engine = (speed or {}).get("engine") or "mdboost"
        if home is None and (pool or {}).get("home") is not None:
            home = str(mdboost_home(pool["home"]))
    device = str(device) if device is not None else configured or "cpu"
    if not isinstance(sampling, dict):
        raise ValueError(f"ranking {source!r}: sampling must be a mapping, got {sampling!r}")
    return {"recommendation": dict(rec), "sampling": {"top_k": sampling.get("top_k"), "top_p": sampling.get("top_p")},
            "rows": rows, "device": device, "home": None if home is None else str(home), "source": source,
            "recommendations": recommendations, "batch_rows": every, "speed_engine": speed_engine}


def _from_run(run_id: str, tracking_uri: str | None) -> dict:
    import mlflow  # deferred: mlflow: seconds to import; only an MLflow run's ranking needs it
    from mlflow.exceptions import MlflowException

    uri = mlflow.get_tracking_uri() if tracking_uri is None else check_tracking_uri(tracking_uri)
    run = existing_run(run_id, uri)
    client = mlflow.MlflowClient(uri)
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("ranking.csv", "config.resolved.yaml", "summary.json"):
            try:
                client.download_artifacts(run_id, name, tmp)
            except (MlflowException, OSError):
                pass  # optional files; ranking.csv is checked by _ranking
        summary = read_json_object(Path(tmp) / "summary.json")
        if summary is not None and "recommendation" in summary:
            return _from_summary(summary, Path(tmp), run_id)
        params = run.data.params
        rec = {k[len("recommendation."):]: v for k, v in params.items() if k.startswith("recommendation.")}
        if "drafter" not in rec:
            raise ValueError(f"MLflow run {run_id!r} is not a ranking run (no recommendation.* parameters)")
        rec = {k: _param_value(k, v, run_id) for k, v in rec.items()}
        check_recommendation(rec, f"MLflow run {run_id!r}")
        sampling = {k: None if params.get(f"md.{k}") in (None, "None") else float(params[f"md.{k}"])
                    for k in ("top_k", "top_p")}
        if sampling["top_k"] is not None:
            sampling["top_k"] = int(sampling["top_k"])
        return _ranking(rec, sampling, Path(tmp), run_id)
