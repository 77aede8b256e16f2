"""``mdboost rank --config X``: rank the drafter/target pairs of a pool from its logit cache.

Steps: load and validate the YAML config (:class:`pipelines.config.RankConfig`); open (or build:
pool, records, cost ratios, logits) the members' cache folders ``<cache.dir>/<member>-<fingerprint>``
(:func:`mdboost.cache.open_or_build_cache` on :meth:`RankConfig.cache_spec`); score every
ordered pair (:func:`mdboost.ranking.rank.score_pair`); apply the ranking rule; write
``ranking.csv`` (one row per pair, temperature, operating point and gamma, with 90% intervals)
+ ``ranking.html`` (best gamma per point) + plots + the resolved config + ``summary.json``
(timings, the bootstrap, the recommendation, the digest of the CSV's bytes) into a fresh
folder that replaces ``output_dir`` whole at the end (:func:`mdboost._io.output_folder`: a
killed or concurrent run never leaves two runs' files mixed); log one MLflow parent run
(its description: the recommendation and the ranking's summary, in markdown; the ranking as a
table; the cached prompts as its dataset) with a nested run per pair, temperature and
operating point at its best gamma, best first; print the top points and, last, the recommendation with a
ready-to-run engine call. Every temperature of ``md.temperatures`` is ranked on its own cache
folders (continuations are sampled at it), all rows in one ranking.

With ``cache.acceptance_source: sampled`` a second set of per-member folders holds
continuations sampled from the target (sampled once, shared by all members); every pair's
acceptance-side columns are scored on them (quality and boosting stay on the main folders) and
each row says so in ``acceptance_source``. Predicted speedups use the target's measured speed
profile (verification cost table and MD overhead, :mod:`mdboost.ranking.speed`).

With ``--costs PROFILE`` (``run(cfg, costs)``) the finished caches are re-scored with a cost
profile's costs (:mod:`mdboost.cache.profile`, e.g. another machine's) instead of this machine's
speed file: nothing is built or measured, and ``ranking.csv`` is the one a full run with those
costs writes. ``summary.json``'s ``cost_profile`` and ``hardware``, the verdict and the MLflow
description name where the costs were measured.

Re-running with the same config reuses the cache (same fingerprint, finished shards skipped);
a config that changes the pool, the data or the cache settings gets a new cache folder, while
changes to budgets, gamma range, boosting or the ranking rule only re-score from the cache.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import NamedTuple

import yaml
from tqdm.auto import tqdm

from mdboost._stages import timed
from mdboost._io import atomic_write_bytes, check_output_folder, output_folder
from mdboost.cache import open_or_build_cache
from mdboost.cache.mentored import attach_mentored
from mdboost.cache.pool_cache import BuildInfo, PoolCache, open_cached
from mdboost.cache.profile import costs_line, hardware_label, loaded_measurements, read_profile, sampling_of
from mdboost.cache.scores import WorkStore, folder_names, work_key
from mdboost.data import sample_summary
from mdboost.engine.costs import torch_threads
from mdboost.export import llamacpp_command, llamacpp_snippet, mdboost_snippet
from mdboost.models.home import mdboost_home
from mdboost.models.loading import resolve_device
from mdboost.ranking import page, plots, report
from mdboost.ranking.breakeven import break_even_costs, hardware_line, reason_line
from mdboost.ranking.frontier import cached_positions, frontier, priced
from mdboost.ranking.rank import PLAIN_SD, rank_rows
from mdboost.ranking.report import ALONE, at_batch_size
from mdboost.ranking.recommend import (Recommendation, batch_lines, md_row, plain_wins_from, recommend,
                                      recommend_engines, rule_label)
from mdboost.ranking.rows import MemberLoader, select_pairs
from mdboost.ranking.scaleout import active_client, score_cached_batches, score_pairs_on
from mdboost.ranking.summary_check import find_row
from mdboost.tracking import setup
from mdboost.tracking.datasets import log_records
from mdboost.tracking.notes import costed_verdict, ranking_note
from mdboost.tracking.runs import ChildRun, log_children, ordered_metrics, parent_run, point_name
from pipelines.loader import load_yaml, to_dict
from pipelines.config import RankConfig
from pipelines.noise import quiet_libraries
from pipelines.stages import add_seconds, stage_line

UNFILTERED = {"top_k": None, "top_p": None}  # a ranking samples from the whole distribution (summary's sampling)
# what a ranking writes at the top of its output folder: an existing folder holding anything else is not replaced
OUTPUT_FILES = ("ranking.csv", "ranking.html", "ranking_full.html", "config.resolved.yaml", "frontier.csv", "plots", "summary.json")


def _progress(iterable, enabled: bool, **kwargs):
    return tqdm(iterable, disable=not enabled, **kwargs)


def single_thread():
    """Run torch on one thread, then restore: scoring works on small ``[rows, 2k+1]`` tensors,
    where intra-op threads bring nothing and oversubscribe a shared CPU (measured 13x slower
    with 2 threads on a loaded 2-core machine)."""
    return torch_threads(1)


def score_all(cfg: RankConfig, pc, temperature: float) -> tuple[list[dict], dict]:
    """Score every selected pair from the cache at one temperature; returns (rows, per-pair details).

    With ``cache.backend: dask`` and the run's client active (:meth:`CacheConfig.cluster`), the
    pairs are scored on its workers, one task per pair (:func:`mdboost.ranking.scaleout.score_pairs_on`),
    gathered in the pairs' order: the same rows as here, pair after pair."""
    client = active_client() if cfg.cache.backend == "dask" else None
    with single_thread():
        return _score_all(cfg, pc, temperature, client)


def _score_all(cfg: RankConfig, pc, temperature: float, client=None) -> tuple[list[dict], dict]:
    """Every pair at every batch size of ``speed.batch_sizes`` (the details: the first's)."""
    rows, details, sizes = [], {}, tuple(cfg.speed.batch_sizes)
    settings = cfg.score_settings(temperature, sizes[0])
    pairs = select_pairs(pc, cfg.pool.pairs)
    desc = f"scoring pairs (T={temperature:g})"
    if client is not None:
        scores = score_pairs_on(client, pc, pairs, settings, acceptance_source=cfg.cache.acceptance_source,
                                progress=lambda it: _progress(it, cfg.progress, desc=desc, unit="pair",
                                                              total=len(pairs)), batch_sizes=sizes)
    else:
        loader = MemberLoader(pc, settings.quality_temperature)  # the quality side (temperature 1 for greedy)
        acc_loader = None if pc.acceptance is None else MemberLoader(pc.acceptance, temperature)
        scores = (score_cached_batches(pc, d, t, settings, sizes, acceptance_source=cfg.cache.acceptance_source,
                                       loader=loader, acceptance_loader=acc_loader)
                  for d, t in _progress(pairs, cfg.progress, desc=desc, unit="pair"))
    for (drafter_name, target_name), by_batch in zip(pairs, scores):
        for batch_size in sizes:  # the points, then the drafter alone
            rows.extend(by_batch[batch_size].rows + by_batch[batch_size].alone_rows)
        details[f"{drafter_name} -> {target_name} (T={temperature:g})"] = by_batch[sizes[0]]
    return rows, details


def best_gamma_rows(rows: list[dict]) -> list[dict]:
    """The compact view: each operating point at its best gamma, in rank order."""
    return [r for r in rows if r["is_best_gamma"]]


def _plot_rows(rows: list[dict], divergences: list[str]) -> list[dict]:
    """MD's best-gamma rows with the plain-SD point repeated under each divergence (its budget-0 end)."""
    out = []
    for r in filter(md_row, best_gamma_rows(rows)):
        out += [dict(r, divergence=d) for d in divergences] if r["divergence"] == PLAIN_SD else [r]
    return out


def frontiers(cfg: RankConfig, pc, temperature: float, rows: list[dict]) -> dict[tuple, object]:
    """Each pair's frontier at ``temperature`` and every divergence (``mdboost.ranking.frontier``):
    the rules' and heuristics' points against MD's curve on the pair's first
    ``ranking.frontier_rows`` cached positions, speedups at the gamma of the pair's best row there
    and its drafter's cost ratio. Keyed ``(drafter, target, temperature, divergence)``."""
    out = {}
    if not cfg.ranking.frontier_rows:
        return out
    for drafter, target in select_pairs(pc, cfg.pool.pairs):
        mine = [r for r in rows if (r["drafter"], r["target"]) == (drafter, target)
                and float(r["temperature"]) == temperature and r["rule"] != ALONE]
        if not mine:
            continue
        gamma = int(min(mine, key=lambda r: float(r["rank"]))["gamma"])
        for divergence, front in _cost_free_frontiers(cfg, pc, drafter, target, temperature).items():
            out[(drafter, target, temperature, divergence)] = priced(front, gamma, pc.cost_ratio(drafter))
    return out


def _cost_free_frontiers(cfg: RankConfig, pc, drafter: str, target: str, temperature: float) -> dict:
    """``{divergence: Frontier}`` of a pair without speeds (empty: no drafted position), kept in
    the cache's work store (:mod:`mdboost.cache.scores`) under the content it comes from."""
    rows, divergences = cfg.ranking.frontier_rows, tuple(cfg.md.divergences)

    def make() -> dict:
        p, q, _ = cached_positions(pc, drafter, target, temperature, rows)
        return {d: frontier(p, q, d) for d in divergences} if p.shape[0] else {}

    source = pc.acceptance if pc.acceptance is not None else pc  # the rows cached_positions reads
    key = work_key("frontier", folders=folder_names(source, (drafter, target)), members=[drafter, target],
                   temperature=float(temperature), rows=int(rows), divergences=divergences, vocab_size=pc.vocab_size)
    return WorkStore.beside(pc.caches[target].out_dir).get(key, make)


def frontier_table(fronts: dict) -> list[dict]:
    """Every frontier point as a row (``frontier.csv``), its pair, temperature and divergence first."""
    return [{"drafter": d, "target": t, "temperature": temp, "divergence": div, **row}
            for (d, t, temp, div), fr in fronts.items() for row in fr.rows()]


def frontier_summary(fronts: dict) -> list[dict]:
    """Per (pair, temperature, divergence, heuristic, drafting): its best acceptance and the largest
    optimality gap to MD at equal per-position divergence (the HTML report's frontier table)."""
    out = {}
    for (d, t, temp, div), fr in fronts.items():
        for pt in fr.points:
            key = (d, t, temp, div, pt.rule, pt.drafting)
            row = out.setdefault(key, {"drafter": d, "target": t, "temperature": temp, "divergence": div,
                                       "rule": pt.rule, "drafting": pt.drafting, "points": 0,
                                       "best_acceptance": 0.0, "max_gap": 0.0, "max_gap_at_max": 0.0})
            row["points"] += 1
            row["best_acceptance"] = max(row["best_acceptance"], pt.acceptance)
            row["max_gap"] = max(row["max_gap"], pt.gap)
            row["max_gap_at_max"] = max(row["max_gap_at_max"], pt.gap_at_max)
    return list(out.values())


def write_outputs(cfg: RankConfig, rows: list[dict], details: dict, out: Path, fronts: dict | None = None,
                  rec=None, all_rows: list[dict] | None = None) -> tuple[dict[str, Path], dict[str, str]]:
    """CSV, HTML, plots and the resolved config into ``out`` (all atomic); with ``fronts``, the
    frontier's CSV, its table in the HTML and the recommendation's pair's frontier plots.

    ``rows``: the first batch size's (the HTML table and the plots); ``all_rows``: every batch
    size's (``ranking.csv``; default ``rows``). Returns the paths and ``summary.json``'s digests
    (``ranking_csv_sha256``), taken of the bytes written, never read back from disk (where
    another process could have put other bytes meanwhile)."""
    csv_data = report.csv_bytes(rows if all_rows is None else all_rows)
    digests = {"ranking_csv_sha256": hashlib.sha256(csv_data).hexdigest()}
    compact = best_gamma_rows(rows)
    plot_rows = _plot_rows(rows, list(cfg.md.divergences))
    fronts = fronts or {}
    sections = [("Frontier: each heuristic's best acceptance and its largest optimality gap to MD at equal "
                 "per-position divergence (frontier.csv has every point)", frontier_summary(fronts))] if fronts else []
    paths = {
        "csv": atomic_write_bytes(out / "ranking.csv", csv_data),
        "html_full": report.write_html(compact, out / "ranking_full.html",
                                       title=f"mdboost pool ranking: {cfg.name}, every point", sections=sections),
        "config": report.atomic_write_text(out / "config.resolved.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False)),
        "acceptance_vs_budget": plots.plot_acceptance_vs_budget(plot_rows, out / "plots" / "acceptance_vs_budget.png"),
        "k_vs_acceptance": plots.plot_k_vs_acceptance(plot_rows, out / "plots" / "k_vs_acceptance.png"),
        "speedup_by_drafter": plots.plot_speedup_by_drafter(_speedup_rows(compact),
                                                            out / "plots" / "speedup_by_drafter.png"),
    }
    bounds = {}
    for name, score in details.items():
        bounds[name] = score.rows[0].get("margin_bound_0", 1.0)
    paths["margin_cdf"] = plots.plot_margin_cdf({n: s.margins for n, s in details.items()}, bounds,
                                                out / "plots" / "margin_cdf.png")
    if fronts:
        paths["frontier_csv"] = report.write_csv(frontier_table(fronts), out / "frontier.csv")
        for (d, t, temp, div), fr in fronts.items():
            if rec is not None and (d, t, temp) == (rec.drafter, rec.target, float(rec.temperature)):
                paths[f"frontier_{div}"] = plots.plot_frontier(
                    fr, out / "plots" / f"frontier_{div}.png", title=f"{d} -> {t}, T={temp:g}, {div}")
    return paths, digests


def _speedup_rows(compact: list[dict]) -> list[dict]:
    """The speculative points the speedup plot compares, in rank order: those whose quality is
    within the tolerance (all when none is)."""
    speculative = [r for r in compact if r.get("rule") != ALONE]
    return [r for r in speculative if report.csv_bool(r.get("quality_ok"))] or speculative


_REPORT_PLOTS = {"speedup_by_drafter": "Predicted speedup per drafter (its best point at each temperature)",
                 "acceptance_vs_budget": "Acceptance against the divergence budget",
                 "k_vs_acceptance": "Boosting coefficient k against acceptance",
                 "margin_cdf": "Boosting margins"}


def write_page(cfg: RankConfig, summary: dict, verdict: str, costs: str, compact: list[dict], paths: dict,
               out: Path) -> Path:
    """``ranking.html`` (:mod:`mdboost.ranking.page`): ``verdict`` (the recommendation's answer),
    the summary's reason and snippet, ``costs`` (where they were measured, what the pick depends
    on), the points at their best gamma ``compact`` and the plots of ``paths``."""
    headings = {**_REPORT_PLOTS, **{k: f"Frontier of the recommendation's pair: {k.split('_', 1)[1]}"
                                    for k in paths if k.startswith("frontier_") and k != "frontier_csv"}}
    shown = {heading: paths[key].relative_to(out).as_posix() for key, heading in headings.items() if key in paths}
    notes = [f"Measured on a busy machine: {'; '.join(summary['loaded_costs'])}"] if summary.get("loaded_costs") else []
    return page.write_report(out / "ranking.html", title=f"mdboost ranking: {cfg.name}", verdict=verdict,
                             reason=summary.get("verdict_reason"), costs=costs, snippet=summary["engine_snippet"],
                             rows=compact, top=cfg.ranking.top, n_points=len(compact), plots=shown,
                             full_table="ranking_full.html", notes=notes)


def ranked_device(cfg: RankConfig) -> str:
    """The device the ranking runs on (``pool.device``, or the one the pool resolves it to: CUDA when
    present): its snippets run there, since its speeds were measured there."""
    return str(resolve_device(cfg.pool.device))


def ranked_home(cfg: RankConfig) -> str | None:
    """The mdboost home the ranking's models and translators live in, as an absolute path, when
    the config names one (``pool.home``, relative to the working directory); None: the default
    (``MDBOOST_HOME``, else ``~/.cache/mdboost``) of whoever runs a snippet."""
    return None if cfg.pool.home is None else str(mdboost_home(cfg.pool.home))


def engine_snippet(rec: Recommendation, cfg: RankConfig) -> str:
    """Python that runs the recommended point with mdboost's engine (plain decoding if none wins):
    :func:`mdboost.export.mdboost_snippet`, the one ``mdboost export --format mdboost`` prints,
    on the device and home the ranking ran with and its unfiltered sampling; with
    ``speed.engine: llamacpp``, the same loop on llama.cpp (:func:`mdboost.export.llamacpp_snippet`)
    when a drafter wins, else the ``llama-server`` command of the target alone."""
    if cfg.speed.engine == "llamacpp":  # mdboost's loop on llama.cpp; plain decoding: llama.cpp's own server
        on_llamacpp = llamacpp_snippet(rec.to_dict(), UNFILTERED, "llamacpp")
        return on_llamacpp or llamacpp_command(rec.to_dict(), UNFILTERED, ranked_home(cfg))
    return mdboost_snippet(rec.to_dict(), UNFILTERED, ranked_device(cfg), ranked_home(cfg))


def _flat_params(cfg: RankConfig) -> dict[str, str]:
    flat = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            flat[prefix] = str(value)[:500]

    walk("", to_dict(cfg))
    return flat


def _child_runs(rows: list[dict], pool_target: str) -> list:
    """One :class:`~mdboost.tracking.runs.ChildRun` per operating point at its best gamma, in rank order."""
    children = []
    for row in best_gamma_rows(rows):
        target = None if row["target"] == pool_target else row["target"]
        name = point_name(row["drafter"], row["divergence"], row["max_divergence"], row["gamma"], row["temperature"],
                          target=target)
        name += rule_label(row)
        params = {k: row[k] for k in ("drafter", "target", "temperature", "divergence", "max_divergence", "gamma",
                                      "acceptance_source", "process_text", "rule", "drafting", "draft_p_min", "engines")
                  if k in row}
        children.append(ChildRun(name, params, ordered_metrics(row), {"rank": str(row["rank"])}))
    return children


def _table(rows: list[dict]) -> dict[str, list]:
    """The ranking as columns (``ranking.csv``'s, in its order) for ``mlflow.log_table``."""
    return {c: [r.get(c) for r in rows] for c in report.columns_of(rows)}


def log_mlflow(cfg: RankConfig, rows: list[dict], paths: dict[str, Path], summary: dict,
               all_rows: list[dict] | None = None, started_at: float | None = None) -> str:
    """One parent run (config, summary, recommendation, artifacts, dataset) and a nested run per
    pair, temperature and operating point at its best gamma (every gamma is in ``ranking.csv``).

    The parent's description (tag ``mlflow.note.content``) is the recommendation and the
    ranking's summary in markdown (:func:`mdboost.tracking.notes.ranking_note`); its fields are
    params ``recommendation.*`` and metrics ``recommendation_*``; the ranking is the table
    artifact ``ranking_table.json`` (``mlflow.log_table``, one row per ``ranking.csv`` row); the
    cached records are its dataset input (:func:`mdboost.tracking.datasets.log_records`). The
    parent starts at ``started_at`` (when the job began, seconds since the epoch; default: now),
    so its Duration is the job's (:func:`mdboost.tracking.runs.parent_run`). Nested runs (:func:`mdboost.tracking.runs.log_children`) are named by their point
    (``tuned:12 kl 0.05 g4 T0.7``), listed best first, and carry the CSV's identifying columns
    as params and its numeric columns as metrics (booleans as 0/1, non-finite values left out),
    under the same names, the key figures first (:data:`mdboost.tracking.runs.KEY_METRICS`).
    """
    import mlflow  # deferred: mlflow: seconds to import; only a tracked run needs it
    from mlflow.tracking import MlflowClient

    experiment_id = setup(cfg.tracking.experiment, cfg.tracking.tracking_uri, cfg.tracking.artifact_root)
    client = MlflowClient(cfg.tracking.tracking_uri)
    rec = summary["recommendation"]
    with parent_run(client, experiment_id, f"rank:{cfg.name}", time.time() if started_at is None else started_at) as parent:
        mlflow.log_metrics(ordered_metrics({f"recommendation_{k}": rec[k] for k in
                                            ("predicted_speedup", "predicted_speedup_lo", "predicted_speedup_hi",
                                             "beats_plain_decoding")}))
        mlflow.log_metrics(ordered_metrics(summary))
        mlflow.log_params(_flat_params(cfg))
        mlflow.set_tags({"mdboost.pipeline": "rank_pool", "cache_dir": str(summary.get("cache_dir", "")),
                         "acceptance_source": cfg.cache.acceptance_source,
                         "cost_profile": str(summary["cost_profile"]), "hardware": hardware_label(summary["hardware"]),
                         "mlflow.note.content": summary["recommendation_markdown"]})
        mlflow.log_params({f"recommendation.{k}": str(v) for k, v in rec.items()})
        text = cfg.data.text_source()
        log_records(text.load(), text, text.split, context="ranking")
        for path in paths.values():
            mlflow.log_artifact(str(path), artifact_path="plots" if path.suffix == ".png" else None)
        mlflow.log_table(_table(rows if all_rows is None else all_rows), "ranking_table.json")
        log_children(client, experiment_id, parent.info.run_id, _child_runs(rows, cfg.pool.target),
                     progress=lambda it: _progress(it, cfg.progress, desc="mlflow runs", unit="run"))
        return parent.info.run_id


def log_summary_file(cfg: RankConfig, run_id: str, path: Path) -> None:
    """``summary.json`` (written once the run id and the total time are known) onto the parent run."""
    from mlflow.tracking import MlflowClient  # deferred: mlflow: seconds to import; only a tracked run needs it

    MlflowClient(cfg.tracking.tracking_uri).log_artifact(run_id, str(path))


class _Opened(NamedTuple):
    """One temperature's opened pool cache (keyed by its ``spec``) and what building it did."""

    pc: PoolCache
    info: BuildInfo


def run(cfg: RankConfig, costs=None) -> dict:
    """Run the whole pipeline for a validated config; returns a summary dict. With ``cache.backend:
    dask`` it runs on the Dask cluster of ``cache.scheduler`` (a ``local`` one is closed at the end).

    ``costs``: cost profile files (:mod:`mdboost.cache.profile`; one per decoding mode ranked,
    greedy or sampled) whose costs replace this machine's speed file: the finished caches are
    re-scored, nothing is built or measured (:func:`mdboost.cache.pool_cache.open_cached`)."""
    with cfg.cache.cluster():
        return _run(cfg, None if costs is None else [read_profile(path) for path in costs])


def _profile_for(profiles: list, spec):
    """The profile among ``profiles`` for ``spec``'s decoding mode (a single one is checked as it is)."""
    if len(profiles) == 1:
        return profiles[0]
    mine = [p for p in profiles if (p.pool or {}).get("sampling") == sampling_of(spec)]
    if len(mine) != 1:
        raise ValueError(f"costs must hold one cost profile of {sampling_of(spec)} decoding (T={spec.temperature:g}), "
                         f"got {len(mine)} among {[str(p.path) for p in profiles]}")
    return mine[0]


def _open(cfg: RankConfig, temperature: float, profiles: list | None, stages: dict) -> tuple[PoolCache, BuildInfo]:
    """One temperature's caches: opened or built with this machine's costs, or opened with a profile's;
    the seconds of each step are added to ``stages``."""
    spec = cfg.cache_spec(temperature)
    if profiles is None:
        pc, cache_info = open_or_build_cache(spec, progress=cfg.progress)  # costs: once per pool
    else:
        pc, cache_info = open_cached(spec, _profile_for(profiles, spec))
    if cache_info.repaired:
        print(f"mdboost rank: cache: damaged files of {', '.join(cache_info.repaired)} were rebuilt "
              f"(the intact ones kept)", file=sys.stderr)
    add_seconds(stages, cache_info.seconds)
    if cfg.cache.mentored_text:  # prompt lookup's points with a budget, on the text their rule emits
        lossy = ("mentored",) + (("threshold",) if any(r.rule == "threshold" for r in cfg.md.rules) else ())
        with timed(stages, "mentored text"):
            pc = attach_mentored(pc.spec, pc, cfg.md.divergences, cfg.md.budgets, cfg.speed.gamma_max, rules=lossy,
                                 progress=cfg.progress, sample=profiles is None)
    return pc, cache_info


def cost_fields(pc: PoolCache, profiles: list | None) -> dict:
    """``summary.json``'s ``cost_profile`` (the profile files given, None for this machine's speed
    file), ``hardware`` (the fingerprint of the machine the costs were measured on) and
    ``loaded_costs`` (the figures measured on a busy machine: :func:`mdboost.cache.profile.loaded_measurements`)."""
    paths = None if profiles is None else [str(p.path) for p in profiles]
    drafters = [m for m in pc.names if m != pc.target]
    return {"cost_profile": paths[0] if paths and len(paths) == 1 else paths,
            "hardware": None if pc.speed is None else pc.speed.hardware,
            "loaded_costs": [] if pc.speed is None else loaded_measurements(pc.speed, drafters)}


class _Ranked(NamedTuple):
    """What scoring every temperature gave: the rows (headline batch size, and all), the
    recommendations, and what the summary reports of the caches and the time taken."""

    rows: list[dict]
    all_rows: list[dict]
    details: dict
    fronts: dict
    rec: Recommendation
    by_batch: dict
    opened: list
    seconds: tuple[float, float]  # (cache, scoring)
    stages: dict  # seconds per stage (stage_line), in the order they first ran


def _rank(cfg: RankConfig, profiles: list | None) -> _Ranked:
    rows, details, t_cache, t_score, opened, fronts, stages = [], {}, 0.0, 0.0, [], {}, {}
    for temperature in cfg.md.sampling_temperatures:
        t0 = time.perf_counter()
        pc, cache_info = _open(cfg, temperature, profiles, stages)
        t1 = time.perf_counter()
        with timed(stages, "scoring"):
            more, more_details = score_all(cfg, pc, temperature)
        first = at_batch_size(more, cfg.speed.batch_sizes[0])
        with timed(stages, "frontier"):
            fronts.update(frontiers(cfg, pc, temperature, rank_rows(first, cfg.ranking.nll_tolerance)))
        t_cache, t_score = t_cache + t1 - t0, t_score + time.perf_counter() - t1
        rows += more
        details.update(more_details)
        opened.append(_Opened(pc, cache_info))
    all_rows = rank_rows(rows, cfg.ranking.nll_tolerance)
    rows = at_batch_size(all_rows, cfg.speed.batch_sizes[0])  # the headline: the first batch size
    by_batch = {b: recommend(at_batch_size(all_rows, b)) for b in cfg.speed.batch_sizes}
    return _Ranked(rows, all_rows, details, fronts, recommend(rows), by_batch, opened, (t_cache, t_score), stages)


def _run(cfg: RankConfig, profiles: list | None = None) -> dict:
    start = time.perf_counter()
    check_output_folder(cfg.output_dir, OUTPUT_FILES)  # before the work: a folder it may not replace
    ranked = _rank(cfg, profiles)
    out = Path(cfg.output_dir)
    # every file into a fresh folder that replaces output_dir whole at the end (docs/ranking.md,
    # "Outputs"): a run that fails or is killed leaves the previous run's outputs, and two runs
    # on one folder leave the last one's, never a summary beside another run's ranking.csv
    with output_folder(out, OUTPUT_FILES) as tmp:
        summary = _write_all(cfg, ranked, profiles, start, tmp)
    summary["paths"] = {k: out / p.relative_to(tmp) for k, p in summary["paths"].items()}
    return summary


def _write_all(cfg: RankConfig, ranked: _Ranked, profiles: list | None, start: float, out: Path) -> dict:
    """Write the outputs and the summary into the run's folder ``out``, logging them when tracked."""
    rows, all_rows, details, rec, by_batch, opened = (ranked.rows, ranked.all_rows, ranked.details, ranked.rec,
                                                      ranked.by_batch, ranked.opened)
    (t_cache, t_score), bootstrap = ranked.seconds, next(iter(details.values())).bootstrap
    stages = dict(ranked.stages)
    with timed(stages, "outputs"):
        paths, digests = write_outputs(cfg, rows, details, out, ranked.fronts, rec, all_rows)
    compact = best_gamma_rows(rows)  # every point at its best gamma, in rank order
    snippet = engine_snippet(rec, cfg)
    pc, cache_info = opened[0]
    summary = {"n_pairs": len({(r["drafter"], r["target"]) for r in rows}), "n_rows": len(all_rows),
               "n_points": len(compact), "seconds_cache": t_cache, "seconds_scoring": t_score,
               "seconds_per_pair": t_score / max(len(details), 1), "cache_dir": cache_info.dir,
               "cache_reused": all(o.info.reused for o in opened),
               "cache_repaired": sorted({m for o in opened for m in o.info.repaired}),
               "cache_fingerprint": ([o.pc.spec.fingerprint() for o in opened] if len(opened) > 1
                                     else pc.spec.fingerprint()),
               "acceptance_source": cfg.cache.acceptance_source,
               "sampled_continuations": sum(o.info.sampled_continuations for o in opened),
               "measured_speed_profile": any(o.info.measured_speed_profile for o in opened),
               "sampling": {"temperatures": cfg.md.sampling_temperatures, **UNFILTERED},
               "md_solve": cfg.speed.md_solve, "speed_engine": cfg.speed.engine, "bootstrap": bootstrap,
               "device": ranked_device(cfg),
               "home": ranked_home(cfg),
               "recommendation": rec.to_dict(), "verdict": rec.verdict(), "engine_snippet": snippet,
               "recommendations": recommend_engines(rows),
               "batch_sizes": list(cfg.speed.batch_sizes),
               "recommendations_by_batch_size": {str(b): r.to_dict() for b, r in by_batch.items()},
               "plain_wins_from_batch_size": plain_wins_from({b: r.predicted_speedup for b, r in by_batch.items()}),
               "data": sample_summary(pc.spec.text.load(), pc.spec.text),  # the records the cache holds
               **digests}
    sampled = [o for o in opened if o.pc.spec.temperature > 0] or opened  # greedy has its own profile, no MD
    pc = sampled[0].pc
    summary.update(cost_fields(pc, profiles))
    # what the pick depends on: each drafter's break-even cost at the headline batch size
    even = break_even_costs(rows, rec.predicted_speedup if rec.beats_plain_decoding else None)
    summary["hardware_dependence"] = hardware_line(even, rec.drafter if rec.beats_plain_decoding else None)
    summary["break_even_costs"] = {d: {k: "any" if isinstance(v, float) and math.isinf(v) else v for k, v in e.items()}
                                   for d, e in even.items()}  # strict JSON: "any" for an infinite break-even
    point = find_row(rec.to_dict(), compact)  # the pick, or the best speculative point
    summary["verdict_reason"] = None if point is None else reason_line(point)
    measured = "; ".join(x for x in (costs_line(summary["hardware"], summary["cost_profile"]),
                                     summary["hardware_dependence"]) if x)  # where, and what the pick depends on
    costs = "; ".join(x for x in (summary["verdict_reason"] and f"why: {summary['verdict_reason']}", measured) if x)
    summary["verdict"] = costed_verdict(rec, costs)
    summary["recommendation_markdown"] = ranking_note(
        rec, compact, bootstrap=bootstrap, snippet=snippet, n_pairs=summary["n_pairs"],
        n_rows=len(all_rows), by_batch=by_batch, nll_tolerance=cfg.ranking.nll_tolerance, top=cfg.ranking.top,
        cache=f"Cache: `{cache_info.dir}` ({'reused' if summary['cache_reused'] else 'built'}).", costs=costs)
    profile = pc.speed_profile_info(cfg.pool.target)
    if profile is not None:  # the speed model's inputs (docs/ranking.md, "Speed model")
        summary["verify_cost"] = profile["verify_cost"]
        summary.update({f"md_overhead_{k}": v for k, v in (profile["md_overhead"] or {}).items()})
        summary["prefill_per_token"] = profile["prefill_per_token"]
        summary["speed_file"] = str(pc.speed.path)
    with timed(stages, "outputs"):
        paths["html"] = write_page(cfg, summary, rec.verdict(), measured, compact, paths, out)
    if cfg.tracking.enabled:
        with timed(stages, "mlflow"):
            summary["run_id"] = log_mlflow(cfg, rows, paths, summary, all_rows,
                                           started_at=time.time() - (time.perf_counter() - start))
    summary["seconds_total"] = time.perf_counter() - start
    summary["seconds_by_stage"] = stages
    summary_path = report.atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, default=str))
    if "run_id" in summary:
        log_summary_file(cfg, summary["run_id"], summary_path)
    summary["rows"], summary["all_rows"], summary["paths"] = rows, all_rows, paths
    return summary


def main(config: str | RankConfig, overrides=(), costs=None) -> int:
    """CLI entry point: ``mdboost rank --config <yaml> [--set key.path=value ...] [--costs profile.json ...]``;
    returns the exit status. ``config``: the YAML file (read with ``overrides``), or the
    :class:`RankConfig` loaded from it (:func:`pipelines.commands.rank`, the command's entry).

    A bad config raises its ValueError (``config error ...``), reported by :func:`mdboost.cli.main`
    as one line (exit 2, the traceback with ``--debug``).
    """
    cfg = config if isinstance(config, RankConfig) else load_yaml(config, RankConfig, overrides)
    if not cfg.progress:
        quiet_libraries()
    summary = run(cfg, costs)
    if cfg.cache.acceptance_source == "reference":
        print("mdboost rank: warning: cache.acceptance_source is 'reference': acceptance is read on the reference "
              "text, not on text the target samples (the process takes each position's expected acceptance and "
              "credits prompt lookup only for its own proposals); rank on 'sampled' for predictions to act on "
              "(docs/ranking.md, \"Draft-start process\")", file=sys.stderr)
    if summary["loaded_costs"]:
        print(f"mdboost rank: warning: costs measured on a busy machine (the load average above the core count "
              f"biases every ratio): {'; '.join(summary['loaded_costs'])}; measure them again on a quiet machine "
              f"(delete {summary.get('speed_file')}, then rank or profile)", file=sys.stderr)
    print(f"\nTop points at their best gamma, batch size {summary['batch_sizes'][0]} ({summary['n_pairs']} pairs, "
          f"{summary['n_points']} operating points, "
          f"{summary['n_rows']} rows with every gamma and batch size; rule: predicted speedup among points with NLL <= target + "
          f"{cfg.ranking.nll_tolerance:g} nats; {summary['bootstrap']['level']:.0%} intervals over "
          f"{summary['bootstrap']['prompts']} prompts):")
    print(report.format_table(best_gamma_rows(summary["rows"]), cfg.ranking.top))
    print(f"\nranking: {summary['paths']['csv']}  cache: {summary['cache_dir']} "
          f"({'reused' if summary['cache_reused'] else 'built'})  time: {summary['seconds_total']:.1f}s"
          + (f"  mlflow run: {summary['run_id']} in {cfg.tracking.tracking_uri}" if "run_id" in summary else ""))
    print(stage_line(summary["seconds_by_stage"], summary["seconds_total"]))
    print("\nper engine (the rows each can run, docs/ranking.md \"Rules and engines\"):")
    for engine, entry in summary["recommendations"].items():
        rec = entry["recommendation"]
        print(f"  {engine}: {entry['reason'] if rec is None else rec['verdict']}")
    if len(summary["batch_sizes"]) > 1:
        print("\nper batch size (sequences per engine batch, docs/ranking.md \"Batch sizes\"):")
        by_batch = {int(b): Recommendation(**r) for b, r in summary["recommendations_by_batch_size"].items()}
        for line in batch_lines(by_batch):
            print(f"  {line}")
    where = "mdboost's loop on llama.cpp" if cfg.speed.engine == "llamacpp" else "mdboost's engine"
    if cfg.speed.engine == "llamacpp" and not summary["recommendation"]["beats_plain_decoding"]:
        where = "llama.cpp alone"
    print(f"\n{summary['verdict']}\nrun it with {where}:\n{summary['engine_snippet']}")
    return 0
