"""The accept-time gate of our aiohttp listeners that face strangers: the admin listener, the
publication listener and ``verify-origin``.

aiohttp keeps every connection it accepts, without a cap, and closes one that sends nothing only
after its keep-alive timeout (75 s by default): whoever reaches the port holds as many file
descriptors as it opens, and ``publish.listen`` runs in the proxy's process, whose port then has
none left (400 idle connections to the publication listener were all held). Here each connection
is judged when it is accepted, before aiohttp reads a byte of it (:class:`Gate`): with an
allow-list, a client outside it gets its ``403`` at once and is closed (``REFUSING_MAX`` such
answers leaving at once, the excess closed unanswered); no more than ``max_connections`` admitted
connections are open at once (the excess is closed unanswered: refused clients never count against
it); and a request head must arrive within ``idle_s`` of connecting (this gate's timer) or of the
last answer (aiohttp's keep-alive timeout, set to the same).

What aiohttp logs of these connections goes to ``signing_proxy.http`` (:data:`HTTP_LOGGER`), through
the handlers the process configured, one line a record: never its own ``aiohttp.server``, which
nobody configures, and whose records Python's last-resort handler wrote to stderr (a traceback quoting
a malformed request's header line, a token with it, in a blocking write: :class:`_OneLine`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ..logline import carried, line_of, say_only

__all__ = ["HTTP_LOGGER", "Gate", "GatedSite", "start_gated"]

HTTP_LOGGER = "signing_proxy.http"  # aiohttp's lines about our listeners' connections and requests

REFUSAL_LINGER_S = 1.0  # a refused client's request, sent as we answered, is discarded this long at most
REFUSING_MAX = 16  # our choice: refused connections answered at once; more are closed unanswered
REFUSAL_DISCARD_BYTES = 64 * 1024  # and this much: then the refused connection is closed anyway


class Gate:
    """Who may hold a connection, decided as it is accepted, before any of it is read.

    ``allowed``: whether a peer address may connect (``None``: every one may), and ``refusal`` the
    whole response written to one that may not."""

    def __init__(
        self,
        *,
        max_connections: int,
        idle_s: float,
        allowed: Callable[[str], bool] | None = None,
        refusal: bytes = b"",
    ) -> None:
        if allowed is not None and not refusal:
            raise ValueError("a gate with an allow-list needs the refusal it answers")
        self.allowed = allowed
        self.refusal = refusal
        self.idle_s = idle_s
        self.max_connections = max_connections
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

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """The application's first middleware (:func:`start_gated` puts it there): each request's
        arrival stops its connection's first-head timer."""
        self.arrived(request.transport)
        return await handler(request)

    def sweep(self) -> None:
        """Forget the first-head timers of connections closed before their head came: each held its
        transport and handler ``idle_s``, and strangers opening and dropping connections grew the
        map with their rate, whatever ``max_connections`` said."""
        for transport in [t for t in self.first_head if t.is_closing()]:
            self.first_head.pop(transport).cancel()

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

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        gate = self.gate
        server = gate.server
        if server is None:
            cast(asyncio.Transport, transport).abort()
            return
        if gate.allowed is not None:
            peer = transport.get_extra_info("peername")
            if not peer or not gate.allowed(str(peer[0])):  # the socket's peer, never a forwarded-for header
                # refused connections have a bound of their own: strangers never fill the admitted
                # ones' (probes locked out of /healthz would get a pod restarted); past it, closed
                # unanswered
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
        if len(gate.first_head) >= gate.max_connections:  # more than can be open: some are gone
            gate.sweep()
        gate.first_head[transport] = asyncio.get_running_loop().call_later(
            gate.idle_s, gate._expired, transport, handler
        )


class _Refused(asyncio.Protocol):
    """A client outside the gate's allow-list: its refusal is written before anything is read, then
    a half-close; what it sends meanwhile is discarded (closing with it unread would reset the
    connection and could destroy the answer), until it closes or ``REFUSAL_LINGER_S`` pass."""

    def __init__(self, gate: Gate) -> None:
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


class _OneLine(logging.Filter):
    """aiohttp's record of a request it could not read or serve, as one line: its own text (``Error
    handling request from CLIENT``), the exception's type and, for one raised in our handler, where.
    Its traceback and the exception's text quote the request (``BadHttpMessage`` shows the offending
    header line: ``Authorization: Bearer ...``) and ran over many lines past ``log.format: json``. A
    request aiohttp could not parse is the client's doing, not ours: ``info``, not ``error``."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = carried(record)
        text = line_of(record)  # aiohttp's own words (and the client's address), the exception's kind
        if isinstance(exc, _THE_CLIENTS):  # a stranger's bytes refused, or the stranger gone
            record.levelno, record.levelname = logging.INFO, "INFO"
        elif exc is not None and (where := _raised_at(exc)) is not None:  # a bug of ours
            text += f" at {where}"
        say_only(record, text)
        return record.levelno >= logging.getLogger(HTTP_LOGGER).getEffectiveLevel()


# aiohttp's parser refusing a client's bytes; a client that reset or left mid-body (read by our
# handler: it read as our bug, with a location, at error, for anyone to write into the log)
_THE_CLIENTS = (HttpProcessingError, ConnectionError, asyncio.IncompleteReadError)


def _raised_at(exc: BaseException) -> str | None:
    """Where ``exc`` was raised: file name, line and function, no value (no source read either)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return None
    code = tb.tb_frame.f_code
    return f"{Path(code.co_filename).name}:{tb.tb_lineno} in {code.co_name}"


logging.getLogger(HTTP_LOGGER).addFilter(_OneLine())


class GatedSite(web.BaseSite):
    """aiohttp's ``TCPSite``, its connections accepted through the gate's protocol factory."""

    __slots__ = ("_factory", "_host", "_port", "_reuse_address", "_reuse_port")

    def __init__(
        self,
        runner: web.BaseRunner,
        factory: Callable[[], asyncio.Protocol],
        host: str,
        port: int,
        *,
        reuse_port: bool,
        reuse_address: bool | None = None,
    ) -> None:
        super().__init__(runner)
        self._factory, self._host, self._port = factory, host, port
        self._reuse_address, self._reuse_port = reuse_address, reuse_port

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._factory,
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port or None,
        )


async def start_gated(
    app: web.Application,
    gate: Gate,
    host: str,
    port: int,
    *,
    reuse_port: bool,
    reuse_address: bool | None = None,
    **runner_options: Any,
) -> web.AppRunner:
    """Serve ``app`` on ``host:port`` through ``gate``; its runner (``cleanup()`` stops it, and is
    done here if the bind fails). ``runner_options``: more of ``web.AppRunner``'s keywords."""
    app.middlewares.insert(0, gate.middleware)  # before any middleware that may answer by itself
    app.on_shutdown.append(gate.close_all)
    # the keep-alive timeout bounds the wait for each head after the first (the gate bounds the first)
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        keepalive_timeout=gate.idle_s,
        logger=logging.getLogger(HTTP_LOGGER),
        **runner_options,
    )
    await runner.setup()
    gate.server = runner.server
    site = GatedSite(runner, gate.protocol, host, port, reuse_port=reuse_port, reuse_address=reuse_address)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
