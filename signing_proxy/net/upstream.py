"""Upstream HTTP/1.1: pooled keep-alive connections, exact bytes out, responses streamed back.

A request goes out as the bytes the pipeline serialized (nothing re-encodes the URL or adds a
header after signing). The response is parsed with llhttp (httptools) and handed, chunk by chunk,
to a ``ResponseSink`` — the client connection — which writes it on at once. When the client
cannot keep up, the sink pauses this connection's reading, so memory stays flat for any size; the
client's idle limit, not the upstream's read timeout, then runs. A failed exchange's connection is
aborted: nothing of it (the unsent rest of a request body included) is owed to the upstream.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections import deque
from collections.abc import Callable
from typing import Protocol, TypeVar, cast

import httptools

from ..config import UpstreamConfig
from ..config.checks import host_form
from ..core.uri import Target
from ..errors import ProxyError
from .dial import open_upstream, upstream_tls_contexts
from .framing import framed_interim, response_framing
from .outbox import Outbox
from .timers import Deadline

__all__ = [
    "ResponseHead",
    "ResponseSink",
    "Stall",
    "UpstreamConnection",
    "UpstreamPool",
]

POOL_IDLE_S = 30.0  # close pooled connections idle this long (below common server keep-alive of 60-75 s)
MAX_RESPONSE_HEAD_BYTES = 64 * 1024  # limits.max_response_header_bytes default: above it, 502


# a byte no reason-phrase holds: 1*( HTAB / SP / VCHAR / obs-text )
_NOT_REASON = re.compile(rb"[^\t\x20-\x7e\x80-\xff]")


class ResponseHead:
    """Status line and field lines of an upstream response."""

    __slots__ = ("connection_named", "content_length", "headers", "keep_alive", "reason", "status", "version")

    def __init__(
        self,
        *,
        status: int,
        reason: str,
        version: str,
        headers: list[tuple[bytes, bytes]],
        content_length: int | None,
        keep_alive: bool,
        connection_named: frozenset[bytes] = frozenset(),
    ) -> None:
        self.status = status
        self.reason = reason
        self.version = version
        self.headers = headers
        self.content_length = content_length
        self.keep_alive = keep_alive
        self.connection_named = connection_named  # lower-case field names its Connection lists (hop-by-hop)


class ResponseSink(Protocol):
    """Receives a response as it arrives; implemented by the client side."""

    def on_head(self, head: ResponseHead) -> None: ...
    def on_body(self, data: bytes) -> None: ...
    def on_feed_end(self) -> None: ...
    def on_complete(self) -> None: ...
    def on_fail(self, error: ProxyError) -> None: ...


# How long reading may stay paused for a client that reads nothing (its client_idle_s), and the
# callback that then cuts that client off.
Stall = tuple[float, Callable[[], None]]


class _HeadTooLarge(Exception):
    """The upstream's response head passed ``max_head_bytes`` before it ended."""


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to one upstream origin, serving one exchange at a time."""

    _close_notified = False  # a TLS upstream's stream ended with close_notify (set by eof_received)

    def __init__(
        self, key: tuple[str, str, int], read_timeout_s: float, max_head_bytes: int = MAX_RESPONSE_HEAD_BYTES
    ) -> None:
        self.key = key
        self.read_timeout_s = read_timeout_s
        self.max_head_bytes = max_head_bytes  # limits.max_response_header_bytes: counted while it arrives
        self._head_fed = 0
        self.sink: ResponseSink | None = None
        self.reusable = False
        self.used = False  # a reused connection may have been closed by the server meanwhile
        self._parser: httptools.HttpResponseParser | None = None
        self._head_only = False
        self._status_reason = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_sent = False
        self._got_bytes = False
        self._close_delimited = False
        self._paused = False  # reading paused for a client that is not reading (its backpressure)
        self._stall: Stall | None = None  # what times such a client instead (``start``)
        # One deadline serves the read timeout while an exchange is in flight, then the pool's expiry.
        self._loop = asyncio.get_running_loop()  # once (made by the loop's factory): each call is a getpid(2)
        self._timer = Deadline(self._loop)
        self.outbox = Outbox(self._loop)  # requests leave at the end of the loop's pass
        self._on_expire: Callable[[UpstreamConnection], None] | None = None
        self.bytes_in = 0

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.outbox.transport

    # --- transport callbacks ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.outbox.attach(transport)

    def data_received(self, data: bytes) -> None:
        if self.sink is not None and not self._paused:  # the read timeout counts from now
            self._timer.push(self._loop.time() + self.read_timeout_s)
        self._got_bytes = True
        self.bytes_in += len(data)
        if self._parser is None:  # bytes while idle: the server is confused; never reuse
            self.reusable = False
            self.close()
            return
        try:
            while data:  # a head is bounded while it arrives, like a request head; so are trailers
                room = self.max_head_bytes - self._head_fed  # since the head began or the body moved
                if room <= 0:
                    raise _HeadTooLarge
                chunk, data = data[:room], data[room:]
                self._head_fed += len(chunk)
                parser: httptools.HttpResponseParser | None = self._parser  # feed_data may clear it
                if parser is None:  # a HEAD answer completes at its head: nothing more is parsed
                    break
                parser.feed_data(chunk)
        except _HeadTooLarge:
            self._fail(
                ProxyError(
                    502, "upstream-header-too-large", "upstream response head or trailers exceed the limit"
                )
            )
            return
        except httptools.HttpParserUpgrade:  # a 101 we never asked for (WebSockets use their own connection)
            self._fail(ProxyError(502, "upstream-bad-response", "upstream switched protocols unasked (101)"))
            return
        except httptools.HttpParserError as exc:
            self._fail(ProxyError(502, "upstream-bad-response", f"malformed response from upstream ({exc})"))
            return
        if self.sink is not None:
            self.sink.on_feed_end()

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._timer.cancel()
        self._parser = None  # it holds us (its callbacks): no cycle left for the full collector
        if self.sink is None:
            return
        if self._head_sent and self._close_delimited:  # its body ends at the close (RFC 9112
            # section 6.3 rule 8), but only at a clean one: a reset, or over TLS an end without
            # close_notify (a forged FIN, section 9.8), is a cut-off body that must not look whole
            if exc is None and (self.key[0] != "https" or self._close_notified):
                self._complete()
                return
            cause = "reset the connection" if exc is not None else "ended TLS without close_notify"
            self._fail(
                ProxyError(502, "upstream-reset", f"the upstream {cause} inside a close-delimited body")
            )
        elif not self._got_bytes:
            self._fail(
                ProxyError(502, "upstream-reset", "the upstream closed the connection before answering")
            )
        else:
            self._fail(ProxyError(502, "upstream-reset", "the upstream closed the connection mid-response"))

    def eof_received(self) -> bool | None:
        if self.key[0] == "https":  # asyncio reports a bare FIN here too; uvloop only close_notify
            self._close_notified = ended_by_close_notify(self.transport)
        return None  # the transport closes itself; connection_lost says what the end meant

    def pause_writing(self) -> None:  # request bodies are small enough to buffer; nothing to do
        pass

    def resume_writing(self) -> None:
        pass

    # --- llhttp callbacks ---
    def on_status(self, status: bytes) -> None:
        self._status_reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._head_sent:  # after the head: chunked trailers, never forwarded (we re-frame)
            self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None
        assert self.sink is not None
        status = parser.get_status_code()
        if not 100 <= status <= 599 or _NOT_REASON.search(self._status_reason):  # RFC 9112 section 4,
            # RFC 9110 section 15: we rebuild the status line, and a client would refuse this one
            self._fail(ProxyError(502, "upstream-bad-response", "upstream sent an invalid status line"))
            return
        if 100 <= status < 200:  # interim response: not forwarded; the final one follows
            if framed_interim(status, self._headers):  # its "content" would reach the client raw
                self._fail(ProxyError(502, "upstream-bad-response", "upstream framed an interim response"))
                return
            self._headers = []
            self._status_reason = b""
            return
        try:
            content_length, chunked, named = response_framing(self._headers)
        except ProxyError as error:  # a transfer coding we cannot decode
            self._fail(error)
            return
        no_body = self._head_only or status in (204, 304)
        self._close_delimited = not no_body and not chunked and content_length is None
        head = ResponseHead(
            status=status,
            reason=self._status_reason.decode("latin-1"),
            version=parser.get_http_version(),
            headers=self._headers,
            content_length=content_length,
            keep_alive=parser.should_keep_alive() and not self._close_delimited,
            connection_named=frozenset(named),
        )
        self.reusable = head.keep_alive
        self._head_sent = True
        self.sink.on_head(head)
        if self._head_only:  # llhttp would wait for Content-Length bytes that a HEAD answer never has
            self._parser = None
            self._complete()

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            if not self._head_sent:  # only a final response has content to forward
                self._fail(ProxyError(502, "upstream-bad-response", "upstream sent content before a head"))
                return
            self._head_fed = 0  # the body moved: what follows it (trailers) is bounded afresh
            self.sink.on_body(body)

    def on_message_complete(self) -> None:
        if self._head_sent:
            self._complete()

    # --- driving one exchange ---
    def start(
        self, head: bytes, body: bytes, sink: ResponseSink, *, head_only: bool, stall: Stall | None = None
    ) -> None:
        """Send one request (head, then body); the response goes to ``sink``. ``stall``: how long
        reading may stay paused for a client that reads nothing, and what then cuts that client off
        (without it the read timeout keeps running while paused)."""
        assert self.transport is not None
        self.sink = sink
        self._stall = stall
        self._parser = httptools.HttpResponseParser(self)
        self._head_only = head_only
        self._status_reason = b""
        self._headers = []
        self._head_sent = False
        self._head_fed = 0
        self._got_bytes = False
        self._close_delimited = False
        self._timer.set(self._loop.time() + self.read_timeout_s, self._timed_out)
        self.outbox.write(head)  # with a small body, one segment (the outbox joins them); a large
        if body:  # body goes at once after the head, never copied to join it
            self.outbox.write(body)

    def _timed_out(self) -> None:
        self.reusable = False
        self._fail(
            ProxyError(504, "upstream-timeout", f"no data from upstream for {self.read_timeout_s:g} s")
        )

    def _complete(self) -> None:
        sink, self.sink = self.sink, None
        self._parser, self._stall = None, None  # the stall's callback holds the client
        # an idle pooled connection holds nothing of the answer (a head of up to 64 KiB of short
        # lines is nearly a megabyte parsed, and the pool keeps up to 1,024 connections)
        self._headers, self._status_reason = [], b""
        self._timer.clear()
        if sink is not None:
            sink.on_complete()

    def _fail(self, error: ProxyError) -> None:
        """End the exchange in ``error``, and the connection at once: nothing of a failed exchange is
        owed to the upstream (the request body it has not read yet included, whose budget, from
        ``limits.max_buffered_bytes``, the engine gives back now)."""
        sink, self.sink = self.sink, None
        self._parser, self._stall = None, None
        self.reusable = False
        self._timer.cancel()
        if sink is not None:
            sink.on_fail(error)
        self.abort()

    def pooled(self, idle_s: float, on_expire: Callable[[UpstreamConnection], None]) -> None:
        """Idle in a pool from now: ``on_expire(self)`` after ``idle_s`` unless taken first."""
        self._on_expire = on_expire
        self._timer.set(self._loop.time() + idle_s, self._expire)

    def _expire(self) -> None:
        if self._on_expire is not None:
            self._on_expire(self)

    def pause_reading(self) -> None:
        """Stop reading for a client that cannot keep up. The upstream is not silent then, we do not
        listen: its read timeout stands down until ``resume_reading``, and the client's own limit
        (``start``'s ``stall``) runs instead."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
            self._paused = True
            if self.sink is not None and self._stall is not None:
                limit_s, cut_off = self._stall
                self._timer.set(self._loop.time() + limit_s, cut_off)

    def resume_reading(self) -> None:
        if self._paused and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
            if self.sink is not None and self._stall is not None:  # the upstream's silence counts again
                self._timer.set(self._loop.time() + self.read_timeout_s, self._timed_out)
        self._paused = False

    def close(self) -> None:
        """Close after what is written; abort instead when an exchange is in flight (its client went)."""
        if self.transport is not None and not self.transport.is_closing():
            if self.sink is not None:
                self.abort()
            else:
                self.outbox.close()

    def abort(self) -> None:
        """Drop the connection now, with whatever it still holds unsent."""
        self.outbox.abort()

    @property
    def is_usable(self) -> bool:
        return self.reusable and self.transport is not None and not self.transport.is_closing()


def ended_by_close_notify(transport: asyncio.Transport | None) -> bool:
    """Whether a TLS stream that reached its end carried close_notify.

    Neither event loop tells a close_notify from a bare TCP FIN to the protocol in words, but the
    session knows: after close_notify OpenSSL reads nothing more (an empty read), while after a bare
    FIN it still waits for bytes (``SSLWantReadError``), the stream it was reading having been cut.
    """
    sslobj = transport.get_extra_info("ssl_object") if transport is not None else None
    if sslobj is None:
        return False
    try:
        return cast(ssl.SSLObject, sslobj).read(1) == b""
    except ssl.SSLError:
        return False


_P = TypeVar("_P", bound=asyncio.Protocol)


class UpstreamPool:
    """Idle keep-alive connections per (scheme, host, port); opens new ones with bounded waits."""

    def __init__(
        self,
        config: UpstreamConfig,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        max_head_bytes: int = MAX_RESPONSE_HEAD_BYTES,
    ) -> None:
        self.max_head_bytes = max_head_bytes
        self.config = config
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._idle: dict[tuple[str, str, int], deque[UpstreamConnection]] = {}
        self._idle_count = 0  # connections in _idle (config.pool_max_idle)
        # pinned ones keyed, and looked up, by config.checks.host_form: any spelling finds its pin
        self._tls_default, self._tls_pinned = upstream_tls_contexts(config)  # ConfigError
        self.connections_opened = 0

    @property
    def idle_origins(self) -> int:
        """The (scheme, host, port) with idle connections kept: none is kept without one."""
        return len(self._idle)

    def _tls_for(self, host: str) -> ssl.SSLContext:
        if not self._tls_pinned:
            return self._tls_default
        return self._tls_pinned.get(host_form(host), self._tls_default)

    def take_idle(self, target: Target) -> UpstreamConnection | None:
        key = (target.scheme, target.host, target.port)
        queue = self._idle.get(key)
        while queue:
            conn = queue.pop()
            self._idle_count -= 1
            conn._timer.clear()
            if conn.is_usable:  # a reload's timeouts and head limit: for what it serves next too
                conn.read_timeout_s, conn.max_head_bytes = self.read_timeout_s, self.max_head_bytes
                return conn
        self._forget_if_empty(key)
        return None

    def _forget_if_empty(self, key: tuple[str, str, int]) -> None:
        """No idle connection to ``key`` left: its entry goes (clients choose the host names)."""
        if not self._idle.get(key, True):
            del self._idle[key]

    async def connect(self, target: Target) -> UpstreamConnection:
        key = (target.scheme, target.host, target.port)
        tls = self._tls_for(target.host) if target.scheme == "https" else None
        conn = await open_upstream(
            lambda: UpstreamConnection(key, self.read_timeout_s, self.max_head_bytes),
            target.host,
            target.port,
            tls=tls,
            timeout_s=self.connect_timeout_s,
        )
        self.connections_opened += 1
        return conn

    async def open(self, target: Target, factory: Callable[[], _P]) -> _P:
        """A fresh connection with this pool's TLS settings and connect timeout, never pooled (a
        protocol switch such as a WebSocket takes the connection over)."""
        tls = self._tls_for(target.host) if target.scheme == "https" else None
        protocol = await open_upstream(
            factory, target.host, target.port, tls=tls, timeout_s=self.connect_timeout_s
        )
        self.connections_opened += 1
        return protocol

    async def connect_vetted(self, target: Target, address: str) -> UpstreamConnection:
        """A fresh connection to ``address`` (vetted by ``net.egress``) speaking for ``target``'s host.

        SNI, certificate verification (``pin_ca_files`` by host) and ``Host`` are for the name. Never
        taken from nor given to the pool: the caller closes it after one exchange.
        """
        key = (target.scheme, target.host, target.port)
        conn = await open_upstream(
            lambda: UpstreamConnection(key, self.read_timeout_s, self.max_head_bytes),
            target.host,
            target.port,
            tls=self._tls_for(target.host) if target.scheme == "https" else None,
            timeout_s=self.connect_timeout_s,
            address=address,
        )
        self.connections_opened += 1
        return conn

    def release(self, conn: UpstreamConnection) -> None:
        """Return a connection after a complete exchange; keep it only if it may be reused."""
        conn.sink = None
        conn.used = True
        if not conn.is_usable:
            conn.close()
            self._forget_if_empty(conn.key)
            return
        queue = self._idle.setdefault(conn.key, deque())
        if len(queue) >= self.config.pool_max_idle_per_host or self._idle_count >= self.config.pool_max_idle:
            conn.close()
            self._forget_if_empty(conn.key)
            return
        conn.resume_reading()  # paused for a slow client of the last exchange: the next one reads
        queue.append(conn)
        self._idle_count += 1
        conn.pooled(POOL_IDLE_S, self._expire)

    def _expire(self, conn: UpstreamConnection) -> None:
        queue = self._idle.get(conn.key)
        if queue is not None and conn in queue:
            queue.remove(conn)
            self._idle_count -= 1
            self._forget_if_empty(conn.key)
        conn.close()

    def close(self) -> None:
        for queue in self._idle.values():
            for conn in queue:
                conn.close()
        self._idle.clear()
        self._idle_count = 0
