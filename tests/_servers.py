"""Shared check of the UI tests: a signalled ``mdboost ui`` process leaves no server behind."""

from __future__ import annotations

import socket
import time

from mdboost.tracking import ui


def assert_stops_on(proc, url: str, port: int, sig) -> None:
    """Send ``sig`` to ``proc`` (an ``mdboost ui`` process serving ``url``): it exits with 0, the
    URL stops answering and the port is free again."""
    proc.send_signal(sig)
    assert proc.wait(60) == 0
    deadline = time.monotonic() + 30
    while ui._answers(url, timeout=1.0) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not ui._answers(url, timeout=1.0)
    with socket.socket() as sock:
        # SO_REUSEADDR: connections of the probes above may linger in TIME_WAIT; on Linux the
        # bind still fails while a socket listens on the port
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))  # nothing listens any more
