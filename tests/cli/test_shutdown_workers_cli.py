"""Shutdown of ``signing-proxy run --workers N`` started the way a terminal starts it: the parent and
its workers in one process group, and a Ctrl-C (SIGINT to that whole group) drains what is in flight.

The parent forwards SIGTERM/SIGINT to its workers, and a worker takes a second signal during the
drain as "cut it short". A terminal's Ctrl-C reaches every worker directly *and* through the parent:
one keypress must count once.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from unittest import mock

import pytest
import requests

from signing_proxy.cli.run import DUPLICATE_SIGNAL_S
from tests.harness import WAIT_S, ProxyProcess, wait_for

pytestmark = pytest.mark.integration

ANSWER_AFTER_S = 1.5  # the origin's delay: the signal lands while the request waits for it
DRAIN_S = 30  # far longer than the origin's delay
IN_FLIGHT = 6  # requests, each on its own connection: the kernel spreads them over both workers
BODY = b"the slow origin's answer"
# Whether a worker sees the parent's copy before or after its drain begins is a race (measured on the
# old code: a group signal cut the drain in about 2 runs of 3): a few rounds make a miss unlikely.
GROUP_ROUNDS = 3


@contextmanager
def slow_origin() -> Iterator[tuple[int, threading.Semaphore]]:
    """An origin on 127.0.0.1 that answers ``BODY`` ``ANSWER_AFTER_S`` after a request arrives: its
    port, and a semaphore released once per request arrived."""
    arrived = threading.Semaphore(0)

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            arrived.release()
            time.sleep(ANSWER_AFTER_S)
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], arrived
    finally:
        server.shutdown()
        server.server_close()
        thread.join(WAIT_S)


@contextmanager
def workers_in_a_group(tmp_path: Path) -> Iterator[ProxyProcess]:
    """``run --workers 2`` as the leader of a new process group (as a shell starts a job), both
    workers listening; the group is SIGKILLed at the end if anything of it is left."""
    group_popen = functools.partial(subprocess.Popen, start_new_session=True)
    with (
        mock.patch("tests.harness.subprocess.Popen", group_popen),
        ProxyProcess(tmp_path, {"timeouts": {"drain_s": DRAIN_S}}, extra_args=("--workers", "2")) as proxy,
    ):
        assert proxy.proc is not None
        pgid = proxy.proc.pid  # start_new_session: the proxy leads its own group
        try:
            wait_for(
                lambda: sum("listening on" in line for line in proxy.stderr_lines) >= 2,
                "both workers listening",
            )
            yield proxy
        finally:
            # only what we started: the group it leads (an ID still in use as a group's is never
            # given to a new process, and a group with no one left in it is ESRCH)
            with suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            proxy.proc.wait(WAIT_S)


@contextmanager
def in_flight(proxy_url: str, port: int, arrived: threading.Semaphore) -> Iterator[list[object]]:
    """``IN_FLIGHT`` requests through the proxy, each on a new connection, all waiting for the origin
    when this returns; after it, each one's response (or error) once all have ended."""
    outcome: list[object] = []

    def fetch() -> None:
        try:
            outcome.append(
                requests.get(f"http://127.0.0.1:{port}/slow", proxies={"http": proxy_url}, timeout=WAIT_S)
            )
        except requests.RequestException as exc:
            outcome.append(exc)

    clients = [threading.Thread(target=fetch, daemon=True) for _ in range(IN_FLIGHT)]
    for client in clients:
        client.start()
    for _ in clients:
        assert arrived.acquire(timeout=WAIT_S), "a request never reached the origin"
    yield outcome
    for client in clients:
        client.join(WAIT_S)
    assert len(outcome) == IN_FLIGHT, "a client is still waiting"


@pytest.mark.parametrize(
    ("sig", "rounds", "whole_group"),
    [
        pytest.param(signal.SIGINT, GROUP_ROUNDS, True, id="ctrl-c: SIGINT to the group"),
        pytest.param(signal.SIGTERM, GROUP_ROUNDS, True, id="SIGTERM to the group"),
        pytest.param(signal.SIGTERM, 1, False, id="SIGTERM to the parent only"),
    ],
)
def test_one_signal_drains_the_requests_in_flight(
    tmp_path: Path, sig: signal.Signals, rounds: int, whole_group: bool
) -> None:
    for _ in range(rounds):
        with slow_origin() as (port, arrived), workers_in_a_group(tmp_path) as proxy:
            assert proxy.proc is not None
            with in_flight(proxy.url, port, arrived) as outcome:
                if whole_group:
                    os.killpg(proxy.proc.pid, sig)
                else:
                    proxy.proc.send_signal(sig)
                try:
                    code = proxy.proc.wait(WAIT_S)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"still running {WAIT_S} s after one {sig.name}")
        answers = [(a.status_code, a.content) if isinstance(a, requests.Response) else a for a in outcome]
        assert answers == [(200, BODY)] * IN_FLIGHT, proxy.stderr_lines
        assert code == 0, proxy.stderr_lines
        assert not any("cut short" in line for line in proxy.stderr_lines), proxy.stderr_lines


def test_a_second_ctrl_c_during_the_drain_ends_it_at_once(tmp_path: Path) -> None:
    with slow_origin() as (port, arrived), workers_in_a_group(tmp_path) as proxy:
        assert proxy.proc is not None
        with in_flight(proxy.url, port, arrived) as outcome:
            os.killpg(proxy.proc.pid, signal.SIGINT)
            wait_for(
                lambda: sum("shutting down" in line for line in proxy.stderr_lines) >= 2,
                "both workers draining",
            )
            time.sleep(DUPLICATE_SIGNAL_S + 0.1)  # a second keypress, not the parent's copy of the first
            os.killpg(proxy.proc.pid, signal.SIGINT)
            try:
                code = proxy.proc.wait(WAIT_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running {WAIT_S} s after the second Ctrl-C")
    assert code == 130, proxy.stderr_lines
    assert not any(isinstance(a, requests.Response) and a.content == BODY for a in outcome), outcome
    assert any("SIGINT during the drain: drain cut short" in line for line in proxy.stderr_lines)
