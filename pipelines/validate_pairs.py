"""``mdboost validate --config X``: real AR / SD / MD runs on the top pairs of a ranking.

Steps: read ``ranking.csv`` and ``config.resolved.yaml`` (from a folder, or downloaded from the
ranking's MLflow parent run); rebuild the pool; take the top-N operating points; generate on
HELD-OUT prompts (``mdboost.data`` split ``heldout``, never cached or ranked on) in AR, SD and MD
modes at each point's ``best_gamma`` and budget; compare predicted and realized acceptance and
speedup (:mod:`mdboost.validation.prediction`, scatter plot); optionally HumanEval pass@1 of AR
vs MD outputs; log a parent run and one nested run per operating point, tagged
``mdboost.ranking_run_id`` (the matching nested ranking run) and with the same params.
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

import torch

from mdboost.ranking.report import read_csv
from mdboost.validation.points import (
    heldout_prompts,
    humaneval_pass_at_1,
    point_key,
    points_quality,
    select_points,
    validate_point,
)
from pipelines.config import RankConfig, SourceConfig, TrackingConfig, ValidateConfig, load_yaml, to_dict


def fetch_ranking(src: SourceConfig, tracking: TrackingConfig, tmp: Path) -> tuple[list[dict], RankConfig, str | None]:
    """``(rows, rank config, ranking parent run id)`` from a folder or an MLflow run."""
    folder, run_id = (Path(src.ranking_dir) if src.ranking_dir else None), src.ranking_run_id
    if run_id is not None:
        import mlflow

        mlflow.set_tracking_uri(tracking.tracking_uri)
        folder = tmp / "ranking"
        for name in ("ranking.csv", "config.resolved.yaml"):
            mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=name, dst_path=str(folder))
    for name in ("ranking.csv", "config.resolved.yaml"):
        if not (folder / name).is_file():
            raise ValueError(f"ranking_dir must hold {name}, not found in {str(folder)!r}")
    rows = sorted(read_csv(folder / "ranking.csv"), key=lambda r: int(r["rank"]))
    return rows, load_yaml(folder / "config.resolved.yaml", RankConfig), run_id


def ranking_children(parent_run_id: str | None, tracking: TrackingConfig) -> dict[tuple, str]:
    """Nested ranking runs keyed by (drafter, target, divergence, max_divergence)."""
    if parent_run_id is None:
        return {}
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking.tracking_uri)
    parent = client.get_run(parent_run_id)
    runs = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'",
                              max_results=5000)
    return {point_key(r.data.params): r.info.run_id for r in runs}


def run(cfg: ValidateConfig) -> dict:
    """Run the validation; returns a summary with per-point metrics and quality metrics."""
    from mdboost.models.pool import build_pool
    from mdboost.validation.plots import plot_predicted_vs_realized

    with tempfile.TemporaryDirectory() as tmp:
        rows, rank_cfg, rank_run = fetch_ranking(cfg.ranking, cfg.tracking, Path(tmp))
    rows = select_points(rows, cfg.ranking.top, cfg.ranking.per_pair)
    pc, text, g = rank_cfg.pool, rank_cfg.data.text_source(), cfg.generation
    names = sorted({n for r in rows for n in (r["drafter"], r["target"])} - {pc.target})
    pool = build_pool(pc.target, names, device=pc.device, home=pc.home)
    _, prompts = heldout_prompts(text, pool.target.tokenizer, g.prompts)
    md_solve = g.md_solve or rank_cfg.speed.md_solve
    points = [(row, validate_point(row, pool, prompts, max_new_tokens=g.max_new_tokens, temperature=g.temperature,
                                   seed=g.seed, md_solve=md_solve)) for row in rows]
    quality = points_quality(points, cfg.tolerance)
    out = Path(cfg.output_dir)
    labels = [f"{r['drafter']}->{r['target']} {r['divergence']}@{float(r['max_divergence']):g}" for r, _ in points]
    scatter = plot_predicted_vs_realized(labels, [m["predicted_acceptance"] for _, m in points],
                                         [m["realized_acceptance"] for _, m in points],
                                         [m["predicted_speedup"] for _, m in points],
                                         [m["realized_speedup"] for _, m in points], out / "predicted_vs_realized.png",
                                         tolerance=cfg.tolerance)
    summary = {"points": points, "quality": quality, "scatter": scatter, "labels": labels,
               "ranking_run_id": rank_run, "md_solve": md_solve}
    if cfg.humaneval.tasks > 0 and rank_cfg.data.source == "humaneval":
        h = cfg.humaneval
        summary["quality"].update(humaneval_pass_at_1(
            rows[0], pool, text, tasks=h.tasks, max_new_tokens=h.max_new_tokens, temperature=g.temperature,
            seed=g.seed, timeout=h.timeout, md_solve=md_solve))
    if cfg.tracking.enabled:
        summary["run_id"] = log_mlflow(cfg, summary, ranking_children(rank_run, cfg.tracking))
    return summary


def log_mlflow(cfg: ValidateConfig, summary: dict, children: dict[tuple, str]) -> str:
    """A parent run (config, quality metrics, scatter) and one nested run per operating point."""
    import mlflow

    from mdboost.tracking import setup

    setup(cfg.tracking.experiment, cfg.tracking.tracking_uri, cfg.tracking.artifact_root)
    finite = lambda d: {k: float(v) for k, v in d.items() if math.isfinite(float(v))}  # noqa: E731
    with mlflow.start_run(run_name=f"validate:{cfg.name}") as parent:
        mlflow.set_tags({"mdboost.pipeline": "validate_pairs",
                         "mdboost.ranking_run_id": summary["ranking_run_id"] or "",
                         "mlflow.experimentKind": "custom_model_development"})
        mlflow.log_params({"top": cfg.ranking.top, "prompts": cfg.generation.prompts,
                           "max_new_tokens": cfg.generation.max_new_tokens, "md_solve": summary["md_solve"],
                           "temperature": cfg.generation.temperature, "tolerance": cfg.tolerance})
        mlflow.log_metrics(finite(summary["quality"]))
        mlflow.log_artifact(str(summary["scatter"]))
        mlflow.log_dict(to_dict(cfg), "config.resolved.json")
        for label, (row, metrics) in zip(summary["labels"], summary["points"]):
            params = {k: row[k] for k in ("drafter", "target", "divergence", "max_divergence", "best_gamma")}
            with mlflow.start_run(run_name=label, nested=True):
                mlflow.log_params(params)
                mlflow.set_tag("mdboost.ranking_run_id", children.get(point_key(row), ""))
                mlflow.log_metrics(finite(metrics))
        return parent.info.run_id


def main(config: str) -> int:
    """CLI entry point: ``mdboost validate --config <yaml>``; returns the exit status."""
    try:
        cfg = load_yaml(config, ValidateConfig)
    except ValueError as err:
        print(f"mdboost validate: {err}", file=sys.stderr)
        return 2
    torch.manual_seed(cfg.generation.seed)
    summary = run(cfg)
    for label, (_, m) in zip(summary["labels"], summary["points"]):
        print(f"{label:40s} acc pred {m['predicted_acceptance']:.3f} (iid {m['predicted_acceptance_iid']:.3f}) "
              f"real {m['realized_acceptance']:.3f} "
              f"expected {m['expected_acceptance']:.3f}  speedup pred {m['predicted_speedup']:.2f} "
              f"real {m['realized_speedup']:.2f} model@real-acc {m['model_speedup_at_realized_acceptance']:.2f}")
    print({k: round(v, 4) for k, v in summary["quality"].items()})
    if "run_id" in summary:
        print(f"mlflow run: {summary['run_id']}")
    return 0

