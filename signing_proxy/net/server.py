"""The engine's server side: one asyncio protocol per client connection, llhttp parsing, in order.

Each connection parses requests as bytes arrive (httptools) and hands them, in order, from one task
to a :class:`Handler`; the handler decides everything about a request (where it goes, whether it is
signed) and answers through the connection's write helpers. The engine knows nothing of signing,
routes or the app: it frames, bounds and moves bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import typing
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import httptools

from ..core.errors import FieldError
from ..core.uri import Target, parse_authority
from ..errors import ProxyError
from .framing import problem_response, response_head

__all__ = [
    "AbortConnection",
    "ClientConnection",
    "Engine",
    "Handler",
    "Limits",
    "Request",
    "parse_connect_target",
]

log = logging.getLogger("signing_proxy.proxy")

MAX_PIPELINED = 8  # requests parsed ahead of the one being served before we stop reading


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds a connection enforces while it reads (``limits.*`` and ``timeouts.*``)."""

    max_header_bytes: int
    max_body_bytes: int
    client_idle_s: float
    read_s: float


class Request:
    """A request as parsed so far."""

    __slots__ = (
        "body",
        "body_size",
        "complete",
        "content_length",
        "framed",
        "headers",
        "keep_alive",
        "method",
        "too_large",
        "url",
        "version",
    )

    def __init__(self) -> None:
        self.url = b""
        self.method = ""
        self.version = "1.1"
        self.headers: list[tuple[str, str]] = []
        self.body: list[bytes] = []
        self.body_size = 0
        self.too_large = False
        self.complete = False
        self.keep_alive = True
        self.content_length: int | None = None
        self.framed = False  # the client sent Content-Length or Transfer-Encoding

    def header(self, name: str) -> str | None:
        lname = name.lower()
        for n, v in self.headers:
            if n.lower() == lname:
                return v
        return None


class AbortConnection(Exception):
    """The response already started; the only honest signal left is closing the connection."""


class Handler(Protocol):
    """What a connection calls: the policy above the engine."""

    def connection_made(self, conn: ClientConnection) -> None:
        """A client connected (``conn.client_ip`` is set); decide per-connection state once."""

    async def serve(self, conn: ClientConnection, req: Request) -> bool:
        """Answer ``req`` completely; return whether the connection stays open."""


class Engine:
    """The connections of one listener: the handler they call, their limits, and the live set."""

    def __init__(
        self,
        handler: Handler,
        limits: Limits,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
    ) -> None:
        self.handler = handler
        self.limits = limits  # replaced whole on a configuration reload
        self.spawn = spawn
        self.connections: set[ClientConnection] = set()

    def protocol(self, tunnel: Target | None = None) -> ClientConnection:
        """A new connection protocol; ``tunnel`` is the scheme, host and port of an intercepted CONNECT."""
        return ClientConnection(self, tunnel)

    def busy(self) -> bool:
        return any(c.busy for c in self.connections)

    def close_all(self) -> None:
        for conn in list(self.connections):
            conn.close()


class ClientConnection(asyncio.Protocol):
    """One client connection: parse, queue, serve through the handler, write."""

    def __init__(self, engine: Engine, tunnel: Target | None = None) -> None:
        self.engine = engine
        self.tunnel = tunnel  # inside an intercepted CONNECT: scheme, host and port of the tunnel
        self.transport: asyncio.Transport | None = None
        self.client_ip = "-"
        self.client_allowed = False  # set by the handler once per connection
        self.keep_alive = True
        self.request_version = "1.1"
        self.upstream: Any = None  # the upstream connection of the exchange in flight (flow control)
        self.busy = False  # an exchange is in flight (graceful shutdown waits for it)
        self._parser = httptools.HttpRequestParser(self)
        self._current: Request | None = None
        self._ready: deque[Request] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._header_bytes = 0
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._reading_paused = False

    @property
    def closed(self) -> bool:
        return self._closed

    # --- transport callbacks ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        peer = transport.get_extra_info("peername")
        self.client_ip = str(peer[0]) if peer else "-"
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.engine.handler.connection_made(self)
        self.engine.connections.add(self)
        self._task = self.engine.spawn(self._serve())

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._on_upgrade(data[exc.args[0] :] if exc.args else b"")
        except httptools.HttpParserError as exc:
            self._protocol_error(exc)

    def eof_received(self) -> bool | None:
        self._wake()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.engine.connections.discard(self)
        if self.upstream is not None:  # the client went away: stop fetching for it
            self.upstream.reusable = False
            self.upstream.close()
        self._wake()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.upstream is not None:
            self.upstream.resume_reading()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    # --- llhttp callbacks ---
    def on_message_begin(self) -> None:
        self._current = Request()
        self._header_bytes = 0

    def on_url(self, url: bytes) -> None:
        assert self._current is not None
        self._current.url += url
        self._header_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self._current is not None
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self.engine.limits.max_header_bytes:
            raise ProxyError(
                431, "header-too-large", "request header section exceeds limits.max_header_bytes"
            )
        self._current.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        req = self._current
        assert req is not None
        parser = self._parser
        req.method = parser.get_method().decode("ascii", "replace")
        req.version = parser.get_http_version()
        req.keep_alive = parser.should_keep_alive()
        for name, value in req.headers:
            lname = name.lower()
            if lname == "content-length":
                req.framed = True
                with contextlib.suppress(ValueError):
                    req.content_length = int(value)
            elif lname == "transfer-encoding":
                req.framed = True
        self._ready.append(req)
        if len(self._ready) > MAX_PIPELINED and self.transport is not None:
            self.transport.pause_reading()
            self._reading_paused = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        req = self._current
        assert req is not None
        req.body_size += len(body)
        if req.body_size > self.engine.limits.max_body_bytes:
            req.too_large = True
            req.body.clear()  # stop buffering; the handler answers 413 and closes
            self._wake()
        elif not req.too_large:
            req.body.append(body)

    def on_message_complete(self) -> None:
        if self._current is not None:
            self._current.complete = True
        self._wake()

    # --- plumbing ---
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, condition: Callable[[], bool], limit_s: float) -> bool:
        """Wait until ``condition()`` holds or the connection closes; False on timeout or close."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while not condition():
            if self._closed:
                return False
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(remaining, _resolve_future, waiter)  # cheaper than wait_for's task
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        return True

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    async def drain(self) -> None:
        if self._write_paused and not self._closed:
            self._drain_waiter = asyncio.get_running_loop().create_future()
            await self._drain_waiter

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def take_over(self) -> asyncio.Transport | None:
        """Detach the transport (for a tunnel): this connection then closes nothing; None if gone."""
        raw, self.transport = self.transport, None
        self.engine.connections.discard(self)
        if raw is None or raw.is_closing():
            return None
        return raw

    def _protocol_error(self, exc: Exception) -> None:
        cause = exc.__context__ if isinstance(exc.__context__, ProxyError) else exc
        if not isinstance(cause, ProxyError):
            cause = ProxyError(400, "malformed-request", f"cannot parse the request ({exc})")
        self.write_problem(cause, close=True)  # the stream cannot be trusted past this point
        self._closed = True
        self.close()
        self._wake()

    def _on_upgrade(self, rest: bytes) -> None:
        req = self._current
        if req is None or req.method != "CONNECT":
            self._protocol_error(
                ProxyError(400, "upgrade-not-supported", "protocol upgrades are not proxied")
            )
            return
        req.complete = True
        req.body = [rest]  # bytes that followed the CONNECT head belong to the tunnel
        if self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    # --- answers the handler writes ---
    def write_problem(self, error: ProxyError, *, close: bool = False) -> None:
        self.write(problem_response(error, close=close or not self.keep_alive))

    def local_response(self, status: int, content_type: str, body: bytes) -> int:
        fields = [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
        ]
        self.write(response_head(status, fields, close=not self.keep_alive) + body)
        return status

    def local_json(self, status: int, doc: object) -> int:
        return self.local_response(
            status, "application/json", json.dumps(doc, separators=(",", ":")).encode()
        )

    async def read_body(self, req: Request) -> bytes:
        """The whole body, up to ``limits.max_body_bytes`` (413 above it, 408 when it does not arrive)."""
        limit = self.engine.limits.max_body_bytes
        if req.too_large or (req.content_length is not None and req.content_length > limit):
            req.too_large = True
            raise ProxyError(
                413, "body-too-large", f"request body exceeds limits.max_body_bytes ({limit} bytes)"
            )
        if not req.complete:
            expect = req.header("expect")
            if expect is not None and expect.strip().lower() == "100-continue":
                self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            ok = await self._wait(lambda: req.complete or req.too_large, self.engine.limits.read_s)
            if req.too_large:
                raise ProxyError(
                    413, "body-too-large", f"request body exceeds limits.max_body_bytes ({limit} bytes)"
                )
            if not ok:
                if self._closed:
                    raise AbortConnection
                raise ProxyError(408, "request-timeout", "the request body did not arrive in time")
        return b"".join(req.body)

    # --- serving ---
    async def _serve(self) -> None:
        try:
            idle_s = self.engine.limits.client_idle_s
            handler = self.engine.handler
            while not self._closed:
                if not await self._wait(lambda: bool(self._ready), idle_s):
                    break
                req = self._ready.popleft()
                if (
                    self._reading_paused
                    and len(self._ready) <= MAX_PIPELINED // 2
                    and self.transport is not None
                ):
                    self._reading_paused = False
                    self.transport.resume_reading()
                self.keep_alive = req.keep_alive
                self.request_version = req.version
                self.busy = True
                try:
                    keep = await handler.serve(self, req)
                finally:
                    self.busy = False
                if not keep:
                    break
        except Exception:  # a bug: log it, never leave the client hanging
            log.exception("unexpected error serving %s", self.client_ip)
        finally:
            self.close()


def _resolve_future(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def parse_connect_target(raw: str) -> tuple[str, int]:
    """CONNECT's authority-form target -> (host, port); a port is required."""
    if ":" not in raw.rsplit("]", 1)[-1]:
        raise ProxyError(400, "malformed-target", "CONNECT needs host:port")
    try:
        return parse_authority(raw, "https")
    except FieldError as exc:
        raise ProxyError.of(exc) from None
