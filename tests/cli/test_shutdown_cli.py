"""Shutdown of ``signing-proxy run``: the first SIGTERM/SIGINT drains what is in flight, a second one
during the drain ends it at once (one log line, a non-zero exit status)."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
import requests

from tests.harness import WAIT_S, ProxyProcess, wait_for

pytestmark = pytest.mark.integration

DRAIN_S = 60  # far longer than the test waits for the process to end


@contextmanager
def silent_origin() -> Iterator[tuple[int, threading.Event]]:
    """An origin on 127.0.0.1 that accepts connections and never answers: its port, and an event
    set once a connection has arrived."""
    arrived = threading.Event()
    held: list[socket.socket] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        done = threading.Event()

        def accept() -> None:
            while not done.is_set():
                with suppress(TimeoutError):
                    held.append(server.accept()[0])
                    arrived.set()

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            yield server.getsockname()[1], arrived
        finally:
            done.set()
            thread.join(WAIT_S)
            for conn in held:
                conn.close()


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_second_signal_during_the_drain_ends_it_at_once(
    tmp_path: Path, sig: signal.Signals, status: int
) -> None:
    with (
        silent_origin() as (port, arrived),
        ProxyProcess(tmp_path, {"timeouts": {"drain_s": DRAIN_S}}) as proxy,
    ):
        assert proxy.proc is not None
        outcome: list[object] = []

        def fetch() -> None:  # in flight until the proxy closes it
            try:
                outcome.append(
                    requests.get(f"http://127.0.0.1:{port}/slow", proxies={"http": proxy.url}, timeout=WAIT_S)
                )
            except requests.RequestException as exc:
                outcome.append(exc)

        client = threading.Thread(target=fetch, daemon=True)
        client.start()
        assert arrived.wait(WAIT_S), "the request never reached the origin"
        proxy.proc.send_signal(sig)
        wait_for(lambda: any("shutting down" in line for line in proxy.stderr_lines), "the drain to start")
        started = time.monotonic()
        proxy.proc.send_signal(sig)
        try:
            code = proxy.proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still draining {WAIT_S} s after the second signal")
        assert time.monotonic() - started < WAIT_S
        assert code == status
        client.join(WAIT_S)
        assert outcome, "the client is still waiting"
    cut = [line for line in proxy.stderr_lines if "cut short" in line]
    assert len(cut) == 1, proxy.stderr_lines
    assert signal.Signals(sig).name in cut[0]
