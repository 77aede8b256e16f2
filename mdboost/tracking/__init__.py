"""MLflow at the edges of the project: the store pipelines log to and the UI that browses it.

- :mod:`mdboost.tracking.store` -- where the store lives (default ``sqlite:///mlruns/mlflow.db``,
  artifacts under ``mlruns/artifacts``) and :func:`setup`, which pipelines call before logging;
- :mod:`mdboost.tracking.ui` -- ``mdboost ui`` (``mlflow server`` on localhost over that store)
  and :func:`~mdboost.tracking.ui.running_server`, a background server for tests and scripts;
- :mod:`mdboost.tracking.runs` -- how runs read in the UI: short point names, key metrics
  first, nested runs listed in order (:func:`~mdboost.tracking.runs.log_children`);
- :mod:`mdboost.tracking.notes` -- the markdown of parent runs' descriptions
  (``mlflow.note.content``);
- :mod:`mdboost.tracking.datasets` -- the prompts a run used as an MLflow dataset input.

Library functions never import this package; pipelines and the CLI do. MLflow itself is
imported only inside the functions that need it.
"""

from mdboost.tracking.store import DEFAULT_ARTIFACT_ROOT, DEFAULT_TRACKING_URI, setup, sqlite_path

__all__ = ["DEFAULT_ARTIFACT_ROOT", "DEFAULT_TRACKING_URI", "setup", "sqlite_path"]
