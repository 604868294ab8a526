"""The engine's server side: one asyncio protocol per client connection, llhttp parsing, in order.

Each connection parses requests as bytes arrive (httptools) and hands them, in order, from one task
to a :class:`Handler`; the handler decides everything about a request (where it goes, whether it is
signed) and answers through the connection's write helpers. The engine knows nothing of signing,
routes or the app: it frames, bounds and moves bytes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import httptools

from ..core.uri import Target
from ..errors import ProxyError
from .framing import keep_piece, local_answer, problem_response
from .outbox import Outbox
from .refusals import parse_refusal, tell
from .request import AbortConnection, Limits, Request, busy, full, head_too_large, too_large
from .timers import TIMER_SLACK_S, Deadline

__all__ = ["ClientConnection", "Engine", "Handler"]

log = logging.getLogger("signing_proxy.proxy")

MAX_PARSED_AHEAD = 32  # our choice: pipelined requests parsed ahead of the one served; the rest waits
PIPELINED_SLICE_BYTES = 1024  # while requests wait, parsed this much at a time (57 heads at most)
LINGER_S = 2.0  # our choice (RFC 9112 section 9.6 gives none): how long a closing connection drains
LINGER_MIN_BYTES = 1024 * 1024  # and how much it discards before closing anyway: limits.max_body_bytes,
# at least this (a refused upload is read to its declared end, so its sender sees the answer, not a reset)


class Handler(Protocol):
    """What a connection calls: the policy above the engine (``net.refusals`` tells it the rest)."""

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
        # what tunnels, WebSocket pipes and TLS handshakes took over, counted by their owners: they
        # hold sockets like connections, so they count against limits.max_connections too
        self.taken_over: list[Callable[[], int]] = []
        self.buffered = 0  # request body bytes held by all connections (limits.max_buffered_bytes)
        self.refused = 0  # connections turned away at limits.max_connections

    def release(self, req: Request) -> None:
        """Give back what ``req``'s body held of the buffered budget; what still arrives is not kept."""
        self.buffered -= req.held
        req.held, req.released = 0, True

    def open_count(self) -> int:
        """Client connections open: served here, or taken over by a tunnel, a pipe or a handshake."""
        return len(self.connections) + sum(count() for count in self.taken_over)

    def protocol(self, tunnel: Target | None = None, credentials: str | None = None) -> ClientConnection:
        """A new connection; inside an intercepted CONNECT, ``tunnel`` is its scheme, host and port and
        ``credentials`` its ``Proxy-Authorization`` (checked again against a reload's rules)."""
        return ClientConnection(self, tunnel, credentials)

    def busy(self) -> bool:
        return any(c.busy for c in self.connections)

    def close_all(self) -> None:
        for conn in list(self.connections):
            conn.close()


class ClientConnection(asyncio.Protocol):
    """One client connection: parse, queue, serve through the handler, write."""

    def __init__(self, engine: Engine, tunnel: Target | None = None, credentials: str | None = None) -> None:
        self.engine = engine
        self.tunnel = tunnel  # inside an intercepted CONNECT: scheme, host and port of the tunnel
        self.client_ip = "-"
        self.client_allowed = False  # set by the handler, for the access rules in ``access_of``
        self.access_of: object = None  # the handler's access rules client_allowed was decided by
        self.tunnel_credentials = credentials  # inside a tunnel: the CONNECT's, for those rules
        self.keep_alive = True
        self.request_version = "1.1"
        self.upstream: Any = None  # the upstream connection of the exchange in flight (flow control)
        self._serving: Request | None = None  # the request in the handler's hands
        self.written = 0  # bytes written to the client, all exchanges
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._eof = False  # the client half-closed: answer what it sent, then close
        self._current: Request | None = None
        self._ready: deque[Request] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.loop = asyncio.get_running_loop()  # once: each call is a getpid(2)
        self._timer = Deadline(self.loop)  # every wait's limit, without a timer per wait
        self.outbox = Outbox(self.loop)  # what write() holds until the loop's pass ends
        self._closed = False
        self._head_fed = 0  # bytes handed to the parser since a request began or its body last moved
        self._upgraded = False  # CONNECT: the bytes after the head belong to the tunnel
        self._linger: asyncio.TimerHandle | None = None
        self._discarded = 0
        self.write_paused = False  # our answers wait in the transport past its high-water mark
        self._drain_waiter: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._reading_paused = False
        self._unparsed = b""  # read past MAX_PARSED_AHEAD queued requests: parsed as the queue drains

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def transport(self) -> asyncio.Transport | None:
        """The client's transport (its outbox's); None once a tunnel took it over."""
        return self.outbox.transport

    @property
    def busy(self) -> bool:
        """An exchange is in flight (graceful shutdown waits for it)."""
        return self._serving is not None

    # --- transport callbacks ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.outbox.attach(transport)
        peer = transport.get_extra_info("peername")
        self.client_ip = str(peer[0]) if peer else "-"
        engine = self.engine
        if engine.open_count() >= engine.limits.max_connections:
            engine.refused += 1
            self._closed = True
            self.write_problem(full(), close=True)
            self.close()
            return
        engine.handler.connection_made(self)
        engine.connections.add(self)
        self._task = engine.spawn(self._serve())

    def data_received(self, data: bytes) -> None:
        if self._closed:
            if self._linger is not None:
                self._discarded += len(data)
                if self._discarded > max(LINGER_MIN_BYTES, self.engine.limits.max_body_bytes):
                    self._end_linger()
            return
        if self._unparsed:  # what waits unparsed comes first
            data, self._unparsed = self._unparsed + data, b""
        limit = self.engine.limits.max_header_bytes
        chunk = b""
        try:
            while data:
                if len(self._ready) >= MAX_PARSED_AHEAD:  # parsed far enough ahead: the rest waits
                    self._unparsed = data  # reading is paused: nothing more arrives meanwhile
                    return
                step = PIPELINED_SLICE_BYTES if self._ready else len(data)  # pipelined: little at a time
                # A head is bounded while it arrives, and so is a chunked body's trailer section: never
                # more than the limit (and one read) is handed to the parser without body coming out of
                # it (it would buffer a field whole, however long, before calling us back).
                room = limit - self._head_fed
                if room <= 0:
                    raise head_too_large()
                chunk = data[: min(room, step)]
                self._head_fed += len(chunk)
                data = data[len(chunk) :]
                parser = self._parser
                if parser is None:
                    return
                parser.feed_data(chunk)
        except httptools.HttpParserUpgrade as exc:
            offset = exc.args[0] if exc.args else len(chunk)
            self._on_upgrade(chunk[offset:] + data)
        except (httptools.HttpParserError, ProxyError) as exc:
            self._protocol_error(exc)

    def eof_received(self) -> bool | None:
        if self._linger is not None:
            self._end_linger()  # the client has read our answer and finished: close now
            return None
        self._eof = True
        self._wake()
        self.outbox.flush()  # an answer written this pass (a local one, a refusal) leaves before the close
        # RFC 9112 section 9.6: a half-close after a complete request still gets its answer, then a close
        return True if (self._ready or self.busy) and not self._upgraded else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._parser = None  # the parser holds this protocol: break the cycle so both are freed at once
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        self._timer.cancel()
        self._unparsed = b""
        self.engine.connections.discard(self)
        for req in (*self._ready, *((self._current,) if self._current is not None else ())):
            self.engine.release(req)
        self._ready.clear()
        if self.upstream is not None:  # the client went away: stop fetching for it
            self.upstream.reusable = False
            self.upstream.close()
        self._wake()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.upstream is not None:
            self.upstream.resume_reading()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    # --- llhttp callbacks ---
    def on_message_begin(self) -> None:
        self._current = Request()
        self._head_fed = 0

    def on_url(self, url: bytes) -> None:
        assert self._current is not None
        self._current.add_url(url, self.engine.limits)

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self._current is not None
        self._current.add_field(name, value, self.engine.limits)

    def on_headers_complete(self) -> None:
        req = self._current
        assert req is not None
        req.head_done = True
        parser = self._parser
        assert parser is not None
        req.method = parser.get_method().decode("ascii", "replace")
        req.version = parser.get_http_version()
        req.keep_alive = parser.should_keep_alive()
        req.read_framing()
        engine = self.engine
        # a declared length is checked, not reserved: strangers' heads alone held the budget (each
        # body is charged as it arrives, so concurrent uploads still never pass it together)
        declared = req.content_length  # past max_body_bytes, read_body answers 413 before this
        if declared is not None and engine.buffered + declared > engine.limits.max_buffered_bytes:
            req.over_budget = True  # 503 at once, not once the body has arrived
        self._ready.append(req)
        if (self.busy or len(self._ready) > 1) and self.transport is not None and not self._reading_paused:
            self.transport.pause_reading()  # at most one request read ahead of the one in flight
            self._reading_paused = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._head_fed = 0  # the body moved: what follows it is bounded afresh
        req = self._current
        assert req is not None
        engine = self.engine
        size = len(body)  # every byte kept so far is charged: this piece is what is new
        req.body_size += size
        if req.too_large or req.over_budget or req.released:  # counted, not kept
            return
        if req.body_size > engine.limits.max_body_bytes:
            req.too_large = True
        elif engine.buffered + size > engine.limits.max_buffered_bytes:
            req.over_budget = True
        else:
            keep_piece(req.body, body)
            req.held += size
            engine.buffered += size
            return
        req.body.clear()  # stop buffering; the handler answers 413 or 503 and closes
        engine.release(req)
        self._wake()

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
        loop = self.loop
        deadline = loop.time() + limit_s
        try:
            while not condition():
                if self._closed or self._eof or loop.time() >= deadline - TIMER_SLACK_S:
                    return False
                self._timer.set(deadline, self._wake)
                self._waiter = loop.create_future()
                await self._waiter
            return True
        finally:
            self._waiter = None
            self._timer.clear()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.written += len(data)
            self.outbox.write(data)

    async def drain(self) -> None:
        """Wait for the client to read; one that reads nothing for ``client_idle_s`` is cut off."""
        if self.write_paused and not self._closed:
            self._drain_waiter = self.loop.create_future()
            try:
                await asyncio.wait_for(self._drain_waiter, self.engine.limits.client_idle_s)
            except TimeoutError:
                self.abort()
                raise AbortConnection from None

    def close(self) -> None:
        if self._linger is not None:
            return  # a lingering close ends by its own timer or the client's EOF
        if self.transport is not None and not self.transport.is_closing():
            self.outbox.close(self.engine.limits.client_idle_s)  # a client that reads nothing: aborted

    def linger(self) -> None:
        """Close after an answer the client may still be sending into (RFC 9112 section 9.6): half-close,
        discard what still arrives for up to ``LINGER_S``, then close; a plain close now would reset the
        connection and could destroy the answer in the client's receive buffer."""
        transport = self.transport
        if transport is None or transport.is_closing() or self._linger is not None:
            return
        self._closed = True  # nothing more is parsed or served
        if not transport.can_write_eof():
            self.outbox.close()
            return
        self.outbox.write_eof()
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        self._linger = self.loop.call_later(LINGER_S, self._end_linger)

    def _end_linger(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        self.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def take_over(self) -> asyncio.Transport | None:
        """Detach the transport (for a tunnel): this connection then closes nothing; None if gone."""
        raw, self._parser = self.outbox.release(), None  # the parser holds us: no cycle left behind
        self.engine.connections.discard(self)
        if raw is None or raw.is_closing():
            return None
        return raw

    def _protocol_error(self, exc: Exception, refused: Request | None = None) -> None:
        """Refuse what cannot be parsed (or ``refused``), once the requests read before it are answered."""
        cause = parse_refusal(exc)
        self._parser = None  # the stream cannot be trusted past this point: nothing more is parsed
        owner = refused or (
            self._current if self._current is not None and not self._current.complete else None
        )
        if owner is not None and owner in self._ready:  # refused: never served
            self._ready.remove(owner)
            self.engine.release(owner)
        method = owner.method if owner is not None else ""  # known once its head was read
        if owner is not None and owner is self._serving:  # its body: its handler logs it as it ends
            owner.refusal = cause
            self._refuse(cause, None)
            return
        if self._ready or (self._serving is not None and self._serving is not owner):
            self._ready.append(queued := Request(refusal=cause))  # RFC 9112 section 9.3.2: in its turn
            queued.method = method
            self._wake()
            return
        self._refuse(cause, method)

    def _refuse(self, cause: ProxyError, method: str | None) -> None:
        self.write_problem(cause, close=True, method=method)
        self.linger()
        self._closed = True
        self._wake()
        if method is not None:  # not one being served: its access line and its count
            tell(self.engine.handler, self.client_ip, cause, method)

    def _on_upgrade(self, rest: bytes) -> None:
        req = self._current
        if req is not None and req.method == "GET" and req.upgrades_to_websocket():
            req.upgrade = "websocket"  # RFC 6455 section 4.1: answered by the handler, then piped
        elif req is None or req.method != "CONNECT":
            self._protocol_error(
                ProxyError(400, "upgrade-not-supported", "only WebSocket upgrades (and CONNECT) are proxied"),
                req,
            )
            return
        req.complete = True
        req.body = [rest]  # bytes that followed the CONNECT head belong to the tunnel
        self._upgraded = True
        if self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    # --- answers the handler writes ---
    # an answer to HEAD is its head alone, Content-Length kept (RFC 9110 section 9.3.2): its body would
    # be read as the next response on a kept-alive connection
    def write_problem(self, error: ProxyError, *, close: bool = False, method: str | None = None) -> None:
        head_only = (method or (self._serving.method if self._serving is not None else "")) == "HEAD"
        self.write(problem_response(error, close=close or not self.keep_alive, head_only=head_only))

    def local_response(self, status: int, content_type: str, body: bytes) -> int:
        head_only = self._serving is not None and self._serving.method == "HEAD"
        self.write(local_answer(status, content_type, body, close=not self.keep_alive, head_only=head_only))
        return status

    async def read_body(self, req: Request) -> bytes:
        """The whole body, up to ``limits.max_body_bytes`` (413 above it), waited for while it keeps
        arriving (408 after ``limits.read_s`` without a byte of it, as nginx's client_body_timeout)."""
        limit = self.engine.limits.max_body_bytes
        if req.content_length is not None and req.content_length > limit:
            req.too_large = True
        if not (req.complete or req.too_large or req.over_budget):
            expect = req.header("expect")
            # RFC 9110 section 10.1.1: never a 100 (Continue) to an HTTP/1.0 client
            if expect is not None and expect.strip().lower() == "100-continue" and req.version == "1.1":
                self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            done = lambda: req.complete or req.too_large or req.over_budget  # noqa: E731
            arrived, ok = -1, False  # a body that arrived in full within one read_s was the rule
            while not ok and arrived != req.body_size:
                arrived = req.body_size
                ok = await self._wait(done, self.engine.limits.read_s)
            if not ok:  # silent for read_s, or gone
                silent = ProxyError(408, "request-timeout", "no byte of the body came for timeouts.read_s")
                raise AbortConnection if self._closed or self._eof else silent
        if req.too_large:
            raise too_large(limit)
        if req.over_budget:
            raise busy()
        body = b"".join(req.body)
        req.body = [body]  # the chunks are freed: one copy of the body is held, not two
        return body

    # --- serving ---
    async def _serve(self) -> None:
        try:
            idle_s = self.engine.limits.client_idle_s
            handler = self.engine.handler
            while not self._closed:
                if not await self._wait(lambda: bool(self._ready), idle_s):
                    break
                req = self._ready.popleft()
                if self._unparsed and len(self._ready) < MAX_PARSED_AHEAD:
                    self.data_received(b"")  # the rest of a read, now that the queue has room
                if req.refusal is not None:  # a broken request's turn: the answers before it are out
                    self._refuse(req.refusal, req.method)
                    break
                transport = self.transport
                if self._reading_paused and not self._ready and not self._upgraded and transport is not None:
                    self._reading_paused = False
                    transport.resume_reading()
                # after a CONNECT or Upgrade head no request follows: a tunnel, or closed after the answer
                self.keep_alive = req.keep_alive and not self._upgraded
                self.request_version = req.version
                self._serving = req
                try:
                    keep = await handler.serve(self, req)
                finally:
                    self._serving = None
                    self.engine.release(req)
                    req.body, req.headers = [], []  # served: an idle connection holds none of it
                if not keep:
                    break
                if self.write_paused:  # the next request waits until the client reads what it was sent
                    await self.drain()
        except AbortConnection:  # it read nothing for client_idle_s: cut off (drain)
            pass
        except Exception:  # a bug: log it, never leave the client hanging
            log.exception("unexpected error serving %s", self.client_ip)
        finally:
            current = self._current
            if current is not None and not current.complete and not self._upgraded:
                self.linger()  # the client may still be sending a body we refused
            else:
                self.close()
