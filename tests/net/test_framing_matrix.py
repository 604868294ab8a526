"""Framing matrix (issue 16): how each way of framing an HTTP/1.x message crosses the proxy.

Modelled on h11's test matrix. Each row sends a client exchange through a real ``signing-proxy run``
to a raw asyncio origin that writes exactly the bytes given in the row. The client reads the
proxy's answers with h11, an independent and strict parser. Every row then checks four things: what
the client got (status, body, framing, interim answers), what the origin got (the signed request,
its body), the state of the connection afterwards (still usable, checked with a probe request, or
closed), and that the proxy logged no traceback.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import h11
import pytest

from signing_proxy.core.jwk import SigningKey
from tests.harness import WAIT_S, OnItsOwnLoop, ProxyProcess, VerifyingOrigin

pytestmark = pytest.mark.integration

KEY = SigningKey.generate()
CONTINUE_WAIT_S = 1.0  # how long an HTTP/1.0 client waits for a 100 Continue that must not come
MAX_BODY = 1024 * 1024  # limits.max_body_bytes of the proxy under test: an Expect above it gets 413


# --- the origin: exact bytes per request ---------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """What the origin writes for one request: ``pieces`` in order, ``gap_s`` apart; then maybe close."""

    pieces: tuple[bytes, ...]
    close: bool = False
    gap_s: float = 0.0
    delay_s: float = 0.0  # before the first piece (pipelining: a slow first answer must still come first)


def reply(*pieces: bytes, close: bool = False, gap_s: float = 0.0, delay_s: float = 0.0) -> Reply:
    return Reply(pieces, close, gap_s, delay_s)


def ok(body: bytes, *fields: str, status: str = "200 OK") -> Reply:
    """A Content-Length answer."""
    head = "".join(f"{f}\r\n" for f in fields)
    return reply(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode() + body)


def chunked(*chunks: bytes, tail: bytes = b"0\r\n\r\n") -> Reply:
    encoded = b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in chunks)
    return reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + encoded + tail)


@dataclass
class Seen:
    """One request as the origin read it."""

    method: str
    path: str
    lines: list[tuple[str, str]]
    body: bytes


class RawOrigin(OnItsOwnLoop):
    """An asyncio origin on its own thread: it reads requests (Content-Length bodies, which is all the
    proxy sends) and answers each with the ``Reply`` registered for its path."""

    thread_name = "raw-origin"

    def __init__(self) -> None:
        self.replies: dict[str, Reply] = {"/probe": ok(b"probe")}
        self.seen: list[Seen] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._writers: set[asyncio.StreamWriter] = set()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                request_line, *field_lines = head[:-4].split("\r\n")
                method, path, _ = request_line.split(" ")
                lines = [(n, v.strip()) for n, _, v in (f.partition(":") for f in field_lines)]
                length = next((int(v) for n, v in lines if n.lower() == "content-length"), 0)
                body = await reader.readexactly(length)
                self.seen.append(Seen(method, path, lines, body))
                answer = self.replies.get(path, ok(b"no reply registered", status="500 Oops"))
                await asyncio.sleep(answer.delay_s)
                for piece in answer.pieces:
                    writer.write(piece)
                    await writer.drain()
                    if answer.gap_s:
                        await asyncio.sleep(answer.gap_s)
                if answer.close:
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _shutdown(self, server: asyncio.Server) -> None:
        """Close the listener and every connection the proxy still pools, and end their tasks."""
        server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        server = loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self._shutdown(server))
        loop.close()


# --- the client: raw bytes out, h11 in -------------------------------------------------------------


@dataclass(frozen=True)
class Ex:
    """One request of a row and the origin's answer to it."""

    method: str
    reply: Reply
    body: bytes = b""
    version: str = "1.1"
    fields: tuple[str, ...] = ()  # extra field lines, as sent
    chunked: bool = False  # the body as chunks (3 bytes each, an extension, a trailer)
    expect_100: bool = False  # send the head, wait for 100 Continue (or up to CONTINUE_WAIT_S), then the body
    reaches_origin: bool = True


@dataclass(frozen=True)
class Want:
    """What the client must read for one request."""

    status: int
    body: bytes = b""
    framing: str | None = None  # length | chunked | close | none (HEAD, 204, 304)
    informational: tuple[int, ...] = ()  # interim (1xx) answers the client saw before the final one
    fields: tuple[tuple[str, str], ...] = ()  # present with exactly this value
    absent: tuple[str, ...] = ()  # field names that must not be there
    reason: str | None = None  # the problem+json reason of a refusal


# The upstream broke its framing after the head: the client must get a 502 (nothing written yet) or a
# message it can tell is incomplete (the connection aborted before the promised end), never a body
# that looks complete.
CUT = Want(status=-1)


@dataclass(frozen=True)
class Row:
    id: str
    exchanges: tuple[Ex, ...]
    wants: tuple[Want, ...]
    after: str = "open"  # open: a probe request on the same connection is answered; closed: EOF or reset
    send: str = "sequential"  # sequential | pipelined (all requests, one write) | bytewise (1 byte per send)
    half_close: bool = False  # shut our write side once every request is sent (and before reading)


@dataclass
class Answer:
    """One response as h11 read it from the proxy."""

    status: int = 0
    fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    informational: list[int] = field(default_factory=list)
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)
    end: str = "complete"  # complete | cut (EOF, reset or garbage before the end) | timeout
    error: str = ""  # what h11 said about a cut message

    def framing(self, method: str) -> str:
        if method == "HEAD" or self.status in (204, 304):
            return "none"
        if "chunked" in self.fields.get("transfer-encoding", "").lower():
            return "chunked"
        return "length" if "content-length" in self.fields else "close"


def request_bytes(ex: Ex, url: str, host: str) -> bytes:
    lines = [f"{ex.method} {url} HTTP/{ex.version}", f"Host: {host}", *ex.fields]
    explicit_length = any(f.lower().startswith("content-length:") for f in ex.fields)
    if ex.chunked:
        lines.append("Transfer-Encoding: chunked")
        pieces = [ex.body[i : i + 3] for i in range(0, len(ex.body), 3)]
        body = b"".join(b"%x;ext=1\r\n%b\r\n" % (len(p), p) for p in pieces) + b"0\r\nX-Trailer: t\r\n\r\n"
    else:
        if not explicit_length and (ex.body or ex.method in ("POST", "PUT")):
            lines.append(f"Content-Length: {len(ex.body)}")
        body = ex.body
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Client:
    """One connection to the proxy; answers are parsed with a fresh h11 connection each, fed the
    bytes the previous one left over."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.leftover = b""
        self.eof = False

    def send(self, data: bytes, *, bytewise: bool = False) -> None:
        if not bytewise:
            self.sock.sendall(data)
            return
        for i in range(len(data)):
            self.sock.sendall(data[i : i + 1])

    def _recv(self) -> bytes:
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        self.eof = self.eof or not data
        return data

    def readable_within(self, seconds: float) -> bool:
        return bool(self.leftover) or bool(select.select([self.sock], [], [], seconds)[0])

    def answer(self, method: str) -> Answer:
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=256 * 1024)
        # h11 reads a response only after a request; this one stands for what we sent (HEAD matters).
        conn.send(h11.Request(method=method, target="/", headers=[("Host", "x"), ("Content-Length", "0")]))
        conn.send(h11.EndOfMessage())
        if self.leftover:
            conn.receive_data(self.leftover)
        if self.eof:  # h11 takes b"" to mean EOF
            conn.receive_data(b"")
        self.leftover = b""
        got = Answer()
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                got.end, got.error = "cut", str(exc)
                return got
            if event is h11.NEED_DATA:
                try:
                    conn.receive_data(self._recv())
                except TimeoutError:
                    got.end = "timeout"
                    return got
            elif isinstance(event, h11.InformationalResponse):
                got.informational.append(event.status_code)
            elif isinstance(event, h11.Response):
                got.status = event.status_code
                got.fields = {n.decode().lower(): v.decode("latin-1") for n, v in event.headers}
            elif isinstance(event, h11.Data):
                got.body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                got.trailers = list(event.headers)
                self.leftover, closed = conn.trailing_data
                self.eof = self.eof or closed
                return got
            else:  # ConnectionClosed before any response
                got.end = "cut"
                return got

    def closed_by_peer(self) -> bool:
        """True once the proxy closed (EOF or reset) with nothing more sent; False if it sent bytes."""
        if self.leftover:
            return False
        if self.eof:
            return True
        try:
            return self._recv() == b""
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


# --- the matrix --------------------------------------------------------------------------------------

GET = "GET"
HELLO = ok(b"hello")
HOP = ("connection", "transfer-encoding", "keep-alive")

ROWS = [
    # HTTP/1.0 clients: never chunked, closed unless they asked for keep-alive
    Row("http1.0-close", (Ex(GET, HELLO, version="1.0"),), (Want(200, b"hello", "length"),), after="closed"),
    Row(
        "http1.0-close-chunked-upstream",
        (Ex(GET, chunked(b"hello", b" world"), version="1.0"),),
        (Want(200, b"hello world", "close"),),
        after="closed",
    ),
    Row(
        "http1.0-keep-alive-twice",
        (
            Ex(GET, HELLO, version="1.0", fields=("Connection: keep-alive",)),
            Ex(GET, ok(b"again"), version="1.0", fields=("Connection: keep-alive",)),
        ),
        (Want(200, b"hello", "length"), Want(200, b"again", "length")),
    ),
    Row(
        "http1.0-keep-alive-chunked-upstream",
        (Ex(GET, chunked(b"abc"), version="1.0", fields=("Connection: keep-alive",)),),
        (Want(200, b"abc", "close", fields=(("connection", "close"),)),),
        after="closed",
    ),
    Row(
        "http1.0-post",
        (Ex("POST", ok(b"posted"), body=b"payload", version="1.0"),),
        (Want(200, b"posted", "length"),),
        after="closed",
    ),
    Row(
        "http1.0-head",
        (Ex("HEAD", reply(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n"), version="1.0"),),
        (Want(200, b"", "none", fields=(("content-length", "99"),)),),
        after="closed",
    ),
    # HEAD, 204 and 304: a head and no body, whatever the framing fields say
    Row(
        "head-content-length",
        (Ex("HEAD", reply(b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n")),),
        (Want(200, b"", "none", fields=(("content-length", "1234"),)),),
    ),
    Row(
        "head-chunked",
        (Ex("HEAD", reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")),),
        (Want(200, b"", "none"),),
    ),
    Row("204-no-body", (Ex(GET, reply(b"HTTP/1.1 204 No Content\r\n\r\n")),), (Want(204, b"", "none"),)),
    Row(
        "204-content-length-0",
        (Ex("DELETE", reply(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")),),
        (Want(204, b"", "none"),),
    ),
    Row(
        "304-content-length",
        (Ex(GET, reply(b'HTTP/1.1 304 Not Modified\r\nContent-Length: 1234\r\nETag: "v1"\r\n\r\n')),),
        (Want(304, b"", "none", fields=(("etag", '"v1"'),)),),
    ),
    Row(
        "304-chunked",
        (Ex(GET, reply(b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n")),),
        (Want(304, b"", "none"),),
    ),
    # 1xx: 100-continue is the proxy's own answer to the client; the upstream's interim answers are dropped
    Row(
        "100-continue-client",
        (Ex("POST", ok(b"done"), body=b"after-100", fields=("Expect: 100-continue",), expect_100=True),),
        (Want(200, b"done", "length", informational=(100,)),),
    ),
    Row(
        "100-continue-body-too-large",
        (
            Ex(
                "POST",
                HELLO,
                fields=("Expect: 100-continue", f"Content-Length: {MAX_BODY + 1}"),
                expect_100=True,
                reaches_origin=False,
            ),
        ),
        (Want(413, reason="body-too-large"),),
        after="closed",
    ),
    Row(
        "100-continue-http1.0-ignored",  # RFC 9110 section 10.1.1: a server MUST ignore it from HTTP/1.0
        (
            Ex(
                "POST",
                ok(b"done"),
                body=b"x",
                version="1.0",
                fields=("Expect: 100-continue",),
                expect_100=True,
            ),
        ),
        (Want(200, b"done", "length"),),
        after="closed",
    ),
    Row(
        "103-early-hints-upstream",
        (
            Ex(
                GET,
                reply(
                    b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
                    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
                ),
            ),
        ),
        (Want(200, b"hello", "length", absent=("link",)),),
    ),
    Row(
        "1xx-several-upstream",
        (
            Ex(
                "POST",
                reply(
                    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n",
                    b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
                    b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
                    gap_s=0.01,
                ),
                body=b"b",
            ),
        ),
        (Want(201, b"ok", "length", absent=("link",)),),
    ),
    Row(
        "101-to-a-plain-get-upstream",  # a protocol switch nobody asked for is not a response to forward
        (Ex(GET, reply(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n")),),
        (Want(502, reason="upstream-bad-response"),),
    ),
    Row(
        "1xx-unlisted-upstream",  # an interim status llhttp has no name for still ends at its head
        (Ex(GET, reply(b"HTTP/1.1 150 Later\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")),),
        (Want(200, b"ok", "length"),),
    ),
    Row(
        # RFC 9112 section 6.3: a 1xx has no content; llhttp would read one here, and it would reach
        # the client as a response the upstream made up (a forged 200 for the client's next request)
        "1xx-with-content-length-upstream",
        (
            Ex(
                GET,
                reply(
                    b"HTTP/1.1 150 X\r\nContent-Length: 44\r\n\r\n"
                    b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged"
                    b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal"
                ),
            ),
        ),
        (Want(502, reason="upstream-bad-response"),),
    ),
    Row(
        "1xx-chunked-upstream",
        (
            Ex(
                GET,
                reply(
                    b"HTTP/1.1 104 X\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nforged\r\n0\r\n\r\n"
                    b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal"
                ),
            ),
        ),
        (Want(502, reason="upstream-bad-response"),),
    ),
    Row(
        "1xx-then-closed-upstream",  # nothing was forwarded yet: an honest 502
        (Ex("POST", reply(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", close=True), body=b"b"),),
        (Want(502, reason="upstream-reset"),),
    ),
    # response framing, re-framed for the client
    Row("content-length", (Ex(GET, HELLO),), (Want(200, b"hello", "length"),)),
    Row(
        "chunked-with-extensions-and-trailers",
        (
            Ex(
                GET,
                reply(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n"
                    b"5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 42\r\n\r\n"
                ),
            ),
        ),
        (Want(200, b"hello world", "chunked", absent=("trailer", "x-sum")),),
    ),
    Row("chunked-empty", (Ex(GET, chunked()),), (Want(200, b"", "chunked"),)),
    Row(
        "close-delimited-http1.1-upstream",
        (Ex(GET, reply(b"HTTP/1.1 200 OK\r\n\r\n", b"until ", b"close", close=True, gap_s=0.01)),),
        (Want(200, b"until close", "chunked"),),
    ),
    Row(
        "close-delimited-http1.0-upstream",
        (Ex(GET, reply(b"HTTP/1.0 200 OK\r\n\r\nold", close=True)),),
        (Want(200, b"old", "chunked"),),
    ),
    Row(
        "close-delimited-to-http1.0-client",
        (Ex(GET, reply(b"HTTP/1.1 200 OK\r\n\r\nraw", close=True), version="1.0"),),
        (Want(200, b"raw", "close"),),
        after="closed",
    ),
    Row(
        "response-in-1-byte-pieces",
        (
            Ex(
                GET,
                reply(
                    *(
                        bytes([b])
                        for b in b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
                    ),
                    gap_s=0.001,
                ),
            ),
        ),
        (Want(200, b"abc", "chunked"),),
    ),
    Row(
        "upstream-connection-close-is-hop-by-hop",
        (Ex(GET, reply(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok", close=True)),),
        (Want(200, b"ok", "length", absent=("connection",)),),
    ),
    Row(
        "client-half-close-after-request",  # e.g. `nc -N`: the request is complete, so it gets its answer
        (Ex(GET, HELLO, version="1.0"),),
        (Want(200, b"hello", "length"),),
        after="closed",
        half_close=True,
    ),
    Row(
        "client-half-close-after-pipelined-requests",
        (Ex(GET, ok(b"one")), Ex("POST", ok(b"two"), body=b"2")),
        (Want(200, b"one", "length"), Want(200, b"two", "length")),
        after="closed",
        half_close=True,
    ),
    Row(
        "client-connection-close",
        (Ex(GET, HELLO, fields=("Connection: close",)),),
        (Want(200, b"hello", "length", fields=(("connection", "close"),)),),
        after="closed",
    ),
    # upstream length mismatches: never a truncated body that looks complete
    Row(
        "content-length-longer-than-body",
        (Ex(GET, reply(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", close=True)),),
        (CUT,),
        after="closed",
    ),
    Row(
        "chunked-without-last-chunk",
        (Ex(GET, reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", close=True)),),
        (CUT,),
        after="closed",
    ),
    Row(
        "chunked-bad-size",
        (Ex(GET, reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n")),),
        (CUT,),
        after="closed",
    ),
    Row(
        "content-length-shorter-than-body",  # the excess is not the next answer on either connection
        (
            Ex(
                GET,
                reply(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 200 OK\r\n\r\nsmuggled"),
            ),
        ),
        (Want(200, b"hello", "length"),),
    ),
    Row(
        "conflicting-content-lengths",
        (Ex(GET, reply(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!")),),
        (Want(502, reason="upstream-bad-response"),),
    ),
    Row(
        "content-length-and-chunked",  # RFC 9112 section 6.3: "ought to be handled as an error"
        (
            Ex(
                GET,
                reply(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"5\r\nhello\r\n0\r\n\r\n"
                ),
            ),
        ),
        (Want(502, reason="upstream-bad-response"),),
    ),
    Row(
        "closed-before-answering",
        (Ex("POST", reply(close=True), body=b"once"),),
        (Want(502, reason="upstream-reset"),),
    ),
    Row(
        "closed-mid-head",
        (Ex("POST", reply(b"HTTP/1.1 200 OK\r\nContent-Le", close=True), body=b"once"),),
        (Want(502, reason="upstream-reset"),),
    ),
    Row(
        "garbage-status-line",
        (Ex(GET, reply(b"HELLO THERE\r\n\r\n", close=True)),),
        (Want(502, reason="upstream-bad-response"),),
    ),
    Row(
        "response-head-over-the-limit",
        (
            Ex(
                GET,
                reply(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (70 * 1024) + b"\r\nContent-Length: 0\r\n\r\n"),
            ),
        ),
        (Want(502, reason="upstream-header-too-large"),),
    ),
    # RFC 9110 section 7.6.1: the fields a response's Connection names are hop-by-hop too
    Row(
        "response-fields-named-in-connection-are-dropped",
        (Ex(GET, ok(b"ok", "Connection: X-Secret, keep-alive", "X-Secret: internal", "X-Kept: yes")),),
        (Want(200, b"ok", "length", fields=(("x-kept", "yes"),), absent=("x-secret",)),),
    ),
    # RFC 9110 sections 11.7.1 and 11.7.3: what a proxy on the way says applies to its next client only
    Row(
        "response-proxy-authentication-fields-are-dropped",
        (
            Ex(
                GET,
                ok(b"ok", 'Proxy-Authenticate: Basic realm="up"', "Proxy-Authentication-Info: nextnonce=1"),
            ),
        ),
        (Want(200, b"ok", "length", absent=("proxy-authenticate", "proxy-authentication-info")),),
    ),
    # RFC 9112 section 6.1: we send no TE and decode chunked only; any other coding is not content
    Row(
        "response-transfer-coding-gzip",
        (Ex(GET, reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nGZIPDATA", close=True)),),
        (Want(502, reason="upstream-bad-response"),),
    ),
    Row(
        "response-transfer-coding-chunked-then-gzip",
        (
            Ex(
                GET,
                reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nGZIPDATA", close=True),
            ),
        ),
        (Want(502, reason="upstream-bad-response"),),
    ),
    Row(
        "response-transfer-coding-gzip-then-chunked",
        (
            Ex(
                GET,
                reply(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n8\r\nGZIPDATA\r\n0\r\n\r\n"
                ),
            ),
        ),
        (Want(502, reason="upstream-bad-response"),),
    ),
    # pipelining: answered one by one, in order
    Row(
        "pipelined-in-order",
        (
            Ex(GET, reply(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst", delay_s=0.05)),
            Ex("POST", ok(b"second"), body=b"body"),
            Ex(GET, chunked(b"thi", b"rd")),
        ),
        (Want(200, b"first"), Want(200, b"second"), Want(200, b"third", "chunked")),
        send="pipelined",
    ),
    Row(
        "pipelined-mixed-framing",
        (
            Ex("HEAD", reply(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n")),
            Ex(GET, reply(b"HTTP/1.1 204 No Content\r\n\r\n")),
            Ex(GET, reply(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 50\r\n\r\n")),
            Ex(GET, reply(b"HTTP/1.1 200 OK\r\n\r\nclosed", close=True)),
            Ex("POST", HELLO, body=b"chunked body", chunked=True),
        ),
        (
            Want(200, b"", "none", fields=(("content-length", "50"),)),
            Want(204, b"", "none"),
            Want(304, b"", "none"),
            Want(200, b"closed", "chunked"),
            Want(200, b"hello", "length"),
        ),
        send="pipelined",
    ),
    Row(
        "pipelined-http1.0-keep-alive",
        (
            Ex(GET, ok(b"one"), version="1.0", fields=("Connection: keep-alive",)),
            Ex(GET, ok(b"two"), version="1.0", fields=("Connection: keep-alive",)),
        ),
        (Want(200, b"one", "length"), Want(200, b"two", "length")),
        send="pipelined",
    ),
    # request framing
    Row(
        "chunked-request-body",
        (Ex("POST", HELLO, body=b"a chunked request body", chunked=True),),
        (Want(200, b"hello", "length"),),
    ),
    Row(
        # RFC 9112 section 6.1: llhttp takes the chunked layer off and leaves gzip on; forwarded, the
        # compressed bytes went out signed and digested as if they were the content
        "gzip-then-chunked-request",
        (
            Ex(
                "POST",
                HELLO,
                body=b"compressed",
                chunked=True,
                fields=("Transfer-Encoding: gzip",),
                reaches_origin=False,
            ),
        ),
        (Want(501, reason="transfer-coding-not-implemented"),),
        after="closed",
    ),
    Row(
        "http1.0-chunked-request-keep-alive",  # RFC 9112 section 6.1: faulty framing; closed after the answer
        (
            Ex(
                "POST",
                ok(b"posted"),
                body=b"abc",
                version="1.0",
                chunked=True,
                fields=("Connection: keep-alive",),
            ),
        ),
        (Want(200, b"posted", "length"),),
        after="closed",
    ),
    Row(
        "declared-length-over-max-body-and-budget",  # permanent: 413, not a 503 that invites retries
        (Ex("POST", HELLO, fields=(f"Content-Length: {256 * 1024 * 1024}",), reaches_origin=False),),
        (Want(413, reason="body-too-large"),),
        after="closed",
    ),
    Row(
        "request-in-1-byte-pieces",
        (Ex(GET, HELLO, fields=("Accept: */*", "X-Long: " + "v" * 40)),),
        (Want(200, b"hello", "length"),),
        send="bytewise",
    ),
    Row(
        "chunked-request-in-1-byte-pieces",
        (Ex("POST", ok(b"got it"), body=b"one byte at a time", chunked=True),),
        (Want(200, b"got it", "length"),),
        send="bytewise",
    ),
]

CHECKER = VerifyingOrigin()  # not started: only its verify() (our verifier and the independent oracle)
CHECKER.trust(KEY)


@pytest.fixture(scope="module")
def origin() -> Iterator[RawOrigin]:
    with RawOrigin() as server:
        yield server


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    config = {"limits": {"max_body_bytes": MAX_BODY}, "log": {"access_log": False}}
    with ProxyProcess(tmp_path_factory.mktemp("framing"), config, key=KEY) as process:
        yield process


def check(answer: Answer, want: Want, method: str) -> None:
    if want is CUT:
        promised = answer.fields.get("content-length")
        if answer.end == "complete":
            assert answer.status == 502, f"a cut-off upstream body looked complete: {answer}"
        else:
            assert answer.end == "cut", answer
            assert promised is None or len(answer.body) < int(promised), answer
        return
    assert answer.end == "complete", answer
    assert answer.status == want.status, answer
    if want.reason is None:
        assert answer.body == want.body, answer
    assert answer.informational == list(want.informational), answer
    if want.framing is not None:
        assert answer.framing(method) == want.framing, answer
    for name, value in want.fields:
        assert answer.fields.get(name) == value, (name, answer)
    for name in want.absent:
        assert name not in answer.fields, (name, answer)
    assert not answer.trailers, answer
    if want.reason is not None:
        assert answer.fields.get("content-type") == "application/problem+json", answer
        assert json.loads(answer.body)["reason"] == want.reason


def exchange_one(client: Client, ex: Ex, raw: bytes, *, bytewise: bool) -> Answer:
    if not ex.expect_100:
        client.send(raw, bytewise=bytewise)
        return client.answer(ex.method)
    head, _, body = raw.partition(b"\r\n\r\n")
    client.send(head + b"\r\n\r\n")
    client.readable_within(CONTINUE_WAIT_S)  # a 100 Continue (or a refusal) comes at once; else go on
    if ex.reaches_origin:
        client.send(body)
    return client.answer(ex.method)


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_framing_matrix(row: Row, proxy: ProxyProcess, origin: RawOrigin) -> None:
    host = f"127.0.0.1:{origin.port}"
    paths = [f"/{row.id}/{i}" for i in range(len(row.exchanges))]
    for path, ex in zip(paths, row.exchanges, strict=True):
        origin.replies[path] = ex.reply
    raws = [request_bytes(ex, origin.url(p), host) for p, ex in zip(paths, row.exchanges, strict=True)]
    log_before = len(proxy.stderr_lines)
    client = Client(proxy.port)
    try:
        if row.send == "pipelined" or row.half_close:
            client.send(b"".join(raws))
            if row.half_close:
                client.sock.shutdown(socket.SHUT_WR)
            answers = [client.answer(ex.method) for ex in row.exchanges]
        else:
            answers = [
                exchange_one(client, ex, raw, bytewise=row.send == "bytewise")
                for ex, raw in zip(row.exchanges, raws, strict=True)
            ]
        for answer, want, ex in zip(answers, row.wants, row.exchanges, strict=True):
            check(answer, want, ex.method)
        if row.after == "open":
            client.send(request_bytes(Ex(GET, ok(b"")), origin.url("/probe"), host))
            probe = client.answer(GET)
            assert (probe.end, probe.status, probe.body) == ("complete", 200, b"probe"), probe
        else:
            assert client.closed_by_peer(), "the proxy kept the connection open"
    finally:
        client.close()
    for path, ex in zip(paths, row.exchanges, strict=True):
        arrivals = [s for s in origin.seen if s.path == path]
        if not ex.reaches_origin:
            assert arrivals == [], path
            continue
        assert arrivals, f"{path} never reached the origin"
        for seen in arrivals:  # a reused idle connection that failed may have sent it twice (GET)
            assert (seen.method, seen.body) == (ex.method, ex.body)
            names = {n.lower() for n, _ in seen.lines}
            assert not names & {"expect", "transfer-encoding", "connection", "x-trailer"}, seen.lines
            verdict = CHECKER.verify(seen.method, origin.url(seen.path), seen.lines, seen.body)
            assert verdict.verified, verdict.reason
            assert verdict.oracle == "ok", verdict.oracle
    assert not any("Traceback" in line for line in proxy.stderr_lines[log_before:])


def test_every_row_has_a_unique_readable_id() -> None:
    ids = [row.id for row in ROWS]
    assert len(ids) == len(set(ids))
    assert all(len(row.wants) == len(row.exchanges) for row in ROWS)
