"""MLflow at the edges of the project: the store pipelines log to and the UI that browses it.

- :mod:`mdboost.tracking.store` -- where the store lives (default ``sqlite:///mlruns/mlflow.db``,
  artifacts under ``mlruns/artifacts``) and :func:`setup`, which pipelines call before logging;
- :mod:`mdboost.tracking.ui` -- ``mdboost ui`` (``mlflow server`` on localhost over that store)
  and :func:`~mdboost.tracking.ui.running_server`, a background server for tests and scripts.

Library functions never import this package; pipelines and the CLI do. MLflow itself is
imported only inside the functions that need it.
"""

from mdboost.tracking.store import DEFAULT_ARTIFACT_ROOT, DEFAULT_TRACKING_URI, setup, sqlite_path

__all__ = ["DEFAULT_ARTIFACT_ROOT", "DEFAULT_TRACKING_URI", "setup", "sqlite_path"]
