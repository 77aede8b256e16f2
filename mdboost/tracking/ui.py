"""The MLflow UI over the project's store: ``mdboost ui`` and a background server for tests.

``main`` runs ``mlflow server`` in the foreground on localhost over a tracking store (the
given one, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlruns/mlflow.db``; artifacts of
experiments created through it under ``artifact_root``, default ``mlruns/artifacts``; see
:mod:`mdboost.tracking.store`) and stops it, workers included, on SIGINT / SIGTERM / SIGHUP; the
server runs under :mod:`mdboost.tracking.watchdog`, so it stops too when ``mdboost ui`` is killed
outright (SIGKILL). :func:`running_server` starts the same server in the background on a
free port, waits until it answers ``/health`` and stops it on exit; the browser test and any
script that wants to look at runs programmatically use it.

No paper result lives here: this is the "inspect and compare runs" edge of the project.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

from mdboost.tracking.store import (DEFAULT_ARTIFACT_ROOT, DEFAULT_TRACKING_URI, check_tracking_uri, resolve_tracking_uri,
                                   sqlite_path)
from mdboost.tracking.watchdog import watched

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _check_port(port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port must be an integer in [1, 65535], got {port!r}")


def _check_host(host: str) -> None:
    if not isinstance(host, str) or not host:
        raise ValueError(f"host must be a non-empty string, got {host!r}")


def _check_port_free(host: str, port: int) -> None:
    """``OSError`` naming ``host:port`` if something already listens there. The server would
    find out only after it had started (seconds later), print uvicorn's "address already in
    use" among its log lines and exit 0. The socket is bound as uvicorn binds it
    (``SO_REUSEADDR``), so a port in TIME_WAIT still counts as free."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise OSError(f"host {host!r}: cannot be resolved ({err})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as err:
            raise OSError(f"port {port} on {host} is not free ({err.strerror or err}): another server "
                          "(an 'mdboost ui' already running?) listens there; choose another with --port") from None


def _artifact_uri(artifact_root: str) -> str:
    """Absolute ``file://`` URI of a local artifact folder; other URIs pass through."""
    if "://" in artifact_root:
        return artifact_root
    return Path(artifact_root).resolve().as_uri()


def server_command(tracking_uri: str = DEFAULT_TRACKING_URI, *, port: int = 5000,
                   host: str = "127.0.0.1", artifact_root: str = DEFAULT_ARTIFACT_ROOT,
                   workers: int = 1) -> list[str]:
    """The ``mlflow server`` command line serving ``tracking_uri`` on ``host:port``.

    Parameters
    ----------
    tracking_uri : str
        Backend store URI (``sqlite:///...`` or any SQLAlchemy / ``file:`` URI MLflow takes).
    port : int
        TCP port in [1, 65535].
    host : str
        Interface to bind; localhost by default.
    artifact_root : str
        Folder (or URI) for artifacts of experiments created through the server.
    workers : int
        Server worker processes (>= 1).

    Returns
    -------
    list of str
        Arguments for :func:`subprocess.Popen` (runs MLflow with this interpreter).
    """
    if not isinstance(tracking_uri, str) or not tracking_uri:
        raise ValueError(f"tracking_uri must be a non-empty string, got {tracking_uri!r}")
    _check_port(port)
    _check_host(host)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    return [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", tracking_uri,
        "--default-artifact-root", _artifact_uri(artifact_root),
        "--no-serve-artifacts",
        "--host", host, "--port", str(port), "--workers", str(workers),
    ]


def _prepare_store(tracking_uri: str) -> None:
    db = sqlite_path(tracking_uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)


_REMOTE = ("http", "https", "databricks", "databricks-uc", "uc")  # tracking stores a server cannot be started over


def _servable(uri: str) -> str:
    """``uri`` if ``mlflow server`` can serve it (a local path or a database), else a ValueError:
    a remote tracking server (or Databricks) already has its UI."""
    scheme = urlparse(uri).scheme
    if scheme in _REMOTE:
        raise ValueError(f"tracking_uri {uri!r} is a remote tracking store: open its own UI in a browser "
                         "(mdboost ui serves a local store: a path or a database URI such as sqlite:///mlruns/mlflow.db)")
    return uri


def _url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


def main(tracking_uri: str | None = None, port: int = 5000, host: str = "127.0.0.1",
         artifact_root: str | None = None) -> int:
    """Run the MLflow UI in the foreground until interrupted; returns the server's exit code.

    Ctrl-C (SIGINT), SIGTERM and SIGHUP stop the server it started, workers included (it runs
    in its own process group, :func:`_stop`), and return 0: no server is left serving.

    Parameters
    ----------
    tracking_uri : str or None
        Store to serve; ``None`` means ``$MLFLOW_TRACKING_URI``, else the project's default
        ``sqlite:///mlruns/mlflow.db`` (:func:`mdboost.tracking.store.resolve_tracking_uri`).
    port, host : int, str
        Where to listen (localhost:5000 by default).
    artifact_root : str or None
        Artifact folder (or URI) for experiments created through the UI; ``None`` means the
        project's ``mlruns/artifacts`` (``mdboost ui --artifacts-root``).
    """
    uri = _servable(check_tracking_uri(resolve_tracking_uri(tracking_uri)))  # before the banner and the server start
    artifact_root = DEFAULT_ARTIFACT_ROOT if artifact_root is None else artifact_root
    cmd = server_command(uri, port=port, host=host, artifact_root=artifact_root)
    _check_port_free(host, port)
    if host not in _LOOPBACK:
        print(f"warning: binding {host!r}, not only localhost", file=sys.stderr)
    _prepare_store(uri)
    print(f"MLflow UI over {uri} (artifacts: {_artifact_uri(artifact_root)}) at {_url(host, port)} "
          "(Ctrl-C to stop)", flush=True)
    proc = None
    with _signals_stop():  # installed first: a SIGTERM right after the start still stops the server
        try:
            # its own session: a signal to us reaches the server (and its workers) only through _stop;
            # under a watchdog that stops it when we die without a word (SIGKILL; mdboost.tracking.watchdog)
            proc = subprocess.Popen(watched(cmd), start_new_session=True)
            return proc.wait()
        except (KeyboardInterrupt, _Stopped):
            return 0
        finally:
            if proc is not None:
                _stop(proc)


class _Stopped(Exception):
    """SIGTERM or SIGHUP arrived: leave the wait and stop the server."""


@contextmanager
def _signals_stop() -> Iterator[None]:
    """Turn SIGINT / SIGTERM / SIGHUP into :class:`_Stopped` for the block (main thread only), so
    that stopping ``mdboost ui`` stops the server it started instead of orphaning it. SIGINT too:
    a process started from a shell's background job inherits SIGINT ignored, and Python then keeps
    ignoring it, so Ctrl-C or ``kill -INT`` would leave the server running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_stopped(signum, frame):
        raise _Stopped(signum)

    previous = {sig: signal.signal(sig, raise_stopped) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _answers(url: str, timeout: float = 2.0) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy
    try:
        with opener.open(url + "/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_until_up(url: str, proc: subprocess.Popen, timeout: float, log: Path | None = None) -> None:
    """Poll ``url/health`` until it answers 200; raise if ``proc`` dies or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _answers(url):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {proc.returncode}: {_tail(log)}")
        time.sleep(0.5)
    raise TimeoutError(f"mlflow server at {url} did not answer within {timeout}s: {_tail(log)}")


def _tail(log: Path | None, chars: int = 2000) -> str:
    if log is None or not log.exists():
        return "(no log)"
    return log.read_text(errors="replace")[-chars:]


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Terminate the server's own process group (it forks workers), then kill if needed."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        proc.wait(grace)


@contextmanager
def running_server(tracking_uri: str = DEFAULT_TRACKING_URI, *, port: int | None = None,
                   host: str = "127.0.0.1", artifact_root: str = DEFAULT_ARTIFACT_ROOT,
                   timeout: float = 120.0) -> Iterator[str]:
    """Start the MLflow UI in the background, yield its base URL, stop it on exit.

    Parameters
    ----------
    tracking_uri : str
        Store to serve.
    port : int or None
        Port to use; ``None`` picks a free one.
    host : str
        Interface to bind (localhost).
    artifact_root : str
        Artifact folder for experiments created through the server.
    timeout : float
        Seconds to wait for the server to answer ``/health`` (> 0).

    Yields
    ------
    str
        Base URL, e.g. ``http://127.0.0.1:54321``.

    Examples
    --------
    >>> with running_server("sqlite:////tmp/x/mlflow.db") as url:  # doctest: +SKIP
    ...     print(url)
    """
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0, got {timeout!r}")
    port = free_port(host) if port is None else port
    cmd = server_command(tracking_uri, port=port, host=host, artifact_root=artifact_root)
    _prepare_store(tracking_uri)
    url = _url(host, port)
    with tempfile.TemporaryDirectory(prefix="mdboost-ui-") as tmp:
        log = Path(tmp) / "server.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(watched(cmd), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_until_up(url, proc, timeout, log)
            yield url
        finally:
            _stop(proc)
