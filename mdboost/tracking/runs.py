"""How mdboost's runs read in the MLflow UI: short point names, key metrics first, ordered children.

Three facts of MLflow's UI (3.x) decide how a pipeline logs its nested runs:

- the runs list sorts by start time, newest first, and lists a parent's children under it in
  that order, so children that should read "best first" must *start* in reverse order
  (:func:`log_children` creates them last to first with strictly increasing start times; the
  tracking API's default ``search_runs`` order, start time descending, then agrees);
- the Compare view's parallel-coordinates plot starts from the first metric the compared runs
  share, in logging order, and the first three differing params in sorted order, so the
  figures a reader compares (:data:`KEY_METRICS`: predicted speedup and its interval,
  acceptance, mean accepted length) are logged first (:func:`ordered_metrics`);
- names are cut to the column's width, so a point's name is short and leads with what differs
  (:func:`point_name`: ``tuned:12 kl 0.05 g4 T0.7``).

Pipelines call these; the library's own functions never do (logging happens at the edges).
No paper result lives here.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

KEY_METRICS = (
    "predicted_speedup", "predicted_speedup_lo", "predicted_speedup_hi",
    "engine_acceptance", "engine_acceptance_lo", "engine_acceptance_hi",
    "engine_mean_accepted_length", "engine_mean_accepted_length_lo", "engine_mean_accepted_length_hi",
    "md_acceptance", "sd_acceptance", "cost_ratio",
)
"""Ranking metrics logged first, in this order (definitions: ``docs/ranking.md``, "Metrics")."""


def point_name(drafter: str, divergence: str, max_divergence: float, gamma: int, temperature: float,
               target: str | None = None) -> str:
    """A short run name for an operating point: drafter, budget, gamma, temperature.

    Parameters
    ----------
    drafter : str
        Drafter spec (``"tuned:12"``, ``"ngram:3"``).
    divergence : str
        Divergence name; unused for a budget-0 point, which is plain speculative decoding.
    max_divergence : float
        The budget D (>= 0); 0 is written ``SD``.
    gamma : int
        Draft length (>= 1); 0 is the drafter decoding alone (no budget, written ``alone``).
    temperature : float
        Sampling temperature (>= 0).
    target : str or None
        Appended as ``->target`` when given (pairs whose target is not the pool's).

    Returns
    -------
    str

    Examples
    --------
    >>> point_name("tuned:12", "kl", 0.05, 4, 0.7)
    'tuned:12 kl 0.05 g4 T0.7'
    >>> point_name("ngram:3", "none", 0.0, 3, 1.0)
    'ngram:3 SD g3 T1'
    >>> point_name("ngram:2", "tv", 0.5, 2, 1.0, target="early_exit:2")
    'ngram:2->early_exit:2 tv 0.5 g2 T1'
    >>> point_name("int8", "tv", 0.7, 0, 0.7)
    'int8 alone T0.7'
    """
    budget, gamma, temperature = float(max_divergence), int(float(gamma)), float(temperature)
    if not (math.isfinite(budget) and budget >= 0):
        raise ValueError(f"max_divergence must be a finite number >= 0, got {max_divergence!r}")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 1 (0: the drafter alone), got {gamma!r}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    pair = drafter if target is None else f"{drafter}->{target}"
    if gamma == 0:
        return f"{pair} alone T{temperature:g}"
    point = "SD" if budget == 0 else f"{divergence} {budget:g}"
    return f"{pair} {point} g{gamma} T{temperature:g}"


def ordered_metrics(values: Mapping, first: Sequence[str] = KEY_METRICS) -> dict[str, float]:
    """The numeric entries of ``values`` as MLflow metrics, the keys of ``first`` first.

    Booleans become 0/1; strings, None and non-finite numbers are left out (MLflow shows no
    NaN in its plots). The keys of ``first`` present in ``values`` come first in ``first``'s
    order, then every other key in ``values``' own order.

    Examples
    --------
    >>> ordered_metrics({"n_positions": 64, "drafter": "int8", "predicted_speedup": 1.2, "quality_ok": True,
    ...                  "nll_drafter": float("inf")}, first=("predicted_speedup",))
    {'predicted_speedup': 1.2, 'n_positions': 64.0, 'quality_ok': 1.0}
    """
    if isinstance(first, str):
        raise TypeError(f"first must be a sequence of metric names, not a str, got {first!r}")
    keys = [k for k in first if k in values] + [k for k in values if k not in set(first)]
    out = {}
    for key in keys:
        value = values[key]
        if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
            out[key] = float(value)
    return out


@dataclass(frozen=True)
class ChildRun:
    """One nested run to log: its name, params, metrics (logged in their order) and tags."""

    name: str
    params: Mapping[str, object] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)


def log_children(client, experiment_id: str, parent_run_id: str, children: Sequence[ChildRun],
                 progress=None) -> list[str]:
    """Create ``children`` as finished nested runs of ``parent_run_id``, listed in their order.

    They are created last to first, each starting at least a millisecond after the one before,
    so MLflow's newest-first lists (the UI's runs table, ``search_runs``'s default order) show
    ``children[0]`` on top. Metrics are logged in each child's order (one ``log_batch``).

    Parameters
    ----------
    client : mlflow.tracking.MlflowClient
        Client of the store the parent lives in.
    experiment_id, parent_run_id : str
        Where the children go.
    children : sequence of ChildRun
        In the order a reader should see them (best first).
    progress : callable or None
        Wraps the iteration (e.g. a tqdm factory taking the iterable).

    Returns
    -------
    list of str
        The children's run ids, in ``children``'s order.
    """
    # deferred: mlflow: seconds to import; the library runs without a tracking server
    from mlflow.entities import Metric, Param

    names = [c.name for c in children]
    if len(set(names)) != len(names):
        raise ValueError(f"children must have distinct names, got duplicates "
                         f"{sorted({n for n in names if names.count(n) > 1})}")
    ids: list[str | None] = [None] * len(children)
    last = 0
    order = range(len(children) - 1, -1, -1)
    for i in (progress(order) if progress is not None else order):
        child = children[i]
        start = last = max(int(time.time() * 1000), last + 1)
        run = client.create_run(experiment_id, start_time=start, run_name=child.name,
                                tags={"mlflow.parentRunId": parent_run_id, **child.tags})
        metrics = [Metric(k, float(v), start, 0) for k, v in child.metrics.items()]
        params = [Param(k, str(v)) for k, v in child.params.items()]
        client.log_batch(run.info.run_id, metrics=metrics, params=params)
        client.set_terminated(run.info.run_id, end_time=max(int(time.time() * 1000), start))
        ids[i] = run.info.run_id
    return ids


def parent_run(client, experiment_id: str, run_name: str, started_at: float):
    """The pipeline's parent run, active (``mlflow.start_run`` on it), starting at ``started_at``
    (seconds since the epoch: when the job began, not when it began logging), so the UI's
    Duration is the job's; it ends when the ``with`` block does.

    MLflow's ``start_run`` takes no start time; ``MlflowClient.create_run`` does, and
    ``start_run(run_id=...)`` resumes the run it made.
    """
    import mlflow  # deferred: mlflow: seconds to import; the library runs without a tracking server

    if not (isinstance(started_at, (int, float)) and math.isfinite(started_at) and 0 < started_at <= time.time()):
        raise ValueError(f"started_at must be a past time in seconds since the epoch, got {started_at!r}")
    run = client.create_run(experiment_id, start_time=int(started_at * 1000), run_name=run_name)
    mlflow.set_experiment(experiment_id=experiment_id)  # start_run refuses a run of another active experiment
    return mlflow.start_run(run_id=run.info.run_id)
