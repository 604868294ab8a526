"""Send one prepared request upstream and stream the answer back to the client, re-framed.

The response is written as it arrives (one write per upstream read), with backpressure both ways.
A caller may *hold* a response at its head (``hold``): the engine then drains the upstream body
unread and the caller writes its own answer instead. A caller may also *tap* a response
(``BodyTap``): a copy of its body, up to a bound, kept while it streams to the client and handed to
the caller's callback once complete, before the client can see its end. The engine never looks
inside. A pooled connection that the server had closed is retried once, for idempotent methods
only, with a freshly built request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..core.uri import Target
from ..errors import ProxyError
from .framing import HOP_BY_HOP, Outgoing, keep_piece
from .request import AbortConnection
from .server import ClientConnection
from .upstream import ResponseHead, UpstreamConnection, UpstreamPool

__all__ = [
    "HELD_BODY_MAX_BYTES",
    "BodyTap",
    "DrainSink",
    "ResponseStream",
    "forward",
]

HELD_BODY_MAX_BYTES = 1024 * 1024  # our choice: a held response's body is drained unread up to this, then cut
# RFC 9110 section 9.2.2: only these may be retried automatically (a POST may buy something twice)
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
_HOP_BY_HOP_B = frozenset(name.encode() for name in HOP_BY_HOP) | {b"content-length"}

Hold = Callable[[ResponseHead, Target], bool]


class BodyTap:
    """A copy of a forwarded response's head and body while it streams to the client, kept up to
    ``max_bytes``: past that the copy is dropped (``body()`` is None) and the client still gets all.
    ``on_complete`` hears of a complete response before its last bytes are written to the client."""

    __slots__ = ("_chunks", "head", "max_bytes", "on_complete", "overflowed", "size")

    def __init__(self, max_bytes: int, on_complete: Callable[[BodyTap], None] | None = None) -> None:
        self.max_bytes = max_bytes
        self.on_complete = on_complete
        self.head: ResponseHead | None = None
        self.size = 0
        self.overflowed = False
        self._chunks: list[bytes | bytearray] = []  # keep_piece: a tiny-chunked answer holds its size

    def reset(self) -> None:
        """Forget what was seen (a retried request starts a new response)."""
        self.head, self.size, self.overflowed = None, 0, False
        self._chunks.clear()

    def feed(self, data: bytes) -> None:
        if self.overflowed:
            return
        self.size += len(data)
        if self.size > self.max_bytes:
            self.overflowed = True
            self._chunks.clear()
        else:
            keep_piece(self._chunks, data)

    def body(self) -> bytes | None:
        """The body seen so far, or None when it outgrew ``max_bytes``."""
        return None if self.overflowed else b"".join(self._chunks)


class DrainSink:
    """Takes over an upstream connection after a held response's head: the body is read and
    dropped (the connection stays reusable), cut off above ``HELD_BODY_MAX_BYTES``; either way the
    exchange then counts as done, since the holder needs only the head."""

    __slots__ = ("conn", "done", "size")

    def __init__(self, conn: UpstreamConnection, done: asyncio.Future[None]) -> None:
        self.conn = conn
        self.done = done
        self.size = 0

    def on_head(self, head: ResponseHead) -> None:
        pass

    def on_body(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > HELD_BODY_MAX_BYTES:
            self.conn._fail(ProxyError(502, "response-too-large", "the held body is too large to drain"))

    def on_feed_end(self) -> None:
        pass

    def on_complete(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def on_fail(self, error: ProxyError) -> None:
        self.on_complete()  # the head arrived; a body cut short changes nothing the holder answers


class ResponseStream:
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
        "hold",
        "on_latency",
        "pending",
        "started",
        "status",
        "tap",
        "target",
        "upstream",
    )

    def __init__(
        self,
        client: ClientConnection,
        upstream: UpstreamConnection,
        target: Target,
        *,
        head_only: bool,
        hold: Hold | None,
        on_latency: Callable[[float], None] | None,
        tap: BodyTap | None = None,
    ) -> None:
        loop = client.loop
        self.client = client
        self.upstream = upstream
        self.head_only = head_only
        self.target = target
        self.hold = hold
        self.on_latency = on_latency
        self.tap = tap
        self.done: asyncio.Future[None] = loop.create_future()
        self.head_written = False
        self.held: ResponseHead | None = None  # a response the caller answers instead (never written)
        self.chunked = False
        self.close_after = False
        self.status = 0
        self.bytes_out = 0
        self.pending: list[bytes] = []  # written once per upstream read: one syscall, not three
        self.started = loop.time()  # just before the request goes upstream

    def on_head(self, head: ResponseHead) -> None:
        client = self.client
        if self.on_latency is not None:
            self.on_latency(self.client.loop.time() - self.started)
        self.status = head.status
        if self.hold is not None and self.hold(head, self.target):
            self.held = head
            self.upstream.sink = DrainSink(self.upstream, self.done)
            return
        if self.tap is not None:
            self.tap.head = head
        parts = [f"HTTP/1.1 {head.status} {head.reason}\r\n".encode("latin-1")]
        # RFC 9110 section 7.6.1: the fields a response's Connection names are hop-by-hop too
        drop = _HOP_BY_HOP_B | head.connection_named if head.connection_named else _HOP_BY_HOP_B
        parts.extend(
            name + b": " + value + b"\r\n" for name, value in head.headers if name.lower() not in drop
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
        if self.tap is not None:
            self.tap.feed(data)
        if self.chunked:
            self.pending.append(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self.pending.append(data)

    def on_feed_end(self) -> None:
        if self.pending:
            self.client.write(self.pending[0] if len(self.pending) == 1 else b"".join(self.pending))
            self.pending.clear()

    def on_complete(self) -> None:
        if self.tap is not None and self.tap.on_complete is not None:
            self.tap.on_complete(self.tap)  # before the client can see the end and act on it
        if self.chunked:
            self.pending.append(b"0\r\n\r\n")
        self.on_feed_end()
        if not self.done.done():
            self.done.set_result(None)

    def on_fail(self, error: ProxyError) -> None:
        self.on_feed_end()
        if not self.done.done():
            self.done.set_exception(error)


async def forward(
    client: ClientConnection,
    pool: UpstreamPool,
    outgoing: Outgoing,
    rebuild: Callable[[], Awaitable[Outgoing]] | None,
    *,
    hold: Hold | None = None,
    on_latency: Callable[[float], None] | None = None,
    tap: BodyTap | None = None,
) -> ResponseStream:
    """Send ``outgoing`` and stream the answer to ``client``; ``ProxyError`` before anything was written,
    ``AbortConnection`` after (with what was sent), or once the client has gone. A
    held response is returned with ``held`` set and nothing written; ``tap`` keeps a bounded copy of
    the body (of the last attempt). An idempotent request whose pooled connection was reset before
    any answer is sent again once: made anew by ``rebuild`` (a request signed here is signed again),
    or as it was when there is none (a request whose signature is the client's); never for a client
    that has gone."""
    head_only = outgoing.method == "HEAD"
    for attempt in (1, 2):
        conn = pool.take_idle(outgoing.connect_to)
        reused = conn is not None
        if conn is None:
            conn = await pool.connect(outgoing.connect_to)
        if tap is not None:
            tap.reset()
        stream = ResponseStream(
            client, conn, outgoing.target, head_only=head_only, hold=hold, on_latency=on_latency, tap=tap
        )
        client.upstream = conn  # reads what the client can take: paused while its writes are, and
        # then a client that reads nothing for client_idle_s is cut off (the upstream's read_s waits)
        conn.start(
            outgoing.head,
            outgoing.body,
            stream,
            head_only=head_only,
            stall=(client.engine.limits.client_idle_s, client.abort),
        )
        if client.write_paused:  # already: our earlier answers wait unread (pause_writing came before)
            conn.pause_reading()
        try:
            await stream.done
        except ProxyError as error:
            # The stream's future keeps ``error``, whose traceback keeps this frame: were the frame
            # to keep the stream too, the request, its body and both connections would wait in that
            # cycle for a full pass of the collector (which, start-up frozen, rarely comes).
            head_written, status, bytes_out = stream.head_written, stream.status, stream.bytes_out
            del stream  # (nor may it keep what it raises: no local holds the exception)
            if head_written:
                raise AbortConnection(status, bytes_out) from error
            if client.closed:  # it went (its connection_lost closed this upstream): nobody to answer,
                raise AbortConnection from error  # and a resend would fetch it again for nobody
            if attempt == 1 and reused and error.reason == "upstream-reset" and outgoing.method in IDEMPOTENT:
                if rebuild is not None:  # never for POST/PATCH: the first one may have been processed
                    outgoing = await rebuild()
                continue
            raise
        finally:
            client.upstream = None
        if client.closed:
            conn.reusable = False
        pool.release(conn)
        if stream.held is None:
            try:
                await client.drain()  # a client that reads nothing for client_idle_s is cut off
            except AbortConnection:
                raise AbortConnection(stream.status, stream.bytes_out) from None
        return stream
    raise AssertionError("unreachable")
