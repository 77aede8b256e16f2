"""The schema of ``mdboost validate``'s YAML: :class:`ValidateConfig` and its own sections.

It follows the conventions of :mod:`pipelines.config` (nested dataclasses with defaults, built by
the strict loader of :mod:`pipelines.loader`) and shares its :class:`~pipelines.config.TrackingConfig`;
the ranking it validates is read from that ranking's own resolved :class:`~pipelines.config.RankConfig`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from mdboost.md.options import SOLVE
from pipelines.config import TrackingConfig, _check_cluster, _check_output_dir, _cluster
from pipelines.loader import check as _check

LOCAL_WORKERS = 2  # worker processes of generation.scheduler: local without generation.n_workers


@dataclass
class SourceConfig:
    """Which ranking, and how many of its cells to validate.

    ``ranking_dir``: a folder holding ``ranking.csv`` and ``config.resolved.yaml`` (and the
    ranking's ``summary.json`` when it has one), or ``ranking_run_id``: an MLflow parent run
    holding them as artifacts. ``cells``: further cells validated after the recommendation's,
    spread over temperatures, SD / MD, drafters, gammas and budgets
    (:func:`mdboost.validation.cells.select_cells`).
    """

    ranking_dir: str | None = None
    ranking_run_id: str | None = None
    cells: int = 12

    def __post_init__(self):
        if (self.ranking_dir is None) == (self.ranking_run_id is None):
            raise ValueError(f"set exactly one of ranking_dir / ranking_run_id, got {self.ranking_dir!r}, {self.ranking_run_id!r}")
        if self.cells < 0:
            raise ValueError(f"cells must be >= 0, got {self.cells!r}")


@dataclass
class GenerationConfig:
    """Generation settings of the validation runs; ``prompts`` held-out prompts per cell, from
    the ``first_prompt``-th held-out record on (another ``first_prompt`` validates on other prompts).

    Sampling settings come from the ranking (each cell runs at its row's temperature, with the
    ranking's ``top_k`` / ``top_p``); ``null`` (the default) takes them. A value set here must
    agree with the ranking (:func:`mdboost.validation.cells.resolve_sampling`), else the run is
    refused: ``temperature`` must be one the ranking predicted for (only its cells are then
    validated), ``top_k`` / ``top_p`` must equal the ranking's. Likewise ``md_solve`` (the
    engine's argument in MD runs) must equal the one the ranking's speed model assumed.

    ``passes`` runs the whole interleaved sequence that many times with the same seeds (the same
    tokens), so the realized speedups' timing noise is measured, not assumed: their spread over
    the passes widens the speedup intervals (:func:`mdboost.validation.calibration.timing_noise`;
    ``docs/validation.md``, "Predictive intervals"). 1 leaves it out and takes half the time.

    ``scheduler`` (``docs/scale_out.md``): null runs the cells here, one after another, the
    cells of a target and temperature sharing one AR run; ``local`` (a Dask ``LocalCluster`` of
    ``n_workers`` processes for the run, default :data:`LOCAL_WORKERS`) or a scheduler address
    runs one cell per task, each with its own AR run on its worker (timings mean something only
    with one device per worker). ``n_workers`` sizes a local cluster only: set with any other
    ``scheduler`` (null, or an address, whose cluster has its own workers) it is refused rather
    than ignored.
    """

    prompts: int = 4
    first_prompt: int = 0
    max_new_tokens: int = 64
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    passes: int = 2
    md_solve: Literal[SOLVE] | None = None
    scheduler: str | None = None
    n_workers: int | None = None

    def __post_init__(self):
        if self.scheduler is not None:
            _check_cluster("generation.scheduler", self.scheduler)
        if self.n_workers is not None:
            _check(self.scheduler == "local", f"generation.n_workers (sizes a local cluster: set it only with "
                                              f"generation.scheduler: local, got scheduler {self.scheduler!r})",
                   self.n_workers)
            _check(self.n_workers >= 1, "generation.n_workers (>= 1)", self.n_workers)
        if self.prompts < 1 or self.max_new_tokens < 2:
            raise ValueError(f"need prompts >= 1 and max_new_tokens >= 2, got {self.prompts!r}, {self.max_new_tokens!r}")
        _check(self.passes >= 1, "generation.passes (>= 1; 2 or more measure the timing noise)", self.passes)
        if self.first_prompt < 0:
            raise ValueError(f"first_prompt must be >= 0 (held-out prompts skipped), got {self.first_prompt!r}")
        if self.temperature is not None and not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be finite and >= 0, or null, got {self.temperature!r}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or null, got {self.top_k!r}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] or null, got {self.top_p!r}")

    def cluster(self):
        """The validation's Dask client (:func:`mdboost.cluster.dask_client`), or a context yielding
        None without a ``scheduler``."""
        return _cluster(self.scheduler, LOCAL_WORKERS if self.n_workers is None else self.n_workers)


@dataclass
class HumanEvalConfig:
    """HumanEval pass@1 of AR vs MD completions (held-out tasks); off when ``tasks: 0``."""

    tasks: int = 4
    max_new_tokens: int = 128
    timeout: float = 10.0

    def __post_init__(self):  # checked when the config is loaded, not after the generation grid
        _check(self.tasks >= 0, "humaneval.tasks (>= 0; 0 turns HumanEval off)", self.tasks)
        _check(self.max_new_tokens >= 1, "humaneval.max_new_tokens (>= 1)", self.max_new_tokens)
        _check(math.isfinite(self.timeout) and self.timeout > 0, "humaneval.timeout (seconds, > 0)", self.timeout)


@dataclass
class ValidateConfig:
    """Everything ``mdboost validate`` needs (``pipelines/validate_pairs.py``)."""

    name: str = "default"
    output_dir: str = "outputs/validate"
    ranking: SourceConfig = field(default_factory=lambda: SourceConfig(ranking_dir="outputs/rank"))
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    humaneval: HumanEvalConfig = field(default_factory=HumanEvalConfig)
    tolerance: float = 0.03
    tracking: TrackingConfig = field(default_factory=lambda: TrackingConfig(experiment="mdboost-validate"))
    progress: bool = True

    def __post_init__(self):
        _check_output_dir(self.output_dir)
        _check(math.isfinite(self.tolerance) and self.tolerance >= 0, "tolerance (>= 0, the plot's band)",
               self.tolerance)
        self.tracking.check_store("tracking")  # last: it imports mlflow (seconds), after every cheap check
