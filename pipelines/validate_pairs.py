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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from mdboost.config import RankConfig, TrackingConfig, load_yaml, to_dict
from mdboost.ranking.report import read_csv


@dataclass
class SourceConfig:
    """Which ranking: a folder holding ``ranking.csv`` or an MLflow parent run id; top-N rows.

    ``per_pair``: take each pair's best-ranked operating point only (top-N distinct pairs);
    otherwise the top-N operating points. Either way a budget-0 point is run once per pair
    (it is plain SD whatever the divergence).
    """

    ranking_dir: str | None = None
    ranking_run_id: str | None = None
    top: int = 3
    per_pair: bool = True

    def __post_init__(self):
        if (self.ranking_dir is None) == (self.ranking_run_id is None):
            raise ValueError(f"set exactly one of ranking_dir / ranking_run_id, got {self.ranking_dir!r}, {self.ranking_run_id!r}")
        if self.top < 1:
            raise ValueError(f"top must be >= 1, got {self.top!r}")


@dataclass
class GenerationConfig:
    """Generation settings shared by all modes; ``prompts`` held-out prompts per run.

    ``md_solve``: the engine's ``md_solve`` in MD runs; ``null`` (default) takes the ranking's
    ``speed.md_solve``, the mode its speed model assumed. ``expected_acceptance`` needs
    ``reached`` or ``all`` (``needed`` leaves ``P_acc`` uncomputed where SD accepts).
    """

    prompts: int = 4
    max_new_tokens: int = 64
    temperature: float = 1.0
    seed: int = 0
    md_solve: Literal["reached", "needed", "all"] | None = None

    def __post_init__(self):
        if self.prompts < 1 or self.max_new_tokens < 2 or self.temperature < 0:
            raise ValueError(f"need prompts >= 1, max_new_tokens >= 2, temperature >= 0, got {self}")


@dataclass
class HumanEvalConfig:
    """HumanEval pass@1 of AR vs MD completions (held-out tasks); off when ``tasks: 0``."""

    tasks: int = 4
    max_new_tokens: int = 128
    timeout: float = 10.0


@dataclass
class ValidateConfig:
    """Everything ``mdboost validate`` needs."""

    name: str = "default"
    output_dir: str = "outputs/validate"
    ranking: SourceConfig = field(default_factory=lambda: SourceConfig(ranking_dir="outputs/rank"))
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    humaneval: HumanEvalConfig = field(default_factory=HumanEvalConfig)
    tolerance: float = 0.03
    tracking: TrackingConfig = field(default_factory=lambda: TrackingConfig(experiment="mdboost-validate"))
    progress: bool = True


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


def heldout_prompts(rank_cfg: RankConfig, tokenizer, n: int) -> tuple[list[dict], list[torch.Tensor]]:
    """The first ``n`` held-out records of the ranking's data and their prompt ids."""
    from mdboost.data import encode_prompt, load_texts

    d = rank_cfg.data
    records = load_texts(d.source, "heldout", n, prompt_field=d.prompt_field, reference_field=d.reference_field,
                         heldout_fraction=d.heldout_fraction, seed=d.seed)
    if not records:
        raise ValueError(f"data has no held-out records (heldout_fraction={d.heldout_fraction})")
    return records, [encode_prompt(tokenizer, r["prompt"], d.chat_template) for r in records]


def _drafter(member):
    return member.ngram if member.kind == "ngram" else member.model


def model_speedup(row: dict, alpha: float, md_solve: str) -> float:
    """The ranking's speed model at the row's gamma and costs, evaluated at acceptance ``alpha``
    (a realized one): separates the speed model's error from the acceptance prediction's.
    Rows of older rankings without ``verify_cost`` / ``md_overhead`` columns use 1 and 0."""
    from mdboost.ranking.speed import walltime_speedup

    if not 0 <= alpha <= 1:
        return float("nan")
    return float(walltime_speedup(alpha, int(row["best_gamma"]), float(row["cost_ratio"]),
                                  verify_cost=float(row.get("verify_cost") or 1.0),
                                  md_overhead=float(row.get("md_overhead") or 0.0), md_solve=md_solve,
                                  sd_acceptance=float(row["sd_acceptance"])))


def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def validate_point(row: dict, pool, prompts, cfg: ValidateConfig, md_solve: str = "reached") -> dict:
    """Realized AR, SD and MD numbers of one ranked operating point.

    The three modes run interleaved per prompt (:func:`mdboost.validation.runs.run_modes`), so
    the speedups compare runs made under the same machine load.
    """
    from mdboost.validation.prediction import predicted_acceptance
    from mdboost.validation.runs import run_modes, target_nll

    g = cfg.generation
    target, drafter = pool[row["target"]].model, _drafter(pool[row["drafter"]])
    common = dict(max_new_tokens=g.max_new_tokens, temperature=g.temperature, seed=g.seed,
                  gamma=int(row["best_gamma"]), eos_token_id=pool.target.tokenizer.eos_token_id)
    budget = float(row["max_divergence"])
    modes = {"ar": dict(mode="ar"), "sd": dict(mode="sd", drafter=drafter)}
    if budget > 0:
        modes["md"] = dict(mode="md", drafter=drafter, max_divergence=budget, divergence=row["divergence"],
                           md_solve=md_solve)
    runs = run_modes(target, prompts, modes, **common)
    ar, sd = runs["ar"], runs["sd"]
    md = runs.get("md", sd)
    ar_tps = ar.stats.tokens_per_second
    predicted, from_process = predicted_acceptance(row)
    out = {f"md_{k}": v for k, v in md.metrics().items()}
    out.update({f"sd_{k}": v for k, v in sd.metrics().items()})
    out.update({"ar_tokens_per_second": ar_tps, "realized_speedup": md.stats.tokens_per_second / ar_tps,
                "sd_realized_speedup": sd.stats.tokens_per_second / ar_tps,
                "predicted_acceptance": predicted, "predicted_acceptance_iid": float(row["md_acceptance"]),
                "predicted_acceptance_from_process": float(from_process),
                "predicted_speedup": float(row["predicted_speedup"]),
                "nll_target_md_outputs": target_nll(target, prompts, md.outputs),
                "nll_target_ar_outputs": target_nll(target, prompts, ar.outputs)})
    if _finite(row.get("predicted_speedup_iid")):
        out["predicted_speedup_iid"] = float(row["predicted_speedup_iid"])
    out["realized_acceptance"] = out["md_realized_acceptance"]
    out["expected_acceptance"] = out["md_expected_acceptance"]
    pa = out["predicted_acceptance"]
    out["acceptance_error"] = abs(pa - out["realized_acceptance"])
    out["acceptance_error_expected"] = abs(pa - out["expected_acceptance"])
    out["speedup_error"] = abs(out["predicted_speedup"] - out["realized_speedup"])
    alpha = out["expected_acceptance"] if out["expected_acceptance"] == out["expected_acceptance"] else out["realized_acceptance"]
    out["model_speedup_at_realized_acceptance"] = model_speedup(row, alpha, md_solve if budget > 0 else "reached")
    out["speedup_model_error"] = abs(out["model_speedup_at_realized_acceptance"] - out["realized_speedup"])
    return out


def humaneval_pass_at_1(row: dict, pool, rank_cfg: RankConfig, cfg: ValidateConfig) -> dict:
    """pass@1 of AR and MD completions on the first held-out HumanEval tasks."""
    from mdboost.validation import humaneval
    from mdboost.validation.runs import run_mode, truncate_completion

    h, tok = cfg.humaneval, pool.target.tokenizer
    records, prompts = heldout_prompts(rank_cfg, tok, h.tasks)
    problems = humaneval.load_problems()
    common = dict(max_new_tokens=h.max_new_tokens, temperature=cfg.generation.temperature,
                  seed=cfg.generation.seed, eos_token_id=tok.eos_token_id)
    target = pool[row["target"]].model
    runs = {"ar": run_mode(target, prompts, mode="ar", **common)}
    budget = float(row["max_divergence"])
    md_args = {"max_divergence": budget, "divergence": row["divergence"],
               "md_solve": cfg.generation.md_solve or rank_cfg.speed.md_solve}
    runs["md"] = run_mode(target, prompts, drafter=_drafter(pool[row["drafter"]]),
                          mode="md" if budget > 0 else "sd", gamma=int(row["best_gamma"]),
                          **(md_args if budget > 0 else {}), **common)
    out = {"humaneval_tasks": float(len(records))}
    for mode, run in runs.items():
        completions = {r["id"]: truncate_completion(tok.decode(o)) for r, o in zip(records, run.outputs)}
        out[f"humaneval_pass_at_1_{mode}"] = humaneval.evaluate(problems, completions, timeout=h.timeout).pass_at_1
    return out


def ranking_children(parent_run_id: str | None, tracking: TrackingConfig) -> dict[tuple, str]:
    """Nested ranking runs keyed by (drafter, target, divergence, max_divergence)."""
    if parent_run_id is None:
        return {}
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking.tracking_uri)
    parent = client.get_run(parent_run_id)
    runs = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'",
                              max_results=5000)
    return {_key(r.data.params): r.info.run_id for r in runs}


def _key(p: dict) -> tuple:
    return (p["drafter"], p["target"], p["divergence"], round(float(p["max_divergence"]), 12))


def select_points(rows: list[dict], top: int, per_pair: bool) -> list[dict]:
    """The first ``top`` distinct operating points (or pairs) of ranking rows sorted by rank."""
    rows = sorted(rows, key=lambda r: int(r["rank"]))
    chosen, seen = [], set()
    for r in rows:
        if r["target"] == "ngram" or r["target"].startswith("ngram:"):
            continue
        budget = round(float(r["max_divergence"]), 12)
        key = (r["drafter"], r["target"]) if per_pair else (
            r["drafter"], r["target"], "sd" if budget == 0 else r["divergence"], budget)
        if key not in seen:
            seen.add(key)
            chosen.append(r)
        if len(chosen) == top:
            break
    return chosen


def iid_acceptance_errors(points: list[tuple[dict, dict]]) -> dict[str, float]:
    """``acceptance_mae_iid`` / ``acceptance_max_error_iid`` (and ``_expected``): the errors the
    i.i.d. prediction ``md_acceptance`` would have, for comparison with the compared one."""
    out = {}
    for key, suffix in (("realized_acceptance", ""), ("expected_acceptance", "_expected")):
        pairs = [(m["predicted_acceptance_iid"], m[key]) for _, m in points if _finite(m[key])]
        if pairs:
            err = [abs(p - r) for p, r in pairs]
            out.update({f"acceptance_mae_iid{suffix}": sum(err) / len(err), f"acceptance_max_error_iid{suffix}": max(err)})
    return out


def run(cfg: ValidateConfig) -> dict:
    """Run the validation; returns a summary with per-point metrics and quality metrics."""
    from mdboost.models.pool import build_pool
    from mdboost.validation import prediction_quality
    from mdboost.validation.plots import plot_predicted_vs_realized

    with tempfile.TemporaryDirectory() as tmp:
        rows, rank_cfg, rank_run = fetch_ranking(cfg.ranking, cfg.tracking, Path(tmp))
    rows = select_points(rows, cfg.ranking.top, cfg.ranking.per_pair)
    pc = rank_cfg.pool
    names = sorted({n for r in rows for n in (r["drafter"], r["target"])} - {pc.target})
    pool = build_pool(pc.target, names, device=pc.device, home=pc.home)
    _, prompts = heldout_prompts(rank_cfg, pool.target.tokenizer, cfg.generation.prompts)
    md_solve = cfg.generation.md_solve or rank_cfg.speed.md_solve
    points = [(row, validate_point(row, pool, prompts, cfg, md_solve)) for row in rows]
    quality = prediction_quality([m["predicted_acceptance"] for _, m in points], [m["realized_acceptance"] for _, m in points],
                                 [m["predicted_speedup"] for _, m in points], [m["realized_speedup"] for _, m in points],
                                 tolerance=cfg.tolerance, expected_acceptance=[m["expected_acceptance"] for _, m in points])
    model_err = [m["speedup_model_error"] for _, m in points if m["speedup_model_error"] == m["speedup_model_error"]]
    quality = quality.as_metrics()
    quality.update(iid_acceptance_errors(points))
    if model_err:  # the speed model alone, fed the realized acceptance
        quality.update(speedup_model_mae=sum(model_err) / len(model_err), speedup_model_max_error=max(model_err))
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
        summary["quality"].update(humaneval_pass_at_1(rows[0], pool, rank_cfg, cfg))
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
                mlflow.set_tag("mdboost.ranking_run_id", children.get(_key(row), ""))
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

