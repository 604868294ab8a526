"""Spec Errors: discovery answers "Status 403 with header X-Content-Rules", and nothing else. A 401
or a 404 carrying ``X-Content-Rules`` is the origin's answer to the agent: it passes through the
proxy untouched (status, body, fields; no ``Link`` added) and no manifest is fetched, in ``follow``
and in ``passthrough`` mode. The same edge's 403 is the control: there the proxy does act."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.harness import WAIT_S, ProxyProcess
from tests.proxy.raw_upstream import raw_backend, request_line

pytestmark = pytest.mark.integration

RULES = "see our manifest"  # no URL: the manifest is the origin's own /.well-known/svc.json
EDGE_BODY = b"the edge says no"


class Edge:
    """Answers /refuse-<status> with that status and ``X-Content-Rules``, anything else 404 without
    it; records the path of every request it receives."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.lock = threading.Lock()

    def serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(WAIT_S)
            line = request_line(conn)
            if line is None:
                return
            target = line.split(b" ")[1].decode()
            path = "/" + target.split("://", 1)[1].split("/", 1)[1] if "://" in target else target
            with self.lock:
                self.paths.append(path)
            status = int(path.removeprefix("/refuse-")) if path.startswith("/refuse-") else 404
            rules = f"X-Content-Rules: {RULES}\r\n" if path.startswith("/refuse-") else ""
            head = (
                f"HTTP/1.1 {status} Edge\r\nContent-Type: text/plain\r\nContent-Length: {len(EDGE_BODY)}\r\n"
                f"{rules}X-Edge: kept\r\nConnection: close\r\n\r\n"
            )
            conn.sendall(head.encode() + EDGE_BODY)

    def seen(self) -> list[str]:
        with self.lock:
            return list(self.paths)


@pytest.fixture
def edge() -> Iterator[tuple[Edge, int]]:
    served = Edge()
    with raw_backend(served.serve) as port:
        yield served, port


@pytest.mark.parametrize("mode", ["follow", "passthrough"])
def test_a_401_or_404_with_content_rules_passes_untouched_and_fetches_nothing(
    mode: str, tmp_path: Path, edge: tuple[Edge, int]
) -> None:
    served, port = edge
    with ProxyProcess(tmp_path, {"discovery": {"mode": mode}}) as proxy:
        proxies = {"http": proxy.url}
        for status in (401, 404):
            r = requests.get(f"http://127.0.0.1:{port}/refuse-{status}", proxies=proxies, timeout=WAIT_S)
            assert (r.status_code, r.content) == (status, EDGE_BODY)
            assert r.headers["Content-Type"] == "text/plain"
            assert r.headers["X-Content-Rules"] == RULES
            assert r.headers["X-Edge"] == "kept"
            assert "Link" not in r.headers
        assert served.seen() == ["/refuse-401", "/refuse-404"]  # the agent's requests, no manifest
        # the control: the same edge's 403 is discovery (follow fetches the manifest, passthrough links it)
        r = requests.get(f"http://127.0.0.1:{port}/refuse-403", proxies=proxies, timeout=WAIT_S)
    assert r.status_code == 403
    if mode == "follow":
        assert served.seen()[2:] == ["/refuse-403", "/.well-known/svc.json"]
    else:
        assert r.headers["Link"].startswith(f"<http://127.0.0.1:{port}/.well-known/svc.json>")
