"""Health, readiness and metrics: on the proxy port as origin-form paths, and on the admin listener.

The proxy port answers ``/healthz``, ``/readyz`` and ``/metrics`` itself; a separate admin port
lets a sidecar keep its proxy port on pod-loopback while the kubelet probes and Prometheus scrapes
from outside the pod. Both serve the same documents, nothing else, and nothing secret; the admin
port answers only ``admin.allow_clients`` (loopback when empty) and refuses others with ``403``.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from .. import __version__
from ..metrics import CONTENT_TYPE
from ..net.request import Request
from ..net.server import ClientConnection
from ..proxy.exchange import LocalEndpoint

__all__ = ["HEALTH", "Readiness", "local_endpoints"]

HEALTH = {"status": "ok", "version": __version__}
Readiness = Callable[[], tuple[int, dict[str, object]]]


def local_endpoints(
    readiness: Readiness, metrics: Callable[[], bytes]
) -> Callable[[str], LocalEndpoint | None]:
    """The proxy port's own paths: a lookup from an origin-form path to its answer."""

    def healthz(conn: ClientConnection, _req: Request) -> int:
        return _json(conn, 200, HEALTH)

    def readyz(conn: ClientConnection, _req: Request) -> int:
        return _json(conn, *readiness())

    def render(conn: ClientConnection, _req: Request) -> int:
        return conn.local_response(200, CONTENT_TYPE, metrics())

    table: dict[str, LocalEndpoint] = {"/healthz": healthz, "/readyz": readyz, "/metrics": render}
    return table.get


def _json(conn: ClientConnection, status: int, doc: object) -> int:
    return conn.local_response(status, "application/json", json.dumps(doc, separators=(",", ":")).encode())
