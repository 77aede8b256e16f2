"""``mdboost validate --config X``: real runs of a ranking's cells, predicted vs realized.

Steps: read ``ranking.csv``, ``config.resolved.yaml`` and (when there) ``summary.json`` from a
folder, or download them from the ranking's MLflow parent run; take the ranking's sampling
settings and refuse a validation config that contradicts them
(:func:`mdboost.validation.cells.resolve_sampling`, :func:`~mdboost.validation.cells.check_md_solve`);
pick the recommendation's cell and ``ranking.cells`` more across the space
(:func:`~mdboost.validation.cells.select_cells`); rebuild the pool; generate on HELD-OUT prompts
(``mdboost.data`` split ``heldout``, never cached or ranked on), every cell at its own
temperature, gamma, divergence, budget and ``md_solve``, interleaved per prompt with AR
(:func:`mdboost.validation.points.realize_cells`); compare predicted (with intervals) and
realized (:mod:`mdboost.validation.report`); write ``validation.csv``, ``summary.json`` and the
scatter plot into a fresh folder that replaces ``output_dir`` whole (:func:`mdboost._io.output_folder`); optionally HumanEval pass@1 of AR vs the recommendation; log a
parent run and one nested run per cell, tagged ``mdboost.ranking_run_id``.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from mdboost._stages import ticking, timed
from mdboost._io import check_output_folder, output_folder, read_json_object, read_yaml_mapping
from mdboost.data import sample_summary
from mdboost.engine.costs import ENGINE_THREADS, torch_threads
from mdboost.engine.llamacpp import LlamaCppPool
from mdboost.models.pool import build_pool
from mdboost.ranking.report import at_batch_size, batch_sizes_of, row_batch_size
from mdboost.ranking.report import check_csv_digest, read_csv
from mdboost.ranking.summary_check import check_recommendations_in_rows, check_summary
from mdboost.tracking import setup
from mdboost.tracking.datasets import log_records
from mdboost.tracking.notes import validation_note
from mdboost.tracking.runs import ChildRun, log_children, ordered_metrics, parent_run, point_name
from mdboost.tracking.store import existing_run
from mdboost.validation.calibration import ONE_PASS, TimingNoise, predictive_scale, timing_noise
from mdboost.validation.cells import check_md_solve, complete_rows, resolve_sampling, select_cells
from mdboost.validation.plots import plot_predicted_vs_realized
from mdboost.validation.points import heldout_prompts, humaneval_pass_at_1, realize_cells
from mdboost.validation.report import COLUMNS as VALIDATION_COLUMNS
from mdboost.validation.report import (
    INTERVAL_LEVEL,
    cell_record,
    format_table,
    summarize,
    verdict,
    write_summary_json,
    write_validation_csv,
)
from mdboost.validation.scaleout import realize_cells_on
from pipelines.loader import from_dict, load_yaml, to_dict
from pipelines.config import RankConfig, TrackingConfig
from pipelines.noise import quiet_libraries
from pipelines.stages import stage_line
from pipelines.prerequisites import missing_ranking
from pipelines.validate_config import SourceConfig, ValidateConfig

RANKING_FILES = ("ranking.csv", "config.resolved.yaml")
# what a validation writes at the top of its output folder: an existing folder holding anything else is not replaced
OUTPUT_FILES = ("validation.csv", "predicted_vs_realized.png", "summary.json")


@dataclass
class Ranking:
    """What validation reads of a ranking."""

    rows: list[dict]
    config: RankConfig
    summary: dict | None  # the ranking's summary.json, when it has one
    run_id: str | None  # its MLflow parent run: given, or named by a folder's summary.json
    sampling: dict        # {temperatures, top_k, top_p}
    md_solve: str


def _ranking_sampling(summary: dict | None, md_section: dict) -> dict:
    """The ranking's sampling settings: ``summary.json`` ``sampling``, else its config's ``md``."""
    if summary and summary.get("sampling"):
        return dict(summary["sampling"])
    temps = md_section.get("temperatures")
    if temps is None:
        temps = [md_section.get("temperature", 1.0)]
    temps = temps if isinstance(temps, (list, tuple)) else [temps]
    return {"temperatures": [float(t) for t in temps], "top_k": md_section.get("top_k"),
            "top_p": md_section.get("top_p")}


def fetch_ranking(src: SourceConfig, tracking: TrackingConfig, tmp: Path) -> Ranking:
    """The ranking from a folder or an MLflow run (``summary.json`` optional in a run; a folder
    needs it, and its ``ranking.csv`` must match the digest there and hold its recommendations)."""
    folder, run_id = (Path(src.ranking_dir) if src.ranking_dir else None), src.ranking_run_id
    if run_id is not None:
        import mlflow  # deferred: mlflow: seconds to import; only a tracked run needs it

        existing_run(run_id, tracking.tracking_uri, run_name=" (ranking.ranking_run_id)",
                     uri_name=" (tracking.tracking_uri)")
        mlflow.set_tracking_uri(tracking.tracking_uri)
        folder = tmp / "ranking"
        for name in (*RANKING_FILES, "summary.json"):
            try:
                mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=name, dst_path=str(folder))
            except Exception:  # noqa: BLE001 -- a missing artifact: the check below names it
                pass
    for name in RANKING_FILES:
        if not (folder / name).is_file():
            if run_id is not None:
                raise ValueError(f"MLflow run {run_id!r} in {tracking.tracking_uri} holds no {name}: give the "
                                 "parent run of `mdboost rank` (ranking.ranking_run_id)")

            raise ValueError(missing_ranking(src.ranking_dir, name))
    summary = read_json_object(folder / "summary.json")
    where = f"MLflow run {run_id!r}" if run_id is not None else f"ranking folder {src.ranking_dir!r}"
    if summary is None and run_id is None:  # mdboost rank always writes one: without it the folder is no ranking
        raise ValueError(f"{where} has ranking files but no summary.json (a rerun failed or was interrupted): "
                         "run `mdboost rank` again")
    if summary is not None:  # every field by type; its recommendations must be rows of ranking.csv
        summary = check_summary(summary, where, recommendation=False)
    check_csv_digest(folder / "ranking.csv", (summary or {}).get("ranking_csv_sha256"), where)
    raw = read_yaml_mapping(folder / "config.resolved.yaml")
    if isinstance(raw.get("data"), dict) and "sample" not in raw["data"]:
        # a ranking from before data.sample ranked the head of its split: its held-out prompts too
        raw = {**raw, "data": {**raw["data"], "sample": "head"}}
    config = from_dict(RankConfig, raw)
    rows = sorted(read_csv(folder / "ranking.csv"), key=lambda r: int(r["rank"]))
    if summary is not None:
        check_recommendations_in_rows(summary, rows, where)
    md_solve = (summary or {}).get("md_solve") or config.speed.md_solve
    # the ranking's MLflow parent run: the one given, else the one a ranking folder's summary names
    # (linked when the validation logs to the same store: ranking_children)
    link = run_id or (summary or {}).get("run_id")
    return Ranking(rows, config, summary, link, _ranking_sampling(summary, raw.get("md") or {}), md_solve)


@dataclass
class Plan:
    """The cells to validate and the settings they run with."""

    ranking: Ranking
    cells: list[dict]
    sampling: dict


def plan(cfg: ValidateConfig) -> Plan:
    """Read the ranking, check the config against it, pick the cells (``ValueError`` on a contradiction)."""
    with tempfile.TemporaryDirectory() as tmp:
        ranking = fetch_ranking(cfg.ranking, cfg.tracking, Path(tmp))
    g = cfg.generation
    sampling = resolve_sampling(ranking.sampling, temperature=g.temperature, top_k=g.top_k, top_p=g.top_p)
    temps = ranking.sampling["temperatures"]
    rows = complete_rows(ranking.rows, temperature=float(temps[0]) if len(temps) == 1 else None,
                         md_solve=ranking.md_solve)
    check_md_solve(rows, g.md_solve)
    summary = ranking.summary or {}
    by_batch = summary.get("recommendations_by_batch_size") or {}
    cells = []
    for b in batch_sizes_of(rows):  # the recommendation's and cfg.ranking.cells more at each batch size
        recommendation = by_batch.get(str(b)) or (summary.get("recommendation") if b == 1 else None)
        cells += select_cells(at_batch_size(rows, b), recommendation, cells=cfg.ranking.cells,
                              temperatures=sampling["temperatures"])
    return Plan(ranking, cells, sampling)


def interval_settings(ranking: Ranking, new_prompts: int) -> dict:
    """How the ranking's intervals become predictive ones for a run over ``new_prompts`` prompts
    (:func:`mdboost.validation.calibration.predictive_scale`; scale 1 when the ranking does not
    say over how many prompts it bootstrapped)."""
    boot = (ranking.summary or {}).get("bootstrap") or {}
    fit = boot.get("prompts")
    scale = predictive_scale(int(fit), int(new_prompts)) if fit else 1.0
    return {"ranking_prompts": fit, "validation_prompts": int(new_prompts), "scale": scale,
            "level": boot.get("level"), "kind": "predictive: the mean over the validation's prompts"}


def realized_timing(realized: list[dict], level: float):
    """The realized speedups' timing noise (:func:`mdboost.validation.calibration.timing_noise`) over
    the cells whose every pass has a positive finite speedup (a pass that made no token has no log
    spread: such a cell is left out, not fatal after the generations); None with one pass or no
    such cell.

    >>> cells = [{"realized_speedup_passes": [1.0, 1.1]}, {"realized_speedup_passes": [0.0, 0.5]}]
    >>> realized_timing(cells, 0.9).cells, realized_timing(cells[1:], 0.9) is None
    (1, True)
    """
    per_pass = [r["realized_speedup_passes"] for r in realized
                if all(math.isfinite(x) and x > 0 for x in r["realized_speedup_passes"])]
    return timing_noise(per_pass, level) if per_pass else None


def generation_length_note(ranking: Ranking, max_new_tokens: int) -> str | None:
    """A warning when the ranking predicted for generations of another length (its sampled
    continuations' ``acceptance_max_new_tokens``, or reference texts of their own lengths): the
    prompt's share of the time, and so every speedup, then differs (``docs/theory.md`` section 8)."""
    c = ranking.config.cache
    if c.acceptance_source == "reference":
        return (f"warning: the ranking read its acceptance on reference text (cache.acceptance_source: reference), "
                f"whose lengths are the references' own, not the {max_new_tokens} tokens this validation generates "
                f"(generation.max_new_tokens): realized speedups differ by the prompt's share of the time and by "
                f"the reference's approximation (docs/ranking.md, \"Draft-start process\")")
    if c.acceptance_max_new_tokens == max_new_tokens:
        return None
    return (f"warning: the ranking predicts for {c.acceptance_max_new_tokens}-token generations "
            f"(cache.acceptance_max_new_tokens), this validation generates {max_new_tokens} "
            f"(generation.max_new_tokens): realized speedups differ by the prompt's share of the time")


def prompt_count_note(ranking: Ranking, generation) -> str | None:
    """A warning when the held-out split has fewer prompts from ``generation.first_prompt`` on than
    ``generation.prompts`` asks for: the cells then run on those it has (``summary.json``
    ``generation.prompts`` says how many)."""
    text = ranking.config.data.text_source()
    have = len(text.load("heldout", generation.first_prompt + generation.prompts)[generation.first_prompt:])
    if have >= generation.prompts:
        return None
    return (f"warning: generation.prompts is {generation.prompts} but the held-out split has {have} prompts from "
            f"the {generation.first_prompt}-th on (data.heldout_fraction={text.heldout_fraction} of the ranking's "
            f"data): every cell runs on those {have}")


def batch_prompts_note(cells: list[dict], prompts: int) -> str | None:
    """A warning when a batch size of the cells does not divide the prompts: its last batch runs
    fewer rows (fewer prompts than the batch size: every batch does), so its realized throughput
    is partly a smaller batch's.

    >>> batch_prompts_note([{"batch_size": "1"}, {"batch_size": "4"}], 8) is None
    True
    >>> batch_prompts_note([{"batch_size": "4"}], 10)
    'warning: generation.prompts is 10, not a multiple of batch size(s) [4]: their last batch runs 2 rows, so those cells realize partly a smaller batch'
    """
    uneven = sorted({row_batch_size(c) for c in cells if prompts % row_batch_size(c)})
    if not uneven:
        return None
    return (f"warning: generation.prompts is {prompts}, not a multiple of batch size(s) {uneven}: their last batch "
            f"runs {', '.join(str(prompts % b) for b in uneven)} rows, so those cells realize partly a smaller batch")


def _label(rec: dict) -> str:
    point = "SD" if rec["max_divergence"] == 0 else f"{rec['divergence']}@{rec['max_divergence']:g}"
    return f"{rec['cell']}:{rec['drafter']} T{rec['temperature']:g} g{rec['gamma']} {point}"


def run(cfg: ValidateConfig, the_plan: Plan | None = None) -> dict:
    """Run the validation; returns the summary written to ``summary.json`` (plus ``records``)."""
    started_at, start, stages = time.time(), time.perf_counter(), {}
    check_output_folder(cfg.output_dir, OUTPUT_FILES)  # before the work: a folder it may not replace
    with timed(stages, "plan"):
        p = the_plan or plan(cfg)
    rank_cfg, g, sampling = p.ranking.config, cfg.generation, p.sampling
    pc, text = rank_cfg.pool, rank_cfg.data.text_source()
    names = sorted({n for r in p.cells for n in (r["drafter"], r["target"])} - {pc.target})
    engine = rank_cfg.speed.engine  # the engine whose costs the ranking priced runs the cells
    with timed(stages, "models"):
        pool = build_pool(pc.target, names, device=pc.device, home=pc.home)
        engine_pool = None if engine == "mdboost" else LlamaCppPool(pc.target, names, home=pc.home,
                                                                      n_threads=ENGINE_THREADS)
    heldout, prompts = heldout_prompts(text, pool.target.tokenizer, g.prompts, g.first_prompt)

    kwargs = dict(max_new_tokens=g.max_new_tokens, seed=g.seed, top_k=sampling["top_k"], top_p=sampling["top_p"],
                  passes=g.passes)
    with timed(stages, "generation"), g.cluster() as client, torch_threads(ENGINE_THREADS):  # the ranking's threads
        if client is not None and engine_pool is not None:
            raise ValueError(f"generation.scheduler: the ranking's costs are llama.cpp's (speed.engine: {engine}), "
                             f"whose models do not travel to Dask workers: leave generation.scheduler unset")
        if client is None:
            realized = realize_cells(p.cells, pool, prompts, progress=cfg.progress, engine_pool=engine_pool, **kwargs)
        else:  # one cell with its own AR run per task (mdboost.validation.scaleout)
            realized = realize_cells_on(client, p.cells, pool.recipe, prompts, threads=ENGINE_THREADS, **kwargs)
    intervals = interval_settings(p.ranking, len(prompts))
    noise = realized_timing(realized, intervals["level"] or INTERVAL_LEVEL)
    intervals["timing"] = None if noise is None else noise.to_dict()
    firsts = {}  # each batch size's first cell is its recommendation's
    for i, row in enumerate(p.cells):
        firsts.setdefault(row_batch_size(row), i)
    records = [cell_record(i, "recommendation" if i in firsts.values() else "sample", row, real, top_k=sampling["top_k"],
                           top_p=sampling["top_p"], interval_scale=intervals["scale"],
                           timing=0.0 if noise is None else noise.half_width_log)
               for i, (row, real) in enumerate(zip(p.cells, realized))]
    metrics = summarize(records)
    summary = {"verdict": verdict(metrics, intervals["level"]), "metrics": metrics, "sampling": sampling,
               "md_solve": sorted({r["md_solve"] for r in records}), "engine": engine,
               "generation": {"prompts": len(prompts), "first_prompt": g.first_prompt, "passes": g.passes,
                              "max_new_tokens": g.max_new_tokens, "seed": g.seed, "scheduler": g.scheduler},
               "intervals": intervals, "data": sample_summary(heldout, text, split="heldout"),
               "ranking": {"ranking_dir": cfg.ranking.ranking_dir, "ranking_run_id": p.ranking.run_id},
               "cells": records}
    if cfg.humaneval.tasks > 0 and rank_cfg.data.source == "humaneval":
        h = cfg.humaneval
        with timed(stages, "humaneval"), ticking(f"HumanEval pass@1: {h.tasks} tasks x {h.max_new_tokens} tokens, AR and "
                                                 f"cell 0, checked in a sandbox", cfg.progress):
            summary["humaneval"] = humaneval_pass_at_1(p.cells[0], pool, text, tasks=h.tasks,
                                                       max_new_tokens=h.max_new_tokens, seed=g.seed, timeout=h.timeout,
                                                       top_k=sampling["top_k"], top_p=sampling["top_p"],
                                                       engine_pool=engine_pool)
    out = Path(cfg.output_dir)
    summary["files"] = {"validation_csv": str(out / "validation.csv"), "plot": str(out / "predicted_vs_realized.png"),
                        "summary_json": str(out / "summary.json")}
    # every file into a fresh folder that replaces output_dir whole at the end (docs/validation.md,
    # "Outputs"): a run that fails or is killed leaves the previous run's outputs, never a mix
    with output_folder(out, OUTPUT_FILES) as tmp:
        _write_all(cfg, summary, records, p, heldout, text, tmp, started_at, stages, start)
    return summary


def _write_all(cfg: ValidateConfig, summary: dict, records: list[dict], p: Plan, heldout, text, out: Path,
               started_at: float, stages: dict, start: float) -> None:
    """The plot, ``validation.csv`` and ``summary.json`` into the run's folder ``out`` (``summary``'s
    ``files`` name where they end up), logged to MLflow when tracked (its parent starting at
    ``started_at``, seconds since the epoch); ``summary.json`` gets ``seconds_total`` (from
    ``start``, a ``time.perf_counter()`` reading) and ``seconds_by_stage`` (``stages`` with the
    outputs' and MLflow's seconds added)."""
    col = lambda key: [r[key] for r in records]  # noqa: E731
    with timed(stages, "outputs"):
        _write_files(cfg, records, out, col)
    if cfg.tracking.enabled:
        with timed(stages, "mlflow"):
            summary["run_id"] = log_mlflow(cfg, summary, ranking_children(p.ranking.run_id, cfg.tracking),
                                           records=heldout, text=text, folder=out, started_at=started_at)
    summary["seconds_total"], summary["seconds_by_stage"] = time.perf_counter() - start, stages
    write_summary_json(summary, out / "summary.json")  # last, with the run id
    if "run_id" in summary:
        from mlflow.tracking import MlflowClient  # deferred: mlflow: seconds to import; only a tracked run needs it

        MlflowClient(cfg.tracking.tracking_uri).log_artifact(summary["run_id"], str(out / "summary.json"))


def _write_files(cfg: ValidateConfig, records: list[dict], out: Path, col) -> None:
    plot_predicted_vs_realized(
        [_label(r) for r in records], col("predicted_acceptance"), col("realized_acceptance"), col("predicted_speedup"),
        col("realized_speedup"), out / "predicted_vs_realized.png", tolerance=cfg.tolerance,
        acceptance_interval=(col("predicted_acceptance_lo"), col("predicted_acceptance_hi")),
        speedup_interval=(col("predicted_speedup_lo"), col("predicted_speedup_hi")))
    write_validation_csv(records, out / "validation.csv")


def _child_key(params: dict, temperature: float | None) -> tuple:
    budget = round(float(params["max_divergence"]), 12)
    return (params["drafter"], params["target"], "none" if budget == 0 else params["divergence"], budget, temperature)


def ranking_children(parent_run_id: str | None, tracking: TrackingConfig) -> dict[tuple, str]:
    """Nested ranking runs keyed by (drafter, target, divergence, budget, temperature or None)."""
    if parent_run_id is None:
        return {}
    from mlflow.exceptions import MlflowException  # deferred: mlflow: seconds to import; only a tracked run needs it
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking.tracking_uri)
    try:
        parent = client.get_run(parent_run_id)
    except MlflowException:  # a folder's ranking logged to another store: nothing to link to
        return {}
    runs = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'",
                              max_results=5000)
    out = {}
    for r in runs:
        t = r.data.params.get("temperature")
        out[_child_key(r.data.params, None if t is None else round(float(t), 12))] = r.info.run_id
    return out


def _flat_metrics(metrics: dict) -> dict[str, float]:
    out = {}
    for figure, m in metrics.items():
        for key, value in (m or {}).items():
            if isinstance(value, bool):
                value = float(value)
            if isinstance(value, (int, float)) and math.isfinite(value):
                out[f"{figure}_{key}"] = float(value)
    return out


VALIDATION_METRICS = ("realized_speedup", "predicted_speedup", "predicted_speedup_lo", "predicted_speedup_hi",
                      "realized_acceptance", "predicted_acceptance", "predicted_acceptance_lo", "predicted_acceptance_hi",
                      "realized_mean_accepted_length", "predicted_mean_accepted_length",
                      "predicted_mean_accepted_length_lo", "predicted_mean_accepted_length_hi")
"""A cell run's metrics logged first (the Compare view starts from the first)."""


def _cell_runs(cells: list[dict], children: dict[tuple, str]) -> list:
    """One nested run per validated cell, cell 0 (the recommendation) first."""
    keys = ("role", "drafter", "target", "temperature", "divergence", "max_divergence", "gamma", "md_solve",
            "batch_size")
    out = []
    for rec in cells:
        params = {k: rec[k] for k in keys}
        t = round(rec["temperature"], 12)
        child = children.get(_child_key(rec, t)) or children.get(_child_key(rec, None), "")
        name = f"{rec['cell']}: " + point_name(rec["drafter"], rec["divergence"], rec["max_divergence"], rec["gamma"],
                                               rec["temperature"]) + (f" B{rec['batch_size']}" if rec["batch_size"] > 1 else "")
        metrics = ordered_metrics({k: v for k, v in rec.items() if k not in params and k != "cell"}, VALIDATION_METRICS)
        out.append(ChildRun(name, params, metrics, {"mdboost.ranking_run_id": child, "mdboost.cell": str(rec["cell"])}))
    return out


def log_mlflow(cfg: ValidateConfig, summary: dict, children: dict[tuple, str], *, records: list[dict] | None = None,
               text=None, folder: Path | None = None, started_at: float | None = None) -> str:
    """A parent run (config, metrics, verdict and cells as its description, files, the cells'
    table, the held-out prompts as its dataset) and one nested run per cell, cell 0 first.

    ``records`` / ``text``: the held-out records generated on and their
    :class:`~mdboost.data.TextSource` (logged with :func:`mdboost.tracking.datasets.log_records`
    when both are given). ``folder``: where the files of ``summary["files"]`` are while the run
    writes them (its temporary output folder; None: where ``files`` names them). ``started_at``:
    when the job began (seconds since the epoch; default: now), the parent's start, so its
    Duration is the job's (:func:`mdboost.tracking.runs.parent_run`).
    """
    import mlflow  # deferred: mlflow: seconds to import; only a tracked run needs it
    from mlflow.tracking import MlflowClient

    experiment_id = setup(cfg.tracking.experiment, cfg.tracking.tracking_uri, cfg.tracking.artifact_root)
    sampling, ranking_run = summary["sampling"], summary["ranking"]["ranking_run_id"]
    note = validation_note(summary["verdict"], summary["cells"], prompts=summary["generation"]["prompts"],
                           max_new_tokens=summary["generation"]["max_new_tokens"], ranking_run_id=ranking_run)
    with parent_run(MlflowClient(cfg.tracking.tracking_uri), experiment_id, f"validate:{cfg.name}",
                    time.time() if started_at is None else started_at) as parent:
        mlflow.log_metrics(_flat_metrics(summary["metrics"]))
        mlflow.set_tags({"mdboost.pipeline": "validate_pairs",
                         "mdboost.ranking_run_id": ranking_run or "",
                         "mlflow.experimentKind": "custom_model_development",
                         "mlflow.note.content": note})
        mlflow.log_params({"cells": len(summary["cells"]), "prompts": summary["generation"]["prompts"],
                           "max_new_tokens": cfg.generation.max_new_tokens, "md_solve": ",".join(summary["md_solve"]),
                           "temperatures": ",".join(f"{t:g}" for t in sampling["temperatures"]),
                           "top_k": sampling["top_k"], "top_p": sampling["top_p"], "tolerance": cfg.tolerance})
        if "humaneval" in summary:
            mlflow.log_metrics({k: float(v) for k, v in summary["humaneval"].items()})
        if records and text is not None:
            log_records(records, text, "heldout", context="validation")
        for key, path in summary["files"].items():
            if key != "summary_json":  # written after this run, with its id (run)
                mlflow.log_artifact(path if folder is None else str(folder / Path(path).name))
        mlflow.log_dict(to_dict(cfg), "config.resolved.json")
        cells = summary["cells"]
        mlflow.log_table({k: [r.get(k) for r in cells] for k in VALIDATION_COLUMNS}, "validation_table.json")
        log_children(MlflowClient(cfg.tracking.tracking_uri), experiment_id, parent.info.run_id,
                     _cell_runs(cells, children))
        return parent.info.run_id


def main(config: str | ValidateConfig, overrides=()) -> int:
    """CLI entry point: ``mdboost validate --config <yaml> [--set key.path=value ...]``; returns
    the exit status. ``config``: the YAML file (read with ``overrides``), or the
    :class:`~pipelines.validate_config.ValidateConfig` loaded from it (:func:`pipelines.commands.validate`,
    the command's entry).

    A config error, or a config that contradicts the ranking, raises its ValueError before any
    generation, reported by :func:`mdboost.cli.main` as one line (exit 2, the traceback with ``--debug``).
    """
    cfg = config if isinstance(config, ValidateConfig) else load_yaml(config, ValidateConfig, overrides)
    if not cfg.progress:
        quiet_libraries()
    the_plan = plan(cfg)
    torch.manual_seed(cfg.generation.seed)
    for note in (generation_length_note(the_plan.ranking, cfg.generation.max_new_tokens),
                 prompt_count_note(the_plan.ranking, cfg.generation),
                 batch_prompts_note(the_plan.cells, cfg.generation.prompts)):
        if note:
            print(note, file=sys.stderr)
    summary = run(cfg, the_plan)
    print(format_table(summary["cells"]))
    if "humaneval" in summary:
        h = summary["humaneval"]
        print(f"HumanEval pass@1 over {h['humaneval_tasks']:g} tasks: AR {h['humaneval_pass_at_1_ar']:.2f}, "
              f"cell 0 {h['humaneval_pass_at_1_md']:.2f}")
    print(f"files: {summary['files']['validation_csv']}, {summary['files']['summary_json']}, {summary['files']['plot']}")
    if "run_id" in summary:
        print(f"mlflow run: {summary['run_id']} in {cfg.tracking.tracking_uri}")
    i = summary["intervals"]
    if i["ranking_prompts"]:
        print(f"intervals: the ranking's {i['level']:.0%} intervals over {i['ranking_prompts']} prompts, widened "
              f"x{i['scale']:.2f} to predict the mean over these {i['validation_prompts']} prompts")
    t = i.get("timing")
    print(f"timing noise: {ONE_PASS} (generation.passes: 2 or more adds it)" if t is None else
          f"timing noise: {TimingNoise(**t).describe()}")
    print(stage_line(summary["seconds_by_stage"], summary["seconds_total"]))
    print(summary["verdict"])
    return 0
