"""The project's MLflow store: where it lives and how pipelines open it.

Library functions never import this module; pipelines do. Default store:
``sqlite:///mlruns/mlflow.db`` with artifacts under ``mlruns/artifacts`` (MLflow 3 refuses
the plain file store without an override).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

DEFAULT_TRACKING_URI = "sqlite:///mlruns/mlflow.db"
DEFAULT_ARTIFACT_ROOT = "mlruns/artifacts"
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (relative paths stay relative), else None."""
    prefix = "sqlite:///"
    return Path(tracking_uri[len(prefix):]) if tracking_uri.startswith(prefix) else None


def existing_run(run_id: str, tracking_uri: str, *, run_name: str = "", uri_name: str = ""):
    """The MLflow run ``run_id`` of the store ``tracking_uri``, read without creating a store (a
    ``sqlite:///`` file that does not exist is not opened): else a ValueError "no MLflow run ...".
    ``run_name`` / ``uri_name``: how the caller names the two, added to the message after them
    (e.g. ``" (ranking.ranking_run_id)"``)."""
    import mlflow  # deferred: mlflow: seconds to import; the library runs without a tracking server
    from mlflow.exceptions import MlflowException

    db = sqlite_path(tracking_uri)
    if db is not None and not db.is_file():  # a read creates no store
        raise ValueError(f"no MLflow run {run_id!r}{run_name}: the store {tracking_uri!r}{uri_name} does not exist")
    try:
        return mlflow.MlflowClient(tracking_uri).get_run(run_id)
    except MlflowException as err:
        raise ValueError(f"no MLflow run {run_id!r}{run_name} in {tracking_uri!r}{uri_name}") from err


def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    """The store to use, by MLflow's own precedence: ``tracking_uri`` when given, else the
    ``MLFLOW_TRACKING_URI`` environment variable, else :data:`DEFAULT_TRACKING_URI`.

    >>> resolve_tracking_uri("sqlite:///x.db")
    'sqlite:///x.db'
    """
    return tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def check_tracking_uri(tracking_uri: str) -> str:
    """``tracking_uri`` if MLflow has a tracking store for its scheme (its built-in ones and any
    installed plugin's), else a ValueError naming the URI and the schemes there are.

    >>> check_tracking_uri("sqlite:///mlruns/mlflow.db")
    'sqlite:///mlruns/mlflow.db'
    >>> check_tracking_uri("bogus://x")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: tracking_uri 'bogus://x' has no MLflow tracking store (schemes: ...
    """
    try:  # MLflow's own registry of store builders (entry-point plugins included); private, so guarded
        # deferred: mlflow: seconds to import; the library runs without a tracking server
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry as registry

        schemes = sorted(registry._registry)
    except (ImportError, AttributeError):  # another MLflow layout: MLflow reports it when the store opens
        return tracking_uri

    scheme = urlparse(tracking_uri).scheme
    if len(scheme) == 1:  # a Windows drive letter: a local path
        scheme = ""
    if scheme not in schemes:
        raise ValueError(f"tracking_uri {tracking_uri!r} has no MLflow tracking store (schemes: "
                         f"{', '.join(repr(s) for s in schemes)}; a plain path is a local store)")
    return tracking_uri


def setup(experiment: str, tracking_uri: str = DEFAULT_TRACKING_URI,
          artifact_root: str = DEFAULT_ARTIFACT_ROOT) -> str:
    """Point MLflow at the store and make sure ``experiment`` exists; returns its id.

    New experiments store artifacts under ``artifact_root`` (made absolute, so the UI can
    serve them from any working directory) and are tagged as classic ML experiments: MLflow 3
    otherwise opens them in its GenAI view, where runs and their metrics are not listed.
    """
    import mlflow  # deferred: mlflow: seconds to import; the library runs without a tracking server

    db = sqlite_path(tracking_uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(tracking_uri)
    found = mlflow.get_experiment_by_name(experiment)
    if found is not None:
        experiment_id = found.experiment_id
    else:
        location = Path(artifact_root).resolve() / experiment
        experiment_id = mlflow.create_experiment(
            experiment, artifact_location=location.as_uri(), tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    mlflow.set_experiment(experiment_id=experiment_id)
    return experiment_id
