"""``mdboost ui`` as a process: the store from ``MLFLOW_TRACKING_URI``, ``--artifacts-root`` for
experiments created through it, and SIGTERM stops the server it started (the port is free)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

from mdboost.tracking import ui
from tests._servers import assert_stops_on

REPO = Path(__file__).resolve().parents[1]


def test_ui_serves_the_env_store_with_its_artifacts_root_and_stops_on_sigterm(tmp_path):
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path}/env.db"
    local = MlflowClient(store)
    eid = local.create_experiment("made-before", artifact_location=(tmp_path / "old").as_uri())
    local.create_run(eid, run_name="from-the-env-store")

    port, art = ui.free_port(), tmp_path / "art"
    env = dict(os.environ, PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI=store)
    proc = subprocess.Popen([sys.executable, "-m", "mdboost.cli", "ui", "--port", str(port),
                             "--artifacts-root", str(art)], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        ui.wait_until_up(url, proc, timeout=180)
        remote = MlflowClient(url)
        assert [r.info.run_name for r in remote.search_runs([eid])] == ["from-the-env-store"]
        new = remote.get_experiment(remote.create_experiment("made-in-the-ui"))
        assert new.artifact_location.startswith(art.resolve().as_uri() + "/")
        assert_stops_on(proc, url, port, signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
