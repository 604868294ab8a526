"""Shutdown of ``signing-proxy run --workers N`` started the way a terminal starts it: the parent and
its workers in one process group, and a Ctrl-C (SIGINT to that whole group) drains what is in flight.

A terminal's Ctrl-C reaches every worker directly *and* through the parent, which forwards what it
gets: one keypress must count once. The parent counts the signals (``service.workers``); a worker
takes SIGTERM/SIGINT only as "drain", and its drain is cut only when the parent got a second one.
No test here depends on timing: the origin answers when the test says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from tests.harness import WAIT_S, ProxyProcess, wait_for

pytestmark = pytest.mark.integration

DRAIN_S = 30  # far longer than any test waits: only the origin's answer (or a cut) ends a drain
IN_FLIGHT = 6  # requests, each on its own connection: the kernel spreads them over both workers
BODY = b"the slow origin's answer"
# A worker that saw the parent's copy of a group signal after its drain began took it as a second
# one (measured on that code: a group signal cut the drain in about 2 runs of 3): a few rounds.
GROUP_ROUNDS = 3


@contextmanager
def held_origin() -> Iterator[tuple[int, threading.Semaphore, threading.Event]]:
    """An origin on 127.0.0.1 that answers ``BODY`` once ``answer`` is set: its port, a semaphore
    released once per request arrived, and ``answer`` (set at the end in any case)."""
    arrived = threading.Semaphore(0)
    answer = threading.Event()

    class Held(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            arrived.release()
            answer.wait(WAIT_S)
            with suppress(BrokenPipeError, ConnectionResetError):  # a proxy that closed it (a cut)
                self.send_response(200)
                self.send_header("Content-Length", str(len(BODY)))
                self.end_headers()
                self.wfile.write(BODY)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Held)
    server.daemon_threads = False  # server_close() joins the handlers: none outlives the test
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], arrived, answer
    finally:
        answer.set()
        server.shutdown()
        server.server_close()
        thread.join(WAIT_S)


@contextmanager
def workers_in_a_group(tmp_path: Path) -> Iterator[ProxyProcess]:
    """``run --workers 2`` as the leader of a new process group (as a shell starts a job), both
    workers listening; the group is SIGKILLed at the end if anything of it is left."""
    config = {"timeouts": {"drain_s": DRAIN_S}}
    with ProxyProcess(tmp_path, config, extra_args=("--workers", "2"), own_group=True) as proxy:
        assert proxy.proc is not None
        pgid = proxy.proc.pid  # the proxy leads its own group
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


def draining(proxy: ProxyProcess) -> None:
    """Wait until both workers said their drain began."""
    wait_for(
        lambda: sum("shutting down" in line for line in proxy.stderr_lines) >= 2, "both workers draining"
    )


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
        with held_origin() as (port, arrived, answer), workers_in_a_group(tmp_path) as proxy:
            assert proxy.proc is not None
            with in_flight(proxy.url, port, arrived) as outcome:
                if whole_group:
                    os.killpg(proxy.proc.pid, sig)
                else:
                    proxy.proc.send_signal(sig)
                draining(proxy)
                answer.set()  # only now: the drain waits for it
                try:
                    code = proxy.proc.wait(WAIT_S)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"still running {WAIT_S} s after one {sig.name}")
        answers = [(a.status_code, a.content) if isinstance(a, requests.Response) else a for a in outcome]
        assert answers == [(200, BODY)] * IN_FLIGHT, proxy.stderr_lines
        assert code == 0, proxy.stderr_lines
        assert not any("cut short" in line for line in proxy.stderr_lines), proxy.stderr_lines


@pytest.mark.parametrize("whole_group", [True, False], ids=["ctrl-c twice", "SIGINT twice to the parent"])
def test_a_second_ctrl_c_during_the_drain_ends_it_at_once(tmp_path: Path, whole_group: bool) -> None:
    with held_origin() as (port, arrived, _answer), workers_in_a_group(tmp_path) as proxy:
        assert proxy.proc is not None

        def interrupt() -> None:
            assert proxy.proc is not None
            if whole_group:
                os.killpg(proxy.proc.pid, signal.SIGINT)
            else:
                proxy.proc.send_signal(signal.SIGINT)

        with in_flight(proxy.url, port, arrived) as outcome:
            interrupt()
            draining(proxy)
            interrupt()  # the origin has not answered: only the cut can end the drain
            try:
                code = proxy.proc.wait(WAIT_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running {WAIT_S} s after the second Ctrl-C")
    assert code == 130, proxy.stderr_lines
    assert not any(isinstance(a, requests.Response) and a.content == BODY for a in outcome), outcome
    cut = [line for line in proxy.stderr_lines if "SIGINT during the drain: drain cut short" in line]
    assert len(cut) == 1, proxy.stderr_lines  # the parent's line, once
