"""mdboost.tracking.ui: the mlflow server command, argument checks, and a real background server."""

from __future__ import annotations

import socket
import sys
import urllib.request

import pytest

from mdboost.tracking import ui
from mdboost.tracking import DEFAULT_TRACKING_URI
from tests._servers import assert_stops_on


def test_server_command_serves_the_given_store_on_localhost(tmp_path):
    cmd = ui.server_command(f"sqlite:///{tmp_path}/m.db", port=5123, artifact_root=str(tmp_path / "a"))
    assert cmd[:4] == [sys.executable, "-m", "mlflow", "server"]
    args = dict(zip(cmd[4::1], cmd[5::1]))
    assert args["--backend-store-uri"] == f"sqlite:///{tmp_path}/m.db"
    assert args["--default-artifact-root"] == (tmp_path / "a").resolve().as_uri()
    assert args["--host"] == "127.0.0.1" and args["--port"] == "5123"


def test_server_command_defaults_to_the_project_store():
    cmd = ui.server_command()
    assert cmd[cmd.index("--backend-store-uri") + 1] == DEFAULT_TRACKING_URI
    assert cmd[cmd.index("--default-artifact-root") + 1].startswith("file://")


@pytest.mark.parametrize("kwargs, name", [
    ({"port": 0}, "port"), ({"port": 70000}, "port"), ({"port": "80"}, "port"),
    ({"port": True}, "port"), ({"host": ""}, "host"), ({"workers": 0}, "workers"),
    ({"tracking_uri": ""}, "tracking_uri"),
])
def test_bad_arguments_raise_value_error_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ui.server_command(**kwargs)


def test_main_rejects_a_bad_port_before_starting_anything():
    with pytest.raises(ValueError, match="port"):
        ui.main(port=-1)


@pytest.mark.parametrize("uri, message", [
    ("bogus://x", "tracking_uri 'bogus://x' has no MLflow tracking store"),
    ("http://127.0.0.1:5999", "tracking_uri 'http://127.0.0.1:5999' is a remote tracking store"),
])
def test_a_store_no_server_can_serve_is_one_line_before_anything_starts(uri, message, monkeypatch, capsys):
    from mdboost import cli

    monkeypatch.setattr(ui.subprocess, "Popen", lambda *a, **k: pytest.fail("a server was started"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # honoured as MLflow does, and checked the same way
    assert cli.main(["ui"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and message in err, (out, err)


def test_a_port_in_use_is_one_line_before_anything_starts(tmp_path, monkeypatch, capsys):
    # The server found out itself, after its start, logged uvicorn's "address already in use"
    # and mdboost ui exited 0 (16 s on a 2-core machine), under a banner naming the busy port.
    from mdboost import cli

    popen = ui.subprocess.Popen  # loading the store's driver runs `uname -p` (platform): let that through
    monkeypatch.setattr(ui.subprocess, "Popen", lambda cmd, *a, **k: pytest.fail("a server was started")
                        if "mlflow" in " ".join(map(str, cmd)) else popen(cmd, *a, **k))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["ui", "--port", str(port), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, (out, err)
    assert err.startswith(f"mdboost ui: error: port {port} on 127.0.0.1 is not free") and "--port" in err
    assert not (tmp_path / "m.db").exists()  # nothing created for a server that cannot start
    ui._check_port_free("127.0.0.1", port)  # free again once closed


def test_running_server_rejects_nonpositive_timeout():
    with pytest.raises(ValueError, match="timeout"):
        with ui.running_server("sqlite:///unused.db", timeout=0):
            pass


def test_free_port_can_be_bound():
    port = ui.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_cli_ui_dispatches_to_main(monkeypatch):
    from mdboost import cli

    seen = {}
    monkeypatch.setattr(ui, "main", lambda **kw: seen.update(kw) or 0)
    assert cli.main(["ui", "--port", "5050", "--tracking-uri", "sqlite:///x.db"]) == 0
    assert seen == {"tracking_uri": "sqlite:///x.db", "artifact_root": None, "port": 5050, "host": "127.0.0.1"}


def test_running_server_answers_shows_the_store_and_stops(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    local = MlflowClient(uri)
    eid = local.create_experiment("ui-test", artifact_location=(tmp_path / "art").as_uri())
    run = local.create_run(eid, run_name="tiny-exit1->tiny-target")
    local.log_metric(run.info.run_id, "md_acceptance", 0.75)

    with ui.running_server(uri, artifact_root=str(tmp_path / "art"), timeout=180) as url:
        assert url.startswith("http://127.0.0.1:")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url + "/health", timeout=10) as resp:
            assert resp.status == 200
        remote = MlflowClient(url)
        found = remote.search_runs([eid])
        assert [r.info.run_name for r in found] == ["tiny-exit1->tiny-target"]
        assert found[0].data.metrics["md_acceptance"] == 0.75
    assert not ui._answers(url, timeout=1.0)


def test_running_server_reports_a_server_that_dies(tmp_path):
    with pytest.raises(RuntimeError, match="exited"):
        with ui.running_server("nosuchscheme://nowhere", artifact_root=str(tmp_path), timeout=180):
            pass


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_stopping_mdboost_ui_stops_its_server(tmp_path, sig):
    """SIGTERM / SIGINT to ``mdboost ui`` leaves no server behind (the port is free again)."""
    import os
    import signal
    import subprocess

    port = ui.free_port()
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, "-m", "mdboost.cli", "ui", "--port", str(port),
                             "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        ui.wait_until_up(url, proc, timeout=180)
        assert_stops_on(proc, url, port, getattr(signal, sig))
    finally:
        if proc.poll() is None:
            proc.kill()


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie nobody reaped yet counts as exited)."""
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _wait_gone(pid: int, deadline_s: float = 30.0) -> bool:
    import time

    deadline = time.monotonic() + deadline_s
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _gone(pid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; killpg (POSIX)")
def test_the_watchdog_stops_its_command_when_its_parent_is_killed(tmp_path):
    """A parent killed by SIGKILL (no handler runs) takes the watched command, and what that
    command started, with it: the watchdog sees it has another parent and stops its group."""
    import os
    import signal
    import subprocess

    pids = tmp_path / "pids"
    command = tmp_path / "command.py"  # the watched command: starts a child, writes both pids, sleeps
    command.write_text("import os, subprocess, sys, time\n"
                       "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
                       f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{c.pid}}')\n"
                       "time.sleep(300)\n")
    starter = ("import subprocess, sys, time\n"
               "from mdboost.tracking.watchdog import watched\n"
               f"subprocess.Popen(watched([sys.executable, {str(command)!r}]), start_new_session=True)\n"
               "time.sleep(300)\n")
    parent = subprocess.Popen([sys.executable, "-c", starter], env=dict(os.environ, PYTHONPATH=os.getcwd()))
    try:
        import time

        deadline = time.monotonic() + 60
        while not (pids.is_file() and len(pids.read_text().split()) == 2) and time.monotonic() < deadline:
            time.sleep(0.2)
        command, started = map(int, pids.read_text().split())
        assert not _gone(command) and not _gone(started)
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        assert _wait_gone(command) and _wait_gone(started)
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in map(int, pids.read_text().split()) if pids.is_file() else ():
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; killpg (POSIX)")
def test_mdboost_ui_killed_outright_leaves_no_server(tmp_path):
    """SIGKILL to ``mdboost ui`` (no handler runs): its server stops anyway and the port is free."""
    import os
    import signal
    import subprocess
    import time

    port = ui.free_port()
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, "-m", "mdboost.cli", "ui", "--port", str(port),
                             "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    url, group = f"http://127.0.0.1:{port}", None
    try:
        ui.wait_until_up(url, proc, timeout=180)
        group = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _parent_of(int(p)) == proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert _wait_gone(group, 60)  # the watchdog, after stopping its group
        deadline = time.monotonic() + 30
        while ui._answers(url, timeout=1.0) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not ui._answers(url, timeout=1.0)
        ui._check_port_free("127.0.0.1", port)
    finally:
        if proc.poll() is None:
            proc.kill()
        if group is not None:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
