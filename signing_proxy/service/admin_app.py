"""The admin listener (``admin.listen``): ``/healthz``, ``/readyz``, ``/metrics`` (and the gateway's
``/providers``) on an aiohttp runner of its own, for clients in ``admin.allow_clients`` only.

Apart from ``admin.py`` so that aiohttp (about 25 MiB of a process's memory) is imported only by a
process that runs this listener (or the publication listener): ``service.app`` imports this module
when ``admin.listen`` is set.

The listener faces whoever can reach its port, so each connection is judged when it is accepted,
before aiohttp reads a byte of it (:class:`_Gate`): a client outside ``admin.allow_clients`` gets its
``403`` at once and is closed (``REFUSING_MAX`` such answers leaving at once, the excess closed
unanswered); no more than ``ADMIN_MAX_CONNECTIONS`` admitted connections are open at once (the excess
is closed unanswered: strangers never count against it); and a request head must arrive within
``ADMIN_IDLE_S`` of connecting or of the last answer. aiohttp alone waited for a first request
without limit: idle connections from anyone held file descriptors until the proxy port had none left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import cast

from aiohttp import web

from ..config import AccessConfig
from ..errors import ProxyError, problem_body
from ..metrics import CONTENT_TYPE
from ..net.framing import problem_response
from ..proxy.access import AccessControl
from .admin import HEALTH, Readiness

__all__ = ["ADMIN_IDLE_S", "ADMIN_MAX_CONNECTIONS", "build_admin_app", "start_admin_listener"]

ADMIN_IDLE_S = 10.0  # our choice: a probe or a scrape sends its head at once; a keep-alive scrape reconnects
ADMIN_MAX_CONNECTIONS = 64  # our choice: probes and scrapers need a few; the excess is closed unanswered
REFUSAL_LINGER_S = 1.0  # a refused client's request, sent as we answered, is discarded this long at most
REFUSING_MAX = 16  # our choice: refused connections answered at once; more are closed unanswered
REFUSAL_DISCARD_BYTES = 64 * 1024  # and this much: then the refused connection is closed anyway
_NOT_ALLOWED = ("client-not-allowed", "this address may not use the admin port (admin.allow_clients)")


class _Gate:
    """Who may hold an admin connection, decided as it is accepted, before any of it is read."""

    def __init__(self, allowed: Callable[[str], bool]) -> None:
        self.allowed = allowed
        self.refusal = problem_response(ProxyError(403, *_NOT_ALLOWED), close=True)
        self.idle_s = ADMIN_IDLE_S
        self.max_connections = ADMIN_MAX_CONNECTIONS
        self.server: web.Server | None = None  # aiohttp's, once the runner is set up
        self.refusing: set[_Refused] = set()  # refused connections still open (their answer leaving)
        self.first_head: dict[asyncio.BaseTransport, asyncio.TimerHandle] = {}  # before a first request

    def protocol(self) -> asyncio.Protocol:
        """The listener's protocol factory: the peer is known only once the connection is made."""
        return _Accepted(self)

    def arrived(self, transport: asyncio.BaseTransport | None) -> None:
        """A request reached the application: its connection's first head came in time. Later
        heads are aiohttp's keep-alive timeout's (``idle_s`` too)."""
        timer = self.first_head.pop(transport, None) if transport is not None else None
        if timer is not None:
            timer.cancel()

    def _expired(self, transport: asyncio.BaseTransport, handler: web.RequestHandler) -> None:
        self.first_head.pop(transport, None)
        handler.force_close()  # nothing was asked of it: closed (a no-op if it is gone already)

    async def close_all(self, _app: web.Application) -> None:
        """On the runner's shutdown: what aiohttp does not hold is closed too."""
        for refused in list(self.refusing):
            refused.close()
        for timer in self.first_head.values():
            timer.cancel()
        self.first_head.clear()


class _Accepted(asyncio.Protocol):
    """A connection just accepted: refused, closed, or handed to aiohttp's protocol (which then
    receives every callback: nothing stands between aiohttp and an admitted connection)."""

    def __init__(self, gate: _Gate) -> None:
        self.gate = gate

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        gate = self.gate
        server = gate.server
        peer = transport.get_extra_info("peername")
        if server is None:
            cast(asyncio.Transport, transport).abort()
            return
        if not peer or not gate.allowed(str(peer[0])):  # the socket's peer, never a forwarded-for header
            # refused connections have a bound of their own: strangers never fill the admitted ones'
            # (probes locked out of /healthz would get a pod restarted); past it, closed unanswered
            if len(gate.refusing) >= REFUSING_MAX:
                cast(asyncio.Transport, transport).abort()
            else:
                _Refused(gate).take(transport)
            return
        if len(server.connections) >= gate.max_connections:
            # too many open: closed at once, unanswered (a refused answer would hold the descriptor)
            cast(asyncio.Transport, transport).abort()
            return
        handler = server()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        gate.first_head[transport] = asyncio.get_running_loop().call_later(
            gate.idle_s, gate._expired, transport, handler
        )


class _Refused(asyncio.Protocol):
    """A client outside ``admin.allow_clients``: its ``403`` is written before anything is read,
    then a half-close; what it sends meanwhile is discarded (closing with it unread would reset the
    connection and could destroy the answer), until it closes or ``REFUSAL_LINGER_S`` pass."""

    def __init__(self, gate: _Gate) -> None:
        self.gate = gate
        self.transport: asyncio.Transport | None = None
        self.discarded = 0
        self.timer: asyncio.TimerHandle | None = None

    def take(self, transport: asyncio.BaseTransport) -> None:
        transport.set_protocol(self)
        self.connection_made(transport)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.transport = transport
        self.gate.refusing.add(self)
        transport.write(self.gate.refusal)
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self.timer = asyncio.get_running_loop().call_later(REFUSAL_LINGER_S, self.close)

    def data_received(self, data: bytes) -> None:
        self.discarded += len(data)
        if self.discarded > REFUSAL_DISCARD_BYTES:
            self.close()

    def eof_received(self) -> bool:
        return False  # the client read its answer and finished: the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.gate.refusing.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _GatedSite(web.BaseSite):
    """aiohttp's ``TCPSite``, its connections accepted through the gate's protocol factory."""

    __slots__ = ("_factory", "_host", "_port", "_reuse_port")

    def __init__(
        self,
        runner: web.BaseRunner,
        factory: Callable[[], asyncio.Protocol],
        host: str,
        port: int,
        *,
        reuse_port: bool,
    ) -> None:
        super().__init__(runner)
        self._factory, self._host, self._port, self._reuse_port = factory, host, port, reuse_port

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._factory, self._host, self._port, backlog=self._backlog, reuse_port=self._reuse_port or None
        )


_GATE = web.AppKey("admin_gate", _Gate)


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
    gate = _Gate(allowed)
    refusal = problem_body(403, *_NOT_ALLOWED)

    @web.middleware
    async def only_allowed(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        transport = request.transport
        gate.arrived(transport)
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
    admin.on_shutdown.append(gate.close_all)
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
    # proxy's shutdown that long before it drains; the admin endpoints read no body. The keep-alive
    # timeout bounds the wait for each head after the first (the gate bounds the first).
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, lingering_time=0.0, keepalive_timeout=idle_s
    )
    await runner.setup()
    gate.server = runner.server
    site = _GatedSite(runner, gate.protocol, host, port, reuse_port=reuse_port)
    await site.start()
    addresses = runner.addresses
    bound = addresses[0][:2] if addresses else (host, port)
    return runner, (str(bound[0]), int(bound[1]))
