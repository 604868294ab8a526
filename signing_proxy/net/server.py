"""The proxy port: one asyncio protocol per client connection, llhttp parsing, sequential exchanges.

Each connection parses requests as bytes arrive (httptools) and serves them in order from one
task: check access, resolve where the request goes (absolute-form target, a sidecar route, or the
proxy's own ``/healthz`` and ``/readyz``), buffer the body up to the limit, run the signing
pipeline, send upstream and stream the answer back. Nothing the pipeline refuses is forwarded;
every refusal is a problem+json response with a stable reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
import typing
from collections import deque
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import TYPE_CHECKING

import httptools

from ..core.errors import FieldError
from ..core.uri import Target, parse_absolute_uri, parse_authority
from ..errors import ProxyError, problem_body
from ..proxy.discovery import DrainSink
from .framing import HOP_BY_HOP, Outgoing
from .upstream import ResponseHead, UpstreamConnection

if TYPE_CHECKING:
    from ..service.app import ProxyApp

__all__ = ["ClientConnection"]

log = logging.getLogger("signing_proxy.proxy")

_HOP_BY_HOP_B = frozenset(name.encode() for name in HOP_BY_HOP) | {b"content-length"}
_MAX_PIPELINED = 8  # requests parsed ahead of the one being served before we stop reading
# RFC 9110 section 9.2.2: only these may be retried automatically (a POST may buy something twice)
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


class _Request:
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


class _AbortConnection(Exception):
    """The response already started; the only honest signal left is closing the connection."""


class _ResponseRelay:
    """Writes an upstream response to the client as it arrives, re-framed for the client."""

    __slots__ = (
        "bytes_out",
        "chunked",
        "client",
        "close_after",
        "done",
        "head_only",
        "head_written",
        "held",
        "pending",
        "started",
        "status",
        "target",
    )

    def __init__(self, client: ClientConnection, head_only: bool, target: Target) -> None:
        self.client = client
        self.head_only = head_only
        self.target = target
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.head_written = False
        self.held: ResponseHead | None = None  # a 403 that discovery answers instead (never written)
        self.chunked = False
        self.close_after = False
        self.status = 0
        self.bytes_out = 0
        self.pending: list[bytes] = []  # written once per upstream read: one syscall, not three
        self.started = time.perf_counter()  # created just before the request goes upstream

    def _hold(self, head: ResponseHead) -> bool:
        """A 403 with X-Content-Rules that discovery follows: nothing of it goes to the agent; the
        edge's body is drained and ``ClientConnection._forward`` writes discovery's answer instead."""
        discovery = self.client.app.discovery
        upstream = self.client._upstream
        if discovery is None or upstream is None or not discovery.holds(head, self.target):
            return False  # passthrough mode has added its Link to ``head``
        self.held = head
        upstream.sink = DrainSink(upstream, self.done)
        return True

    def on_head(self, head: ResponseHead) -> None:
        client = self.client
        client.app.metrics.upstream_latency.observe(time.perf_counter() - self.started)
        self.status = head.status
        if head.status == 403 and self._hold(head):
            return
        parts = [f"HTTP/1.1 {head.status} {head.reason}\r\n".encode("latin-1")]
        parts.extend(
            name + b": " + value + b"\r\n"
            for name, value in head.headers
            if name.lower() not in _HOP_BY_HOP_B
        )
        no_body = self.head_only or head.status in (204, 304)
        if head.content_length is not None and (not no_body or self.head_only):
            parts.append(b"Content-Length: %d\r\n" % head.content_length)
        elif not no_body:
            if client.request_version == "1.1":
                self.chunked = True
                parts.append(b"Transfer-Encoding: chunked\r\n")
            else:
                self.close_after = True  # an HTTP/1.0 client reads to EOF
        if self.close_after or not client.keep_alive:
            parts.append(b"Connection: close\r\n")
        parts.append(b"\r\n")
        self.head_written = True
        self.pending.append(b"".join(parts))

    def on_body(self, data: bytes) -> None:
        if not data:
            return
        self.bytes_out += len(data)
        if self.chunked:
            self.pending.append(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self.pending.append(data)

    def on_feed_end(self) -> None:
        if self.pending:
            self.client.write(self.pending[0] if len(self.pending) == 1 else b"".join(self.pending))
            self.pending.clear()

    def on_complete(self) -> None:
        if self.chunked:
            self.pending.append(b"0\r\n\r\n")
        self.on_feed_end()
        if not self.done.done():
            self.done.set_result(None)

    def on_fail(self, error: ProxyError) -> None:
        self.on_feed_end()
        if not self.done.done():
            self.done.set_exception(error)


class ClientConnection(asyncio.Protocol):
    """One agent connection to the proxy port."""

    def __init__(self, app: ProxyApp, tunnel: Target | None = None) -> None:
        self.app = app
        self.tunnel = tunnel  # inside an intercepted CONNECT: scheme, host and port of the tunnel
        self.transport: asyncio.Transport | None = None
        self.client_ip = "-"
        self.client_allowed = False
        self.keep_alive = True
        self.request_version = "1.1"
        self._parser = httptools.HttpRequestParser(self)
        self._current: _Request | None = None
        self._ready: deque[_Request] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._header_bytes = 0
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._upstream: UpstreamConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._reading_paused = False
        self.busy = False  # an exchange is in flight (graceful shutdown waits for it)

    # --- transport callbacks ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        peer = transport.get_extra_info("peername")
        self.client_ip = str(peer[0]) if peer else "-"
        self.client_allowed = self.app.access.client_allowed(self.client_ip)  # once, not per request
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.app.connections.add(self)
        self._task = self.app.spawn(self._serve())

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
        self.app.connections.discard(self)
        if self._upstream is not None:  # the agent went away: stop fetching for it
            self._upstream.reusable = False
            self._upstream.close()
        self._wake()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._upstream is not None:
            self._upstream.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._upstream is not None:
            self._upstream.resume_reading()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    # --- llhttp callbacks ---
    def on_message_begin(self) -> None:
        self._current = _Request()
        self._header_bytes = 0

    def on_url(self, url: bytes) -> None:
        assert self._current is not None
        self._current.url += url
        self._header_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self._current is not None
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self.app.config.limits.max_header_bytes:
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
        if len(self._ready) > _MAX_PIPELINED and self.transport is not None:
            self.transport.pause_reading()
            self._reading_paused = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        req = self._current
        assert req is not None
        req.body_size += len(body)
        if req.body_size > self.app.config.limits.max_body_bytes:
            req.too_large = True
            req.body.clear()  # stop buffering; we will answer 413 and close
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

    def _protocol_error(self, exc: Exception) -> None:
        cause = exc.__context__ if isinstance(exc.__context__, ProxyError) else exc
        if isinstance(cause, ProxyError):
            self._write_problem(cause)
        else:
            self._write_problem(ProxyError(400, "malformed-request", f"cannot parse the request ({exc})"))
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

    def _write_problem(self, error: ProxyError, *, close: bool = False, **extra: object) -> None:
        body = problem_body(error.status, error.reason, error.detail, **extra)
        head = [
            f"HTTP/1.1 {error.status} {_phrase(error.status)}\r\n",
            "Content-Type: application/problem+json\r\n",
            f"Content-Length: {len(body)}\r\n",
        ]
        head.extend(f"{name}: {value}\r\n" for name, value in error.headers)
        if close or not self.keep_alive:
            head.append("Connection: close\r\n")
        head.append("\r\n")
        self.write("".join(head).encode("latin-1") + body)

    # --- serving ---
    async def _serve(self) -> None:
        try:
            idle_s = self.app.config.timeouts.client_idle_s
            while not self._closed:
                if not await self._wait(lambda: bool(self._ready), idle_s):
                    break
                req = self._ready.popleft()
                if (
                    self._reading_paused
                    and len(self._ready) <= _MAX_PIPELINED // 2
                    and self.transport is not None
                ):
                    self._reading_paused = False
                    self.transport.resume_reading()
                self.busy = True
                try:
                    keep = await self._exchange(req)
                finally:
                    self.busy = False
                if not keep:
                    break
        except Exception:  # a bug: log it, never leave the agent hanging
            log.exception("unexpected error serving %s", self.client_ip)
        finally:
            self.close()

    async def _exchange(self, req: _Request) -> bool:
        """Serve one request; return whether the connection stays open."""
        self.keep_alive = req.keep_alive
        self.request_version = req.version
        started = time.perf_counter()
        outcome, status, keyid, host, sent_out = "error", 0, None, "-", 0
        try:
            if req.method == "CONNECT":  # refused (ProxyError) or the tunnel takes the transport over
                host = req.url.decode("latin-1")
                status, outcome = await self.app.handle_connect(self, req)
                return False
            target, local = self._resolve(req)
            host = target.host if target is not None else "-"
            if local is not None:
                status = local(req)
                outcome = "local"
                return self.keep_alive
            assert target is not None
            await self._read_body(req)
            body = b"".join(req.body)

            def build() -> Awaitable[Outgoing]:
                return self.app.prepare(
                    req.method, target, req.headers, body, framed=req.framed, client_ip=self.client_ip
                )

            outgoing = await build()
            keyid = outgoing.keyid
            relay = await self._forward(outgoing, req, build)
            status, sent_out = relay.status, relay.bytes_out
            outcome = "signed" if keyid else "unsigned"
            self.app.metrics_request(outcome)
            return self.keep_alive and not relay.close_after and not self.app.draining
        except ProxyError as error:
            status, outcome = error.status, error.reason
            self.app.metrics_request(error.reason)
            keep = (
                self.keep_alive
                and req.complete
                and not req.too_large
                and error.status not in (400, 403, 413, 431)
            )
            self.keep_alive = keep
            self._write_problem(error)
            return keep
        except _AbortConnection:
            outcome = "aborted"
            if self.transport is not None:
                self.transport.abort()
            return False
        finally:
            self.app.metrics.transferred(req.body_size, sent_out)
            if self.app.config.log.access_log:
                self.app.log_access(
                    client=self.client_ip,
                    method=req.method,
                    host=host,
                    status=status,
                    duration_ms=round((time.perf_counter() - started) * 1000, 2),
                    bytes_in=req.body_size,
                    bytes_out=sent_out,
                    keyid=keyid,
                    outcome=outcome,
                )

    def _resolve(self, req: _Request) -> tuple[Target | None, Callable[[_Request], int] | None]:
        """Where the request goes; access control happens here so no refused request reaches upstream."""
        if not self.client_allowed:
            raise ProxyError(
                403, "client-not-allowed", "this address may not use the proxy (access.allow_clients)"
            )
        raw = req.url.decode("latin-1")
        if self.tunnel is not None:
            if not raw.startswith("/"):
                raise ProxyError(400, "malformed-target", "requests inside a tunnel use origin-form targets")
            return self._target(lambda: self.tunnel.with_path_query(raw)), None  # type: ignore[union-attr]
        if raw.startswith("/"):
            path = raw.split("?", 1)[0]
            local = self.app.local_endpoint(path)
            if local is not None:
                return None, lambda r: local(self, r)
            self.app.access.check_proxy_auth(req.header("proxy-authorization"))
            route = self.app.route_for(raw)
            if route is None:
                raise ProxyError(404, "no-route", f"{path} is not a proxied URL or a configured route")
            return self._target(lambda: route), None
        self.app.access.check_proxy_auth(req.header("proxy-authorization"))
        return self._target(lambda: parse_absolute_uri(raw)), None

    @staticmethod
    def _target(build: Callable[[], Target]) -> Target:
        try:
            return build()
        except FieldError as exc:
            raise ProxyError(400, exc.reason, exc.detail) from None

    async def _read_body(self, req: _Request) -> None:
        limit = self.app.config.limits.max_body_bytes
        if req.too_large or (req.content_length is not None and req.content_length > limit):
            req.too_large = True
            raise ProxyError(
                413, "body-too-large", f"request body exceeds limits.max_body_bytes ({limit} bytes)"
            )
        if not req.complete:
            expect = req.header("expect")
            if expect is not None and expect.strip().lower() == "100-continue":
                self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            ok = await self._wait(lambda: req.complete or req.too_large, self.app.config.timeouts.read_s)
            if req.too_large:
                raise ProxyError(
                    413, "body-too-large", f"request body exceeds limits.max_body_bytes ({limit} bytes)"
                )
            if not ok:
                if self._closed:
                    raise _AbortConnection
                raise ProxyError(408, "request-timeout", "the request body did not arrive in time")

    async def _forward(
        self, outgoing: Outgoing, req: _Request, rebuild: Callable[[], Awaitable[Outgoing]]
    ) -> _ResponseRelay:
        """Send and stream the answer back; a pooled connection the server had closed is retried
        once with a freshly built (re-signed) request."""
        pool = self.app.pool
        for attempt in (1, 2):
            conn = pool.take_idle(outgoing.connect_to)
            reused = conn is not None
            if conn is None:
                conn = await pool.connect(outgoing.connect_to)
            relay = _ResponseRelay(self, head_only=req.method == "HEAD", target=outgoing.target)
            self._upstream = conn
            conn.start(
                outgoing.head + outgoing.body if outgoing.body else outgoing.head,
                relay,
                head_only=req.method == "HEAD",
            )
            try:
                await relay.done
            except ProxyError as error:
                if relay.head_written:
                    raise _AbortConnection from error
                if attempt == 1 and reused and error.reason == "upstream-reset" and req.method in _IDEMPOTENT:
                    outgoing = await rebuild()  # never for POST/PATCH: the first one may have been processed
                    continue
                raise
            finally:
                self._upstream = None
            if self._closed:
                conn.reusable = False
            pool.release(conn)
            if relay.held is not None:
                await self._answer_refusal(relay, relay.held)
            await self.drain()
            return relay
        raise AssertionError("unreachable")

    async def _answer_refusal(self, relay: _ResponseRelay, held: ResponseHead) -> None:
        """Write discovery's answer to a held 403 (status kept, Link, problem+json body)."""
        assert self.app.discovery is not None
        head, body = await self.app.discovery.refusal(held, relay.target, keep_alive=self.keep_alive)
        self.write(head if relay.head_only else head + body)
        relay.head_written = True
        relay.bytes_out = 0 if relay.head_only else len(body)

    def local_response(self, status: int, content_type: str, body: bytes) -> int:
        head = (
            f"HTTP/1.1 {status} {_phrase(status)}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\n"
        )
        if not self.keep_alive:
            head += "Connection: close\r\n"
        self.write((head + "\r\n").encode() + body)
        return status

    def local_json(self, status: int, doc: object) -> int:
        return self.local_response(
            status, "application/json", json.dumps(doc, separators=(",", ":")).encode()
        )


def _resolve_future(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _phrase(status: int) -> str:
    try:
        return str(HTTPStatus(status).phrase)
    except ValueError:
        return "Unknown"


def parse_connect_target(raw: str) -> tuple[str, int]:
    """CONNECT's authority-form target -> (host, port); a port is required."""
    if ":" not in raw.rsplit("]", 1)[-1]:
        raise ProxyError(400, "malformed-target", "CONNECT needs host:port")
    try:
        return parse_authority(raw, "https")
    except FieldError as exc:
        raise ProxyError(400, exc.reason, exc.detail) from None
