"""Library noise off when a config says ``progress: false``.

transformers draws a "Loading weights" bar for every ``from_pretrained`` (and huggingface_hub
one per download, datasets a "Generating train split" bar when it first reads a local data file,
MLflow a "Downloading artifacts" bar per artifact ``mdboost validate`` reads from a ranking
run); MLflow logs INFO lines when it creates or migrates a SQLite store
("Creating initial MLflow database tables...", "Updating database tables", and in some
versions alembic's "Context impl SQLiteImpl." / "Running upgrade ..."). A pipeline whose config turns progress off calls
:func:`quiet_libraries` once, before it loads a model or opens the store; the pipelines' own
bars follow ``progress`` themselves. Warnings and errors still show.
"""

from __future__ import annotations

import logging
import os

# loggers whose INFO lines are bookkeeping of the store, not news for the user
QUIET_LOGGERS = ("alembic", "mlflow.store.db.utils", "mlflow.store.tracking.sqlalchemy_store")


def quiet_libraries() -> None:
    """Turn off transformers' / huggingface_hub's / datasets' progress bars, MLflow's artifact
    download bars (unless ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR`` is set: a user's setting wins)
    and its store INFO lines (process-wide: call it from a pipeline's entry point, never from
    library code)."""
    # deferred: datasets, huggingface_hub, transformers: imported only to quiet them, by a pipeline's entry point
    import datasets
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    disable_progress_bars()
    datasets.disable_progress_bars()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
