"""WebSocket (RFC 6455) through the engine: send the handshake, then join the two connections.

The handshake is an ordinary GET that the policy has prepared (signed: ``@target-uri`` is the
``http(s)`` URI it is sent to); the engine adds the hop-by-hop ``Connection: Upgrade`` and
``Upgrade: websocket`` it needs on this hop (never covered by a signature), sends it on a fresh
connection, and reads the answer with the same bounds as any response head. A ``101`` switches
both sides to a byte pipe (``tunnel.BlindTunnel``: backpressure, half-close, idle timeout); a
``101`` without ``Upgrade: websocket`` and ``Connection: upgrade``, or without the one
``Sec-WebSocket-Accept`` the handshake's key asks for, is a 502 ``upstream-bad-response``, its
connection aborted and nothing piped (a server that never switched would read what the client sends
next as a request that no one signed or checked); one whose connection ended before the pipe could
take it over is relayed with the frames that came with it and then closed (a 502 ``upstream-reset``
when none came). Any other answer is relayed as a small response (a body over
``REFUSAL_BODY_MAX_BYTES`` is a 502 ``response-too-large`` instead, one the upstream cut short a 502
``upstream-reset``: never part of a body relayed as whole) and the client connection closes. Frames
are never read or changed.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import typing
from collections.abc import Callable
from dataclasses import dataclass

import httptools

from ..errors import ProxyError
from .framing import (
    HOP_BY_HOP,
    Outgoing,
    framed_interim,
    keep_piece,
    list_tokens_bytes,
    response_framing,
    response_head,
)
from .server import ClientConnection
from .tunnel import BlindTunnel
from .upstream import MAX_RESPONSE_HEAD_BYTES, UpstreamPool, ended_by_close_notify

__all__ = ["UPGRADE_FIELDS", "Switched", "accept_for", "switch"]

UPGRADE_FIELDS = b"Connection: Upgrade\r\nUpgrade: websocket\r\n"  # RFC 6455 section 4.1, this hop only
WEBSOCKET_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3
REFUSAL_BODY_MAX_BYTES = 64 * 1024  # our choice: a refused handshake's body is relayed up to this, or 502
_DROPPED = frozenset(name.encode() for name in HOP_BY_HOP - {"upgrade"}) | {b"content-length"}


@dataclass(frozen=True, slots=True)
class Switched:
    """The handshake's outcome: the status relayed to the client and whether the pipe now runs."""

    status: int
    piped: bool
    bytes_out: int


class _Handshake(asyncio.Protocol):
    """Reads the answer to a WebSocket handshake: its head (bounded), and the frames or body after it."""

    def __init__(self, max_head_bytes: int) -> None:
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes | bytearray] = []
        self.rest = b""  # frames that came with the 101, for the client
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self._fed = 0
        self._size = 0
        self._max_head = max_head_bytes
        self._ends_at_close = False  # a refusal with neither Content-Length nor chunked: EOF ends its body
        self._tls = False
        self._close_notified = False  # over TLS: the end carried close_notify (eof_received)
        self.lost = False  # connection_lost came here: a pipe taken over now would never hear of it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self._tls = transport.get_extra_info("ssl_object") is not None

    def data_received(self, data: bytes) -> None:
        if self.done.done():  # frames read before the pipe took over: kept for the client, in order
            self.rest += data
            return
        chunk, parser = b"", self._parser
        assert parser is not None  # dropped only once done
        try:
            while data and not self.done.done():  # fed in pieces, like any response head: a body that
                room = self._max_head - self._fed  # came in the same read is never counted as head
                if room <= 0:
                    self._fail(
                        ProxyError(
                            502,
                            "upstream-header-too-large",
                            "upstream response head or trailers exceed the limit",
                        )
                    )
                    return
                if not self.status:  # a head, fed a line at a time: it ends where a piece does (llhttp
                    end = data.find(b"\n", 0, room)  # gives no offset when it stops after some 101s)
                    if end >= 0:
                        room = end + 1
                chunk, data = data[:room], data[room:]
                self._fed += len(chunk)  # since the head began or its body last moved: heads and trailers
                parser.feed_data(chunk)
        except httptools.HttpParserUpgrade as exc:
            self._switched((chunk[exc.args[0] :] if exc.args else b"") + data)
        except httptools.HttpParserError as exc:
            if self.status == 101:  # llhttp stops after every 101: as an upgrade when it saw both fields,
                self._switched(data)  # else as this plain error; the head ended with the piece fed
            else:
                self._fail(ProxyError(502, "upstream-bad-response", f"malformed handshake answer ({exc})"))

    def eof_received(self) -> bool | None:
        if self._tls:
            self._close_notified = ended_by_close_notify(self.transport)  # else a bare (forged) FIN
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.done.done():
            clean = exc is None and (self._close_notified or not self._tls)  # as UpstreamConnection
            if self._ends_at_close and clean:
                self.done.set_result(None)  # a close-delimited refusal: what arrived is its body
            else:  # during the head, before a framed refusal's body was whole, or cut by a reset or a
                # TLS end without close_notify (RFC 9112 section 9.8): never relayed as whole
                self._fail(ProxyError(502, "upstream-reset", "the upstream closed during the handshake"))

    def on_status(self, status: bytes) -> None:
        pass

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.status:  # after the head: chunked trailers, never relayed
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None  # while it feeds us
        self.status = self._parser.get_status_code()
        if 100 <= self.status < 200 and self.status != 101:  # an interim answer: the final one follows
            if framed_interim(self.status, self.headers):
                self._fail(ProxyError(502, "upstream-bad-response", "upstream framed an interim response"))
            self.status, self.headers = 0, []
            return
        if self.status == 101:
            if not _switches_to_websocket(self.headers):  # RFC 6455 section 4.1: the client MUST fail it
                self._fail(
                    ProxyError(
                        502,
                        "upstream-bad-response",
                        "a 101 without Upgrade: websocket and Connection: upgrade (RFC 6455 section 4.1)",
                    )
                )
            return
        try:  # as any response (net.upstream): a coding we cannot decode would reach the client as content
            length, chunked, _ = response_framing(self.headers)
        except ProxyError as error:
            self._fail(error)
            return
        self._ends_at_close = not chunked and length is None

    def on_body(self, body: bytes) -> None:
        self._fed = 0
        self._size += len(body)
        if self._size > REFUSAL_BODY_MAX_BYTES:
            # a 502, not the first part relayed: never a truncated body that looks complete (a length
            # would lie, and so would a close, which ends a close-delimited body as if it were whole);
            # the reason is the one every other upstream answer over its bound gets
            self._fail(
                ProxyError(
                    502,
                    "response-too-large",
                    f"the refusal of the handshake is larger than {REFUSAL_BODY_MAX_BYTES} bytes",
                )
            )
            return
        keep_piece(self.body, body)

    def on_message_complete(self) -> None:
        if self.status and not self.done.done():
            self.done.set_result(None)

    def _switched(self, rest: bytes) -> None:
        """The 101's head ended: what came after it is frames, kept for the client until the pipe
        takes the connection over (nothing more is read meanwhile)."""
        if self.done.done() and self.done.exception() is not None:
            return  # refused (a 101 without its fields): the connection is already aborted
        self.rest = rest
        if not self.done.done():
            self.done.set_result(None)
        if self.transport is not None:
            self.transport.pause_reading()

    def _fail(self, error: ProxyError) -> None:
        self._parser = None  # it holds us (its callbacks); we hold the error, and the error the frames
        if not self.done.done():  # it is raised through: the request, both connections (a cycle)
            self.done.set_exception(error)
            self.done.exception()  # retrieved here: the waiter re-raises it
        if self.transport is not None:
            self.transport.abort()


async def switch(
    client: ClientConnection,
    pool: UpstreamPool,
    outgoing: Outgoing,
    *,
    early: bytes,
    idle_s: float,
    on_finished: Callable[[BlindTunnel], None],
    pipes: set[BlindTunnel],
    max_head_bytes: int = MAX_RESPONSE_HEAD_BYTES,
) -> Switched:
    """Send the prepared handshake; on ``101`` join client and upstream, else relay the refusal.
    A pipe stays in ``pipes`` until it has finished (``on_finished`` takes it out).

    ``ProxyError`` when the upstream cannot be reached, answers garbage (a ``101`` without its
    RFC 6455 fields or the ``Sec-WebSocket-Accept`` its key asks for included), refuses at too great
    a length, or closes right after a ``101`` that nothing followed (nothing written yet); a 400 when
    the handshake carries no single ``Sec-WebSocket-Key`` to check that answer against.
    """
    keys = _values(_head_fields(outgoing.head), b"sec-websocket-key")
    if len(keys) != 1:  # net.request checked the client's; a Connection token may have dropped it since
        raise ProxyError(
            400,
            "upgrade-not-supported",
            "a WebSocket handshake carries exactly one Sec-WebSocket-Key (RFC 6455 section 4.1)",
        )
    accept = accept_for(keys[0])
    handshake = await pool.open(outgoing.connect_to, lambda: _Handshake(max_head_bytes))
    assert handshake.transport is not None
    upstream = handshake.transport
    upstream.write(outgoing.head[:-2] + UPGRADE_FIELDS + b"\r\n")
    try:
        await asyncio.wait_for(asyncio.shield(handshake.done), pool.read_timeout_s)
    except TimeoutError:
        upstream.abort()
        raise ProxyError(504, "upstream-timeout", "no answer to the WebSocket handshake in time") from None
    except ProxyError as error:  # raised with no frame of ours: the handshake (and its transport, whose
        upstream.abort()  # protocol it is) holds the error, which would hold the request through them
        del handshake, upstream
        raise error.with_traceback(None)  # noqa: B904 - nor wait_for's frame, which holds it too (3.11)
    if handshake.status == 101 and _values(handshake.headers, b"sec-websocket-accept") != [accept]:
        upstream.abort()  # RFC 6455 section 4.1: the client MUST fail it; before a frame is relayed
        raise ProxyError(
            502,
            "upstream-bad-response",
            "a 101 without the one Sec-WebSocket-Accept its key asks for (RFC 6455 section 4.1)",
        )
    fields = _end_to_end(handshake.headers)
    if handshake.status == 101 and (handshake.lost or upstream.is_closing()):
        # it ended while we woke (a reset, a FIN, TLS without close_notify): a pipe built on it now
        # would never hear of its end, and would hold its client and its place for good
        upstream.abort()
        if not handshake.rest:
            raise ProxyError(502, "upstream-reset", "the upstream closed the connection right after its 101")
        client.keep_alive = False  # what it sent after its 101 (its Close frame, say) is the client's
        client.write(response_head(101, [("Connection", "Upgrade"), *fields]) + handshake.rest)
        return Switched(101, piped=False, bytes_out=len(handshake.rest))
    if handshake.status != 101:
        upstream.close()
        body = b"".join(handshake.body)  # whole: a larger one was refused above
        if handshake.status not in (204, 304):  # RFC 9110 section 8.6: no Content-Length on these
            fields.append(("Content-Length", str(len(body))))
        kept = [(n, v) for n, v in fields if n.lower() != "upgrade"]
        client.keep_alive = False
        client.write(response_head(handshake.status, kept, close=True) + body)
        return Switched(handshake.status, piped=False, bytes_out=len(body))
    client.write(response_head(101, [("Connection", "Upgrade"), *fields]))  # this hop's, like the request's
    if handshake.rest:
        client.write(handshake.rest)
    raw = client.take_over()
    if raw is None:
        upstream.close()
        return Switched(101, piped=False, bytes_out=0)
    tunnel = BlindTunnel(client.client_ip, outgoing.target.authority, on_finished, idle_s=idle_s)
    pipes.add(tunnel)  # before it is attached: a pipe that ends at once is taken out, never left in
    tunnel.adopt_upstream(upstream)
    tunnel.attach_client(raw, early)
    return Switched(101, piped=True, bytes_out=len(handshake.rest))


def _switches_to_websocket(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a 101 says what RFC 6455 section 4.1 requires: ``Upgrade: websocket`` (nothing else)
    and ``upgrade`` among the ``Connection`` tokens, both ASCII case-insensitive."""
    upgrade: list[bytes] = []
    connection: set[bytes] = set()
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"upgrade":
            upgrade += list_tokens_bytes(value)
        elif lowered == b"connection":
            connection.update(list_tokens_bytes(value))
    return upgrade == [b"websocket"] and b"upgrade" in connection


def accept_for(key: bytes) -> bytes:
    """The ``Sec-WebSocket-Accept`` a ``101`` owes a handshake sent with ``key`` (RFC 6455 section
    4.2.2): base64 of the SHA-1 of the key and the GUID. Proof it read this handshake, not a secret."""
    return base64.b64encode(hashlib.sha1(key + WEBSOCKET_GUID, usedforsecurity=False).digest())


def _head_fields(head: bytes) -> list[tuple[bytes, bytes]]:
    """The field lines of a head we built for the wire (``Outgoing.head``), as name and value."""
    pairs = (line.partition(b":") for line in head.split(b"\r\n")[1:])
    return [(name, value) for name, colon, value in pairs if colon]


def _values(headers: list[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    """The values of every field line called ``name`` (lower case), without surrounding whitespace."""
    return [value.strip(b" \t") for field, value in headers if field.lower() == name]


def _end_to_end(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """The upstream answer's fields for the client: hop-by-hop ones dropped, with every field its
    ``Connection`` names (RFC 9110 section 7.6.1) except ``Upgrade``, which a 101 passes on."""
    named = {
        token
        for name, value in headers
        if name.lower() == b"connection"
        for token in list_tokens_bytes(value)
    }
    dropped = _DROPPED | (named - {b"upgrade"})
    return [(n.decode("latin-1"), v.decode("latin-1")) for n, v in headers if n.lower() not in dropped]
