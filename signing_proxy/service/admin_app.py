"""The admin listener (``admin.listen``): ``/healthz``, ``/readyz``, ``/metrics`` (and the gateway's
``/providers``) on an aiohttp runner of its own, for clients in ``admin.allow_clients`` only.

Apart from ``admin.py`` so that aiohttp (about 25 MiB of a process's memory) is imported only by a
process that runs this listener (or the publication listener): ``service.app`` imports this module
when ``admin.listen`` is set.

The listener faces whoever can reach its port, so each connection is judged when it is accepted,
before aiohttp reads a byte of it (``gate.py``, shared with the publication listener and
``verify-origin``): a client outside ``admin.allow_clients`` gets its ``403`` at once and is closed
(``gate.REFUSING_MAX`` such answers leaving at once, the excess closed unanswered); no more than
``ADMIN_MAX_CONNECTIONS`` admitted connections are open at once (the excess is closed unanswered:
strangers never count against it); and a request head must arrive within ``ADMIN_IDLE_S`` of
connecting or of the last answer. aiohttp alone has no cap on connections: idle ones from anyone
held file descriptors until the proxy port had none left.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from ..config import AccessConfig
from ..errors import ProxyError, problem_body
from ..metrics import CONTENT_TYPE
from ..net.framing import problem_response
from ..proxy.access import AccessControl
from .admin import HEALTH, Readiness
from .gate import Gate, start_gated

__all__ = ["ADMIN_IDLE_S", "ADMIN_MAX_CONNECTIONS", "build_admin_app", "start_admin_listener"]

ADMIN_IDLE_S = 10.0  # our choice: a probe or a scrape sends its head at once; a keep-alive scrape reconnects
ADMIN_MAX_CONNECTIONS = 64  # our choice: probes and scrapers need a few; the excess is closed unanswered
_NOT_ALLOWED = ("client-not-allowed", "this address may not use the admin port (admin.allow_clients)")

_GATE = web.AppKey("admin_gate", Gate)


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
    gate = Gate(
        max_connections=ADMIN_MAX_CONNECTIONS,
        idle_s=ADMIN_IDLE_S,
        allowed=allowed,
        refusal=problem_response(ProxyError(403, *_NOT_ALLOWED), close=True),
    )
    refusal = problem_body(403, *_NOT_ALLOWED)

    @web.middleware
    async def only_allowed(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        transport = request.transport
        # refused at accept already (start_admin_listener); checked again for an app served otherwise
        peer = transport.get_extra_info("peername") if transport is not None else None
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
    admin[_GATE] = gate
    admin.router.add_get("/healthz", healthz)
    admin.router.add_get("/readyz", readyz)
    admin.router.add_get("/metrics", render)
    if providers is not None:
        listing = providers

        async def provider_states(_r: web.Request) -> web.Response:
            return web.json_response(listing(), headers={"Cache-Control": "no-store"})

        admin.router.add_get("/providers", provider_states)
    return admin


async def start_admin_listener(
    app: web.Application,
    host: str,
    port: int,
    *,
    reuse_port: bool,
    idle_s: float = ADMIN_IDLE_S,
    max_connections: int = ADMIN_MAX_CONNECTIONS,
) -> tuple[web.AppRunner, tuple[str, int]]:
    """Serve ``app`` (from :func:`build_admin_app`) on ``host:port``; the runner (``cleanup()``
    stops it) and the bound address. ``idle_s``: how long a connection may wait for a request head,
    first or next; ``max_connections``: how many may be open at once."""
    gate = app[_GATE]
    gate.idle_s, gate.max_connections = idle_s, max_connections
    # no lingering for a body nobody reads (aiohttp's 10 s): a stranger's unsent body would hold the
    # proxy's shutdown that long before it drains; the admin endpoints read no body
    runner = await start_gated(app, gate, host, port, reuse_port=reuse_port, lingering_time=0.0)
    addresses = runner.addresses
    bound = addresses[0][:2] if addresses else (host, port)
    return runner, (str(bound[0]), int(bound[1]))
