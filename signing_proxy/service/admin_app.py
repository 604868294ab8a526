"""The admin listener (``admin.listen``): ``/healthz``, ``/readyz``, ``/metrics`` (and the gateway's
``/providers``) on an aiohttp runner of its own, for clients in ``admin.allow_clients`` only.

Apart from ``admin.py`` so that aiohttp (about 25 MiB of a process's memory) is imported only by a
process that runs this listener (or the publication listener): ``service.app`` imports this module
when ``admin.listen`` is set.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from ..config import AccessConfig
from ..errors import problem_body
from ..metrics import CONTENT_TYPE
from ..proxy.access import AccessControl
from .admin import HEALTH, Readiness

__all__ = ["build_admin_app", "start_admin_listener"]


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


async def start_admin_listener(
    app: web.Application, host: str, port: int, *, reuse_port: bool
) -> tuple[web.AppRunner, tuple[str, int]]:
    """Serve ``app`` on ``host:port``; the runner (``cleanup()`` stops it) and the bound address."""
    # no lingering for a body nobody reads (aiohttp's 10 s): a stranger's unsent body would hold the
    # proxy's shutdown that long before it drains; the admin endpoints read no body
    runner = web.AppRunner(app, access_log=None, handle_signals=False, lingering_time=0.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
    await site.start()
    addresses = runner.addresses
    bound = addresses[0][:2] if addresses else (host, port)
    return runner, (str(bound[0]), int(bound[1]))
