"""Health, readiness and metrics: on the proxy port as origin-form paths, and on the admin listener.

The proxy port answers ``/healthz``, ``/readyz`` and ``/metrics`` itself; a separate admin port
lets a sidecar keep its proxy port on pod-loopback while the kubelet probes and Prometheus scrapes
from outside the pod. Both serve the same documents, nothing else, and nothing secret; the admin
port answers only ``admin.allow_clients`` (loopback when empty) and refuses others with ``403``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from .. import __version__
from ..config import AccessConfig
from ..errors import problem_body
from ..metrics import CONTENT_TYPE
from ..net.server import ClientConnection, Request
from ..proxy.access import AccessControl
from ..proxy.exchange import LocalEndpoint

__all__ = ["HEALTH", "Readiness", "build_admin_app", "local_endpoints"]

HEALTH = {"status": "ok", "version": __version__}
Readiness = Callable[[], tuple[int, dict[str, object]]]


def local_endpoints(
    readiness: Readiness, metrics: Callable[[], bytes]
) -> Callable[[str], LocalEndpoint | None]:
    """The proxy port's own paths: a lookup from an origin-form path to its answer."""

    def healthz(conn: ClientConnection, _req: Request) -> int:
        return conn.local_json(200, HEALTH)

    def readyz(conn: ClientConnection, _req: Request) -> int:
        return conn.local_json(*readiness())

    def render(conn: ClientConnection, _req: Request) -> int:
        return conn.local_response(200, CONTENT_TYPE, metrics())

    table: dict[str, LocalEndpoint] = {"/healthz": healthz, "/readyz": readyz, "/metrics": render}
    return table.get


def build_admin_app(
    readiness: Readiness,
    metrics: Callable[[], bytes],
    *,
    allow_clients: Sequence[str] = (),
    providers: Callable[[], object] | None = None,
) -> web.Application:
    """The admin listener's aiohttp application; clients outside ``allow_clients`` (CIDRs; loopback
    when empty, as for the proxy port) get ``403 client-not-allowed``. ``providers``: the gateway's
    manifest watcher states, served at ``/providers``."""
    allowed = AccessControl(AccessConfig(allow_clients=tuple(allow_clients))).client_allowed
    refusal = problem_body(
        403, "client-not-allowed", "this address may not use the admin port (admin.allow_clients)"
    )

    @web.middleware
    async def only_allowed(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        if not peer or not allowed(str(peer[0])):  # the socket's peer, never a forwarded-for header
            return web.Response(status=403, body=refusal, content_type="application/problem+json")
        return await handler(request)

    async def healthz(_r: web.Request) -> web.Response:
        return web.json_response(HEALTH, headers={"Cache-Control": "no-store"})

    async def readyz(_r: web.Request) -> web.Response:
        status, doc = readiness()
        return web.json_response(doc, status=status, headers={"Cache-Control": "no-store"})

    async def render(_r: web.Request) -> web.Response:
        return web.Response(body=metrics(), headers={"Content-Type": CONTENT_TYPE})

    admin = web.Application(middlewares=[only_allowed])
    admin.router.add_get("/healthz", healthz)
    admin.router.add_get("/readyz", readyz)
    admin.router.add_get("/metrics", render)
    if providers is not None:
        listing = providers

        async def provider_states(_r: web.Request) -> web.Response:
            return web.json_response(listing(), headers={"Cache-Control": "no-store"})

        admin.router.add_get("/providers", provider_states)
    return admin
