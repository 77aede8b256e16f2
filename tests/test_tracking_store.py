"""mdboost.tracking.store: processes creating one fresh sqlite store at once, and a store that
cannot be opened (one line, no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mdboost.tracking.store import existing_run, setup

REPO = Path(__file__).resolve().parents[1]
SETUP = ("import sys, time\n"
         "from pathlib import Path\n"
         "from mdboost.tracking.store import setup\n"
         "go = Path(sys.argv[1]) / 'go'\n"
         "while not go.exists(): time.sleep(0.01)\n"  # all start together
         "print(setup('race', f'sqlite:///{sys.argv[1]}/fresh/mlflow.db', f'{sys.argv[1]}/art'))\n")


def test_processes_creating_one_fresh_store_at_once_all_get_the_experiment(tmp_path):
    """Without the lock, MLflow's first-use migrations collided (sqlite3.OperationalError:
    duplicate column name; alembic: expected to match one row) and the experiment was created twice."""
    procs = [subprocess.Popen([sys.executable, "-c", SETUP, str(tmp_path)], env=dict(os.environ, PYTHONPATH=str(REPO)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    (tmp_path / "go").touch()
    done = [(p.wait(120), *p.communicate()) for p in procs]
    assert [code for code, _, _ in done] == [0, 0, 0], [err[-1500:] for _, _, err in done]
    assert len({out.strip() for _, out, _ in done}) == 1  # one experiment, the same id for all
    assert (tmp_path / "fresh" / ".mlflow.db.lock").is_file()


def test_a_store_that_cannot_be_opened_is_one_oserror_naming_it(tmp_path):
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"not a database" * 100)
    uri = f"sqlite:///{db}"
    with pytest.raises(OSError) as err:
        setup("x", uri, str(tmp_path / "art"))
    message = str(err.value)
    assert message.startswith(f"the MLflow store {uri!r} could not be opened (") and "\n" not in message
    with pytest.raises(OSError, match="could not be opened"):
        existing_run("0" * 32, uri)


def test_a_rank_on_a_broken_store_is_one_line(tmp_path, capsys, monkeypatch):
    """The CLI prints the store's failure as one line (exit 2), not a traceback."""
    from mdboost import cli
    from pipelines import rank_pool

    db = tmp_path / "mlflow.db"
    db.write_bytes(b"not a database" * 100)
    monkeypatch.setattr(rank_pool, "run", lambda cfg, costs=None: setup("x", f"sqlite:///{db}", str(tmp_path)))
    assert cli.main(["rank", "--config", str(REPO / "configs" / "tiny.yaml")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "mdboost rank: error: the MLflow store" in err, err
