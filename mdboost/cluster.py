"""A Dask cluster for one run: started (or connected to) at the start, closed at the end.

A run names its cluster with one string, the *scheduler*:

- ``"local"`` starts a :class:`distributed.LocalCluster` on this machine for the run:
  ``n_workers`` worker processes with one thread each (every worker holds its own models, so
  threads inside one worker would only share a model and a GIL), no dashboard; it is closed
  when the block ends, on error too;
- anything else is the address of a running scheduler (``tcp://10.0.0.5:8786``,
  ``10.0.0.5:8786``, ``tls://...``): a :class:`distributed.Client` connects to it and is closed
  at the end; the cluster itself keeps running (it belongs to whoever started it).

While the block runs the client is the default one (``distributed.get_client()``), so joblib's
``dask`` backend (:func:`mdboost.cache.build.build_cache` with
``RunOptions(backend="dask")``) and :func:`mdboost.validation.scaleout.realize_cells_on`
submit to it. GPU workers are started outside this module (``docs/scale_out.md``: one GPU per
worker with ``dask-cuda``'s ``LocalCUDACluster`` or ``CUDA_VISIBLE_DEVICES``), then reached by
their address.

>>> check_scheduler("local"), check_scheduler("tcp://10.0.0.5:8786"), check_scheduler("node3:8786")
('local', 'tcp://10.0.0.5:8786', 'node3:8786')
>>> check_scheduler("tcp://10.0.0.5")
Traceback (most recent call last):
...
ValueError: scheduler must be 'local' or a scheduler address such as 'tcp://10.0.0.5:8786' (protocol tcp, tls, ucx, inproc, ws or wss; a port), got 'tcp://10.0.0.5'
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from contextlib import contextmanager
from typing import Iterator

LOCAL = "local"
PROTOCOLS = ("tcp", "tls", "ucx", "inproc", "ws", "wss")
_ADDRESS = re.compile(rf"^(?:(?:{'|'.join(PROTOCOLS)})://)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{{1,5}})$")
_INPROC = re.compile(r"^inproc://[A-Za-z0-9_.:-]+/\d+/\d+$")  # in-process: LocalCluster(processes=False)
CONNECT_TIMEOUT = 30.0  # seconds a Client waits for the scheduler of an address


def check_scheduler(scheduler) -> str:
    """``scheduler`` if it is ``"local"`` or a scheduler address (``[protocol://]host:port``), else ``ValueError``."""
    if not isinstance(scheduler, str):
        raise TypeError(f"scheduler must be a string ('local' or an address), got {scheduler!r}")
    if scheduler == LOCAL or _INPROC.match(scheduler):
        return scheduler
    match = _ADDRESS.match(scheduler)
    if match is None or not 0 < int(match.group(1)) < 65536:
        raise ValueError(f"scheduler must be 'local' or a scheduler address such as 'tcp://10.0.0.5:8786' "
                         f"(protocol {', '.join(PROTOCOLS[:-1])} or {PROTOCOLS[-1]}; a port), got {scheduler!r}")
    return scheduler


def _distributed():
    try:
        import distributed  # deferred: distributed is the optional extra mdboost[dask]
    except ImportError as err:  # the optional extra is not installed
        raise ImportError("a Dask cluster needs the 'distributed' package: pip install 'mdboost[dask]'") from err
    return distributed


class _SlowExit(logging.Filter):
    """Drops the nanny's "Worker process still alive after 4.0 seconds, killing" warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "still alive after" not in record.getMessage()


def _close_quietly(cluster) -> None:
    """Close a local cluster. Its nannies give each worker 4 s to exit, then kill it; a worker
    that has imported torch often needs longer on a loaded machine. Every task has returned by
    then (shards are written and renamed before their job returns), so the kill loses nothing
    and its warning is dropped."""
    nanny, quiet = logging.getLogger("distributed.nanny"), _SlowExit()
    nanny.addFilter(quiet)
    try:
        cluster.close()
    finally:
        nanny.removeFilter(quiet)


def _handshake(address: str, timeout: float) -> None:
    """Open a comm to ``address`` and read its handshake within ``timeout`` s, or raise ``OSError``.

    ``distributed.Client(address, timeout=...)`` bounds only the TCP connect: its handshake read
    has no deadline, so a service that is not a Dask scheduler (an HTTP server, the dashboard's
    port, a proxy) either hangs it for ever (it never answers the binary frames) or answers bytes
    read as a frame length (``HTTP/1.1`` is 3.5e18 bytes: a ``MemoryError``). This runs
    distributed's own ``connect`` in a thread of its own, under one overall deadline."""
    from distributed.comm import connect  # deferred: distributed is the optional extra mdboost[dask]

    async def shake() -> None:
        comm = await asyncio.wait_for(connect(address, timeout=timeout), timeout)
        await comm.close()

    failure: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(shake())
        except BaseException as err:  # reported in the caller's thread
            failure.append(err)

    thread = threading.Thread(target=target, name="mdboost-scheduler-handshake", daemon=True)
    thread.start()
    thread.join(timeout + 5.0)  # wait_for has cancelled the read by then
    if thread.is_alive():
        raise OSError("no handshake")
    if failure:
        err = failure[0]
        if isinstance(err, (OSError, TimeoutError)):
            raise OSError(str(err) or "timed out") from None
        raise OSError(f"what answered is not a Dask scheduler: {type(err).__name__}: {err}") from None


@contextmanager
def dask_client(scheduler: str = LOCAL, n_workers: int = 1, *, timeout: float = CONNECT_TIMEOUT) -> Iterator:
    """The run's :class:`distributed.Client`, the default client while the block runs (module docstring).

    Parameters
    ----------
    scheduler : str, default="local"
        ``"local"``: a :class:`distributed.LocalCluster` of ``n_workers`` processes, one thread
        each, started here and closed at the end; else a scheduler address to connect to.
    n_workers : int, >= 1
        Workers of a ``"local"`` cluster (an address's cluster has the workers it has).
    timeout : float, default=30
        Seconds to wait for the scheduler of an address.

    Raises
    ------
    ValueError
        A bad ``scheduler`` or ``n_workers``.
    OSError
        No scheduler answered at the address within ``timeout`` (the message names it).
    """
    check_scheduler(scheduler)
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
        raise ValueError(f"n_workers must be an integer >= 1, got {n_workers!r}")
    distributed = _distributed()
    if scheduler == LOCAL:
        cluster = distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                           dashboard_address=None)
        try:
            with distributed.Client(cluster) as client:
                yield client
        finally:
            _close_quietly(cluster)
        return
    try:
        _handshake(scheduler, timeout)
        client = distributed.Client(scheduler, timeout=timeout)
    except (OSError, TimeoutError) as err:
        raise OSError(f"scheduler {scheduler!r}: no Dask scheduler answered within {timeout:g} s ({err})") from None
    with client:
        yield client
