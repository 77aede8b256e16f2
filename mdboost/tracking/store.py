"""The project's MLflow store: where it lives and how pipelines open it.

Library functions never import this module; pipelines do. Default store:
``sqlite:///mlruns/mlflow.db`` with artifacts under ``mlruns/artifacts`` (MLflow 3 refuses
the plain file store without an override).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

from mdboost._io import file_lock, lock_path

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
    with opening_store(tracking_uri):  # a store another process is creating: after it
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


def _store_errors() -> tuple[type[BaseException], ...]:
    """What opening a store raises when it fails: MLflow's errors, the database's (SQLAlchemy,
    sqlite3) and a failed schema migration (alembic; SQLAlchemy and alembic are MLflow's own
    dependencies)."""
    import alembic.util  # deferred: mlflow's dependencies: seconds to import; only a tracked run needs them
    import sqlalchemy.exc  # deferred: as above
    from mlflow.exceptions import MlflowException  # deferred: as above

    return (MlflowException, sqlite3.Error, sqlalchemy.exc.SQLAlchemyError, alembic.util.CommandError)


@contextmanager
def opening_store(tracking_uri: str) -> Iterator[None]:
    """Open (and on first use create) the store ``tracking_uri`` inside the block, one process at
    a time for a ``sqlite:///`` store, and report a failure on one line.

    MLflow creates a fresh SQL store's tables and runs its schema migrations when a process
    first opens it; two processes doing so at once on one sqlite file collide (``sqlite3.
    OperationalError: duplicate column name``, or alembic's "expected to match one row"). So the
    first opening in each process (and an experiment's creation, which races the same way) holds
    an exclusive lock on the store's sibling lock file (:func:`mdboost._io.lock_path`); a second
    process waits, then finds the store made. A store that fails to open anyway raises an
    ``OSError`` naming the URI with the cause on one line (the CLI prints it, no traceback).
    """
    db = sqlite_path(tracking_uri)
    lock = contextlib.nullcontext()
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
        lock = file_lock(lock_path(db))
    errors = _store_errors()
    try:
        with lock:
            yield
    except errors as err:
        cause = " ".join(str(err).split()) or type(err).__name__
        raise OSError(f"the MLflow store {tracking_uri!r} could not be opened ({type(err).__name__}: "
                      f"{cause[:300]})") from err


def setup(experiment: str, tracking_uri: str = DEFAULT_TRACKING_URI,
          artifact_root: str = DEFAULT_ARTIFACT_ROOT) -> str:
    """Point MLflow at the store and make sure ``experiment`` exists; returns its id.

    New experiments store artifacts under ``artifact_root`` (made absolute, so the UI can
    serve them from any working directory) and are tagged as classic ML experiments: MLflow 3
    otherwise opens them in its GenAI view, where runs and their metrics are not listed. Safe
    when several processes set up one fresh store at once (:func:`opening_store`).
    """
    import mlflow  # deferred: mlflow: seconds to import; the library runs without a tracking server

    with opening_store(tracking_uri):
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
