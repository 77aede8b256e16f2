"""Pipeline configuration: nested dataclasses with defaults (the YAML schema) and the wiring
from config sections to the library's own arguments.

The project keeps three layers of configuration: library functions and estimators take plain
keyword arguments or their own small frozen settings objects; the pipelines group them in the
dataclasses below (every field has a default, so an empty YAML file is a valid config); YAML
files in ``configs/`` only override those defaults. There is no global config object, and
nothing under ``mdboost/`` imports this module: :meth:`RankConfig.cache_spec`,
:meth:`RankConfig.score_settings` and :meth:`DataConfig.text_source` hand the library what it
takes: a section whose fields are a library object's is that object (:class:`DataConfig` is a
:class:`~mdboost.data.TextSource`), and the others' fields reach the library by name
(:func:`library_settings`), never copied one by one. Option lists are the library's own
(``Literal[SOLVE]`` is :data:`mdboost.md.verify.SOLVE`, divergence names are
:data:`mdboost.md.divergences.DIVERGENCES`, ...), so the loader and the library cannot disagree;
they live in the library's torch-free modules (:mod:`mdboost.md.options`,
:mod:`mdboost.cache.options`, :mod:`mdboost.ranking.options`, ...), so a config's cheap checks
run without torch, transformers or mlflow. The checks that need those (the pool's models, the md
rules, the tracking store: :meth:`PoolConfig.check_models`, :meth:`MDConfig.check_rules`,
:meth:`TrackingConfig.check_store`) run last, called by the top-level config once every
section's cheap checks passed, each error at its section's path (:func:`pipelines.loader.at`).

The strict loader (:mod:`pipelines.loader`: ``from_dict``, ``load_yaml``, ``to_dict``) builds
them: an unknown key raises ``ValueError`` naming the key and its dotted path, and every value
is type-checked against the annotation. ``mdboost rank``
reads :class:`RankConfig`, ``mdboost validate`` :class:`~pipelines.validate_config.ValidateConfig`
(its own sections in :mod:`pipelines.validate_config`); they share :class:`PoolConfig`,
:class:`DataConfig`, :class:`CacheConfig` and :class:`TrackingConfig`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from mdboost.cache.keys import ACCEPTANCE_SOURCES, ENGINES, FolderSettings, PoolCacheSpec
from mdboost.cache.options import DTYPE_NAMES, SOURCES, joblib_backends
from mdboost.cluster import check_scheduler, dask_client
from mdboost.data import _FORMATS as DATA_FORMATS
from mdboost.data import SAMPLES, SPLITS, TextSource
from mdboost.md.options import DEFAULT_MD_SOLVE, DIVERGENCES, DRAFTING, FLOOR_TOP_K, SOLVE
from mdboost.models.gguf_drafters import INSTALL, llama_cpp_available, llamacpp_cannot, llamacpp_model
from mdboost.models.specs import drafter_identity, parse_drafter, same_drafters
from mdboost.ranking.options import (BOOSTING_ORDERS, DEFAULT_LEVEL, DEFAULT_RESAMPLES, MD_MODES, PAIR_MODES, RULE_NAMES,
                                     TV_MENTORS)
from mdboost.tracking.store import check_tracking_uri, resolve_tracking_uri
from pipelines.loader import at as _at
from pipelines.loader import check as _check


# --------------------------------------------------------------------------- shared sections

@dataclass
class PoolConfig:
    """Which models: the target and the drafters (``mdboost.models.pool.build_pool``).

    ``target``: ``"smollm2-135m"`` (offline default), ``"tiny"`` (random tiny Llama), a hub
    name or a local path. ``drafters``: pool specs such as ``early_exit:12``, ``tuned:24``,
    ``int8``, ``ngram:3``, or other model names. ``pairs``: ``"target"`` ranks every drafter
    against the target; ``"all"`` ranks every ordered pair of members with equal vocabularies.

    Loading checks the specs' syntax and duplicates; what they name (the target and drafter
    models, a drafter's depth, the device) is checked by :meth:`check_models`, which the top-level
    config runs after the cheap checks of every section.
    """

    target: str = "smollm2-135m"
    drafters: list[str] = field(default_factory=lambda: [
        "early_exit:12", "early_exit:18", "early_exit:24", "early_exit:27",
        "tuned:12", "tuned:18", "tuned:24", "tuned:27", "int8", "ngram:3"])
    pairs: Literal[PAIR_MODES] = "target"
    device: str | None = None
    home: str | None = None

    def __post_init__(self):
        _check(bool(self.target), "target", self.target)
        _check(len(self.drafters) >= 1, "drafters (need at least one)", self.drafters)
        for i, spec in enumerate(self.drafters):  # the syntax (what a spec names: check_models)
            try:
                parse_drafter(spec)
            except ValueError as err:
                raise ValueError(f"invalid drafters[{i}]: {err}") from None
        same = same_drafters(self.drafters)  # one drafter twice would be ranked twice
        _check(not same, "drafters (duplicates: " + "; ".join(f"{a!r} and {b!r} are the same drafter, "
                                                              f"{drafter_identity(a)}" for a, b in same) + ")",
               self.drafters)

    def check_models(self, path: str = "pool") -> None:
        """The checks that look for models (the hub cache, a file, at most one quick question to
        the hub) and the device: the target and each drafter can be found and built (depth, the
        target itself, findable models, torch-free: :mod:`mdboost.models.sources`), then the device
        is this machine's (torch: seconds). Run by the top-level config after every cheap check;
        an error reads as the section's own (``config error at 'pool': invalid drafters[1]: ...``)."""
        # deferred: huggingface_hub (the model checks) and torch (the device); a cheap mistake needs neither
        from mdboost.models.sources import check_drafter, check_model_source

        with _at(path):
            try:
                check_model_source(self.target)
            except ValueError as err:
                raise ValueError(f"invalid target: {err}") from None
            for i, spec in enumerate(self.drafters):  # depth, the target itself, findable models
                try:
                    check_drafter(spec, self.target, self.home)
                except ValueError as err:
                    raise ValueError(f"invalid drafters[{i}]: {err}") from None
            if self.device is not None:  # a device this machine has (no model loads onto a missing GPU)
                from mdboost.models.loading import resolve_device  # deferred: torch, after the model checks

                try:
                    resolve_device(self.device)
                except ValueError as err:
                    raise ValueError(f"invalid device: {err}") from None


@dataclass(frozen=True)
class DataConfig(TextSource):
    """Which text (``mdboost.data.load_texts``): ``humaneval`` (bundled) or a local file.

    The fields are the library's :class:`~mdboost.data.TextSource` (its defaults), checked when
    the config is loaded. ``split``: ``cache`` by default, so the validation pipeline can use the
    ``heldout`` records that were never ranked on. ``limit``: records kept, a seeded random
    sample (``sample: random``, seeded by ``seed``; ``stratify: <field>`` keeps each value's
    share; ``sample: head`` keeps the first records instead); ``max_tokens``: tokens per sequence
    (prompt + reference, truncated).
    """

    split: Literal[SPLITS] = "cache"  # the loader's option list; its place and default are TextSource's
    sample: Literal[SAMPLES] = "random"

    def __post_init__(self):
        path = Path(self.source).expanduser()
        reads_as_file = path.suffix.lower() in DATA_FORMATS or self.source.startswith(("/", ".", "~"))
        _check(self.source == "humaneval" or not reads_as_file or path.is_file(), "source (no such data file)",
               self.source)
        _check(self.limit >= 1, "limit (>= 1)", self.limit)
        _check(self.max_tokens >= 2, "max_tokens (>= 2)", self.max_tokens)
        _check(0.0 <= self.heldout_fraction <= 1.0, "heldout_fraction (in [0, 1])", self.heldout_fraction)
        super().__post_init__()

    def text_source(self) -> TextSource:
        """The section as the library's own :class:`~mdboost.data.TextSource` (no pipeline class in
        a cache spec: its keys, equality and pickles are the library's)."""
        return TextSource(**dataclasses.asdict(self))


@dataclass
class CacheConfig:
    """The logit cache (``mdboost.cache.open_or_build_cache``) and the cost-ratio measurement.

    Each pool member gets its own cache folder ``<dir>/<fingerprint>``, the fingerprint covering
    the data section, the target, that member and the settings below (``n_jobs``/``backend``
    excluded), so an unchanged config reuses every folder, a new drafter builds only its own,
    and changing ``k`` or the data rebuilds all (finished shards are always skipped).
    ``source``: teacher-forced ``reference`` text or continuations ``sampled`` from the target.

    ``acceptance_source``: which cache the ranking's acceptance-side columns (acceptance, speedup,
    best gamma, ``k``/``eps``/``rho`` diagnostics) come from. ``reference``: the cache above.
    ``sampled``: a second per-member cache of continuations sampled from the target (same
    prompts, ``acceptance_max_new_tokens`` tokens, seeded by ``data.seed``, at each of ``md.temperatures``),
    the text MD actually decodes; the continuations are sampled once and shared by every member's
    folder; quality (NLL) and boosting stay on the cache above. ``cost_context`` and
    ``cost_repeats`` also set the target's speed-profile measurement (``mdboost.ranking.speed``).

    ``scheduler`` (only with ``backend: dask``, ``docs/scale_out.md``): ``local`` (the default
    there) starts a Dask ``LocalCluster`` of ``n_jobs`` worker processes for the run and closes
    it at the end; an address (``tcp://host:8786``) connects to a running scheduler, whose
    workers then build the shards (every worker must see ``dir`` at the same path).

    ``mentored_text`` (with ``acceptance_source: sampled``): every prompt-lookup drafter's points
    with a budget are predicted on continuations sampled by the point's own rule at that point (MD,
    or SGLang's lossy threshold when ``threshold`` is among ``md.rules``)
    (``mdboost.cache.mentored``, ``docs/ranking.md``), one more sampling pass per temperature.
    """

    dir: str = ".mdboost_cache/logits"
    k: int = 128
    dtype: Literal[DTYPE_NAMES] = "float16"
    full_logits: bool = False
    source: Literal[SOURCES] = "reference"
    max_new_tokens: int = 128
    acceptance_source: Literal[ACCEPTANCE_SOURCES] = "sampled"
    acceptance_max_new_tokens: int = 64
    shard_size: int = 8
    n_jobs: int = 1
    backend: str = "loky"
    scheduler: str | None = None
    cost_context: int = 128
    cost_repeats: int = 21
    mentored_text: bool = True

    def __post_init__(self):
        _check(self.k >= 1, "k (>= 1)", self.k)
        _check(self.shard_size >= 1, "shard_size (>= 1)", self.shard_size)
        _check(self.max_new_tokens >= 1, "max_new_tokens (>= 1)", self.max_new_tokens)
        _check(self.acceptance_max_new_tokens >= 1, "acceptance_max_new_tokens (>= 1)", self.acceptance_max_new_tokens)
        _check(self.n_jobs >= 1, "n_jobs (>= 1)", self.n_jobs)
        _check(self.backend in joblib_backends(), f"backend (one of {list(joblib_backends())})", self.backend)
        self._check_scheduler()
        _check(self.cost_repeats >= 1 and self.cost_context >= 1, "cost_repeats/cost_context (>= 1)",
               (self.cost_repeats, self.cost_context))

    def _check_scheduler(self) -> None:
        if self.backend != "dask":
            _check(self.scheduler is None, f"cache.scheduler (set only with cache.backend: dask, got backend "
                                           f"{self.backend!r})", self.scheduler)
            return
        _check_cluster("cache.scheduler", self.scheduler)
        _check(self.n_jobs >= 2, "cache.n_jobs (>= 2 with cache.backend: dask: the local cluster's workers, or the "
                                 "jobs for an address's; n_jobs 1 builds in this process)", self.n_jobs)

    @property
    def folders(self) -> FolderSettings:
        """The stored-value settings of the main folders (:class:`~mdboost.cache.keys.FolderSettings`)."""
        return library_settings(FolderSettings, self)

    def cluster(self):
        """The run's Dask client (:func:`mdboost.cluster.dask_client`) with ``backend: dask``, else a
        context that does nothing."""
        return _cluster((self.scheduler or "local") if self.backend == "dask" else None, self.n_jobs)


def _check_cluster(name: str, scheduler: str | None) -> None:
    """``scheduler`` is null, ``local`` or a scheduler address, and ``distributed`` is installed."""
    if scheduler is not None:
        try:
            check_scheduler(scheduler)
        except ValueError:
            _check(False, f"{name} ('local' or a scheduler address such as tcp://10.0.0.5:8786)", scheduler)
    _check(importlib.util.find_spec("distributed") is not None,
           f"{name} (a Dask cluster needs the 'distributed' package: pip install 'mdboost[dask]')", scheduler)


def _check_output_dir(output_dir: str) -> None:
    """``output_dir`` is a folder or can be made one (its nearest existing path is a folder):
    checked when the config is loaded, not when the outputs are written at the end of the run."""
    path = Path(output_dir).expanduser()
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    _check(existing is None or existing.is_dir(), f"output_dir (a folder; {str(existing)!r} is a file)", output_dir)


def _cluster(scheduler: str | None, n_workers: int):
    """:func:`mdboost.cluster.dask_client` of ``scheduler``, or a context yielding None for None."""
    return contextlib.nullcontext() if scheduler is None else dask_client(scheduler, n_workers)


@dataclass
class TrackingConfig:
    """MLflow store (``mdboost.tracking``); ``enabled: false`` skips logging entirely.

    ``tracking_uri``: MLflow's own precedence, resolved when the config is built (so the
    resolved config saved with a run names the store it went to): the value in the config,
    else ``$MLFLOW_TRACKING_URI``, else the project's ``sqlite:///mlruns/mlflow.db``
    (:func:`mdboost.tracking.store.resolve_tracking_uri`); that MLflow has a store for it is
    checked by :meth:`check_store`, which the top-level config runs after every cheap check.
    """

    enabled: bool = True
    experiment: str = "mdboost-rank"
    tracking_uri: str | None = None
    artifact_root: str = "mlruns/artifacts"

    def __post_init__(self):
        _check(self.tracking_uri is None or bool(self.tracking_uri), "tracking_uri (a URI, or null)",
               self.tracking_uri)
        self.tracking_uri = resolve_tracking_uri(self.tracking_uri)

    def check_store(self, path: str = "tracking") -> None:
        """With tracking on, MLflow has a tracking store for ``tracking_uri``'s scheme (the check
        imports mlflow: seconds). Run by the top-level config after every cheap check; an error
        reads as the section's own (``config error at 'tracking': invalid tracking.tracking_uri: ...``)."""
        if self.enabled:
            with _at(path):
                try:
                    check_tracking_uri(self.tracking_uri)
                except ValueError as err:
                    raise ValueError(f"invalid tracking.tracking_uri: {err}") from None


# --------------------------------------------------------------------------- ranking sections

@dataclass
class RuleEntry:
    """One verification rule ranked (``docs/ranking.md``, "Rules and engines"): ``rule`` names a
    :class:`mdboost.md.rules.Rule` (``mentored``, ``rejection``, ``block``: vLLM's block
    verification, ``threshold``: SGLang's, at the
    threshold each divergence and budget maps to; ``match``: llama.cpp's), ``drafting`` how its
    drafts are drawn (``sampled`` or ``greedy``; default: the rule's own), ``draft_p_min`` the
    draft probability floor of greedy drafting (llama.cpp's ``--spec-draft-p-min``; 0: none).

    An entry the ranking cannot score is refused by :meth:`MDConfig.check_rules` (which builds the
    rule objects: torch), at this entry's path."""

    rule: Literal[RULE_NAMES] = "mentored"
    drafting: Literal[DRAFTING] | None = None
    draft_p_min: float = 0.0

    def to_rule(self):
        """The library's rule object, a :class:`mdboost.md.rules.Rule` (the family
        :attr:`mdboost.ranking.ScoreSettings.rules` takes); a combination the ranking cannot score
        raises its ``ValueError``."""
        # deferred: the rules are torch code (seconds); a config's cheap checks run without them
        from mdboost.ranking.rule_points import RULES, rule_points

        cls = RULES[self.rule]
        drafting = {} if self.drafting is None else {"drafting": self.drafting}
        rule = cls(**drafting, draft_p_min=self.draft_p_min)
        rule_points([rule], ["kl"], [0.0])
        return rule


def _default_rules() -> list[RuleEntry]:
    """MD on sampled drafts (the rows of before), lossless SD with greedy and sampled drafts (vLLM's
    ``draft_sample_method``), vLLM's block verification on sampled drafts (on greedy ones it is SD's
    law), SGLang's thresholds and llama.cpp's match, both on greedy drafts, the match also with draft
    probability floors 0.25, 0.5 and 0.75 (llama.cpp's ``--spec-draft-p-min``: its default 0 and an
    even grid over the floors that stop drafting on the drafter's unconfident positions; left out
    when ``cache.k < 10``: a floor reads the drafter's 10 largest logits)."""
    return [RuleEntry("mentored", "sampled"), RuleEntry("rejection", "greedy"), RuleEntry("rejection", "sampled"),
            RuleEntry("block", "sampled"), RuleEntry("threshold", "greedy"), RuleEntry("match", "greedy"),
            *(RuleEntry("match", "greedy", floor) for floor in (0.25, 0.5, 0.75))]


@dataclass
class MDConfig:
    """Operating points: each divergence crossed with each budget (``max_divergence``), at each
    sampling temperature.

    ``temperatures``: the sampling temperatures to predict for (default ``[0.7, 1.0]``); a
    scalar ``temperature`` is accepted instead (give one of the two). Each temperature gets its
    own cache folders (its continuations are sampled at it) and its own rows.
    """

    divergences: list[Literal[DIVERGENCES]] = field(default_factory=lambda: ["kl", "tv", "hellinger"])
    budgets: list[float] = field(default_factory=lambda: [0.0, 0.05, 0.2, 1.0])
    mode: Literal[MD_MODES] = "exact"
    temperature: float | None = None
    temperatures: list[float] | None = None
    mentor: Literal[TV_MENTORS] = "clamp"  # what TV points emit (ScoreSettings.tv_mentor)
    rules: list[RuleEntry] = field(default_factory=_default_rules)

    def __post_init__(self):
        _check(len(self.divergences) >= 1, "divergences (need at least one)", self.divergences)
        _check(len(self.rules) >= 1, "rules (need at least one)", self.rules)
        _check(len(self.budgets) >= 1 and all(math.isfinite(b) and b >= 0 for b in self.budgets),
               "budgets (finite, >= 0)", self.budgets)
        if self.temperature is not None and self.temperatures is not None:
            raise ValueError(f"md: give temperature or temperatures, not both, got temperature={self.temperature!r}, "
                             f"temperatures={self.temperatures!r}")
        temps = self.sampling_temperatures
        _check(len(temps) >= 1 and all(math.isfinite(t) and t >= 0 for t in temps) and len(set(temps)) == len(temps),
               "temperatures (distinct, finite, >= 0; 0 is greedy decoding)", temps)

    def check_rules(self, path: str = "md") -> None:
        """The checks that build the rules' objects (:meth:`RuleEntry.to_rule`: torch, seconds):
        each entry can be scored (its error at its own path, ``config error at 'md.rules[1]': ...``),
        and no two entries are one rule. Run by the top-level config after every cheap check."""
        rules = []
        for i, entry in enumerate(self.rules):
            with _at(f"{path}.rules[{i}]"):
                rules.append(entry.to_rule())
        with _at(path):
            _check(len(set(rules)) == len(rules), "rules (duplicates)", [dataclasses.asdict(r) for r in self.rules])

    @property
    def sampling_temperatures(self) -> list[float]:
        """The temperatures to rank at, in the given order."""
        if self.temperatures is not None:
            return [float(t) for t in self.temperatures]
        if self.temperature is not None:
            return [float(self.temperature)]
        return [0.7, 1.0]


@dataclass
class SpeedConfig:
    """Speed model (``docs/theory.md``, "Speed model for ranking"; ``mdboost.ranking.speed``):
    draft lengths searched for the best gamma, where the engine solves MD (``md_solve``, the
    engine's argument of the same name; ``mdboost validate`` generates with it), and the batch
    sizes predicted for (``batch_sizes``: sequences per engine batch, each with its costs measured
    at that batch size; ``docs/theory.md``, "Batches"; default ``[1, 4]``, ``[1]`` with llama.cpp).

    ``engine``: whose forward passes the costs time (``docs/engine.md``, "llama.cpp"):
    ``mdboost`` (torch) or ``llamacpp`` (the same loop, llama.cpp doing the forward passes on the
    target's GGUF; drafters ``early_exit:N``, ``ngram:N`` or GGUF files; batch size 1; needs
    ``pip install 'mdboost[llamacpp]'``). The logit caches, so the acceptance, are the same."""

    gamma_min: int = 1
    gamma_max: int = 8
    md_solve: Literal[SOLVE] = DEFAULT_MD_SOLVE
    batch_sizes: list[int] | None = None
    engine: Literal[ENGINES] = "mdboost"

    def __post_init__(self):
        _check(1 <= self.gamma_min <= self.gamma_max, "gamma range (1 <= gamma_min <= gamma_max)",
               (self.gamma_min, self.gamma_max))
        if self.batch_sizes is None:
            self.batch_sizes = [1] if self.engine == "llamacpp" else [1, 4]
        _check(self.engine != "llamacpp" or self.batch_sizes == [1],
               "speed.batch_sizes (llama.cpp runs one sequence: [1] with speed.engine: llamacpp)", self.batch_sizes)
        if self.engine == "llamacpp" and not llama_cpp_available():
            raise ValueError(f"speed.engine: llamacpp needs llama-cpp-python, not installed here: {INSTALL}")
        sizes = self.batch_sizes
        _check(isinstance(sizes, list) and bool(sizes) and all(isinstance(b, int) and not isinstance(b, bool) and b >= 1
                                                                for b in sizes) and len(set(sizes)) == len(sizes),
               "speed.batch_sizes (distinct positive integers)", sizes)
        _check(1 in sizes, "speed.batch_sizes (must hold 1: the headline recommendation, the frontier and the "
               "nested runs are batch size 1's)", sizes)
        self.batch_sizes = sorted(sizes)


@dataclass
class BoostingConfig:
    """Pair boosting over cached logits: rounds, orders, and the margin thetas reported."""

    n_estimators: int = 2
    orders: list[Literal[BOOSTING_ORDERS]] = field(default_factory=lambda: ["target_first", "greedy"])
    thetas: list[float] = field(default_factory=lambda: [0.0, 0.1])

    def __post_init__(self):
        _check(self.n_estimators >= 2, "n_estimators (>= 2)", self.n_estimators)
        _check("target_first" in self.orders, "orders (must include 'target_first')", self.orders)
        _check(all(-1 <= t <= 1 for t in self.thetas), "thetas (in [-1, 1])", self.thetas)


@dataclass
class RuleConfig:
    """The ranking rule: quality tolerance (nats per token) over the target's NLL; the rows shown;
    the intervals: ``resamples`` bootstrap resamples of the prompts (0: no intervals) at
    ``level`` coverage, seeded by ``seed`` (``mdboost.ranking.uncertainty``); ``frontier_rows``:
    the cached positions per pair and temperature the frontier of the rules and heuristics is
    read on (``mdboost.ranking.frontier``; 0: no frontier)."""

    nll_tolerance: float = 0.05
    top: int = 12
    resamples: int = DEFAULT_RESAMPLES
    level: float = DEFAULT_LEVEL
    seed: int = 0
    frontier_rows: int = 64

    def __post_init__(self):
        _check(self.nll_tolerance >= 0, "nll_tolerance (>= 0)", self.nll_tolerance)
        _check(self.top >= 1, "top (>= 1)", self.top)
        _check(self.resamples >= 0, "resamples (>= 0)", self.resamples)
        _check(0 < self.level < 1, "level (in (0, 1))", self.level)
        _check(self.frontier_rows >= 0, "frontier_rows (>= 0)", self.frontier_rows)

    def bootstrap(self):
        """The library's :class:`~mdboost.ranking.uncertainty.BootstrapSettings` of the section."""
        # deferred: mdboost.ranking.uncertainty imports torch and scipy; built when a run scores, not when loaded
        from mdboost.ranking.uncertainty import BootstrapSettings

        return BootstrapSettings(num_resamples=self.resamples, level=float(self.level), seed=self.seed)


@dataclass
class RankConfig:
    """Everything ``mdboost rank`` needs (``pipelines/rank_pool.py``)."""

    name: str = "default"
    output_dir: str = "outputs/rank"
    pool: PoolConfig = field(default_factory=PoolConfig)
    data: DataConfig = field(default_factory=DataConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    md: MDConfig = field(default_factory=MDConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    boosting: BoostingConfig = field(default_factory=BoostingConfig)
    ranking: RuleConfig = field(default_factory=RuleConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    progress: bool = True

    def __post_init__(self):
        _check_output_dir(self.output_dir)
        _check(0 not in self.md.sampling_temperatures or self.cache.acceptance_source == "sampled",
               "md.temperatures (0, greedy decoding, needs cache.acceptance_source: sampled: its acceptance is "
               "the argmax match along greedy continuations)", self.md.sampling_temperatures)
        if self.cache.k < FLOOR_TOP_K and self.md.rules == _default_rules():  # the default list, on a small top-k
            self.md.rules = [r for r in self.md.rules if r.draft_p_min == 0]
        if self.speed.engine == "llamacpp":  # every member must run in llama.cpp
            path, note = llamacpp_model(self.pool.target)
            _check(path is not None, f"pool.target (speed.engine: llamacpp loads a GGUF: {note})", self.pool.target)
            for i, spec in enumerate(self.pool.drafters):
                why = llamacpp_cannot(spec)
                _check(why is None, f"pool.drafters[{i}] (speed.engine: llamacpp cannot run it: {why}; llama.cpp "
                                    f"runs early_exit:N, ngram:N and GGUF files)", spec)
        floored = any(r.draft_p_min > 0 for r in self.md.rules)
        _check(not floored or self.cache.k >= FLOOR_TOP_K,
               f"cache.k (a rule with draft_p_min reads the drafter's {FLOOR_TOP_K} largest logits per position: "
               f"k >= {FLOOR_TOP_K})", self.cache.k)
        # last, the checks that load torch, transformers or mlflow (seconds): a config whose only mistakes are
        # cheap ones is answered at once; each error names its section's path, as the section's own checks do
        self.pool.check_models("pool")
        self.md.check_rules("md")
        self.tracking.check_store("tracking")

    def cache_spec(self, temperature: float | None = None) -> PoolCacheSpec:
        """Where the pool's member caches live and what they hold (:mod:`mdboost.cache.keys`), for
        one of ``md.temperatures`` (default: the first): the cache, pool and speed sections'
        fields of the same names."""
        temperature = self.md.sampling_temperatures[0] if temperature is None else temperature
        return library_settings(PoolCacheSpec, self.cache, self.pool, self.speed, text=self.data.text_source(),
                                folders=self.cache.folders, temperature=temperature)

    def score_settings(self, temperature: float | None = None, batch_size: int = 1):
        """:func:`mdboost.ranking.rank.score_pair`'s settings (:class:`~mdboost.ranking.rank.ScoreSettings`)
        from the md, speed and boosting sections' fields of the same names and the ranking section's
        bootstrap, at one of ``md.temperatures`` (default: the first) and one batch size."""
        # deferred: mdboost.ranking.rank imports torch, transformers and scikit-learn; built when a run scores
        from mdboost.ranking.rank import ScoreSettings

        temperature = self.md.sampling_temperatures[0] if temperature is None else temperature
        budgets = tuple(self.md.budgets) if temperature > 0 else (0.0,)  # greedy: lossless SD only
        return library_settings(ScoreSettings, self.md, self.speed, self.boosting, temperature=temperature,
                                budgets=budgets, bootstrap=self.ranking.bootstrap(), tv_mentor=self.md.mentor,
                                rules=tuple(r.to_rule() for r in self.md.rules), batch_size=batch_size)


def library_settings(cls, *sections, **given):
    """The library's settings dataclass ``cls`` built from ``given`` and, for each other field of
    ``cls``, the field of the same name in exactly one of the config ``sections``.

    A field of ``cls`` that no section (or several) hold raises ``TypeError``: the wiring cannot
    leave a library setting at its default by mistake, nor take it from the wrong section.

    Examples
    --------
    >>> library_settings(FolderSettings, CacheConfig(k=16)).k
    16
    """
    values = dict(given)
    for name in (f.name for f in dataclasses.fields(cls) if f.init and f.name not in given):
        holders = [section for section in sections if name in {f.name for f in dataclasses.fields(section)}]
        if len(holders) != 1:
            raise TypeError(f"{cls.__name__}.{name} is held by {len(holders)} of the sections "
                            f"{[type(s).__name__ for s in sections]}, not one: pass it by name")
        values[name] = getattr(holders[0], name)
    return cls(**values)
