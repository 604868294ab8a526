"""What the engine hands a handler: a parsed request, the limits it was read under, and their refusals."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ..core.errors import FieldError
from ..core.uri import parse_authority
from ..errors import ProxyError
from .framing import list_tokens

__all__ = [
    "RETRY_AFTER_S",
    "AbortConnection",
    "Limits",
    "Request",
    "busy",
    "full",
    "head_too_large",
    "parse_connect_target",
    "too_large",
]

RETRY_AFTER_S = 1  # our choice: when the proxy is full, a client may try again this soon


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds a connection enforces while it reads (``limits.*`` and ``timeouts.*``)."""

    max_header_bytes: int
    max_body_bytes: int
    client_idle_s: float
    read_s: float
    max_request_line_bytes: int = 8 * 1024
    max_header_fields: int = 256
    max_connections: int = 2048
    max_buffered_bytes: int = 128 * 1024 * 1024


class Request:
    """A request as parsed so far."""

    __slots__ = (
        "body",
        "body_size",
        "complete",
        "content_length",
        "fields",
        "framed",
        "head_bytes",
        "head_done",
        "headers",
        "held",
        "host",
        "host_lines",
        "keep_alive",
        "method",
        "over_budget",
        "refusal",
        "released",
        "too_large",
        "upgrade",
        "url",
        "version",
    )

    def __init__(self, refusal: ProxyError | None = None) -> None:
        self.url = b""
        self.method = ""
        self.version = "1.1"
        self.headers: list[tuple[str, str]] = []
        self.body: list[bytes | bytearray] = []  # net.framing.keep_piece: small pieces joined
        self.body_size = 0
        self.too_large = False
        self.complete = False
        self.keep_alive = True
        self.content_length: int | None = None
        self.framed = False  # the client sent Content-Length or Transfer-Encoding
        self.host_lines = 0  # Host field lines in the head (RFC 9112 section 3.2: exactly one)
        self.host: str | None = None  # the last one's value
        self.head_done = False  # field lines after this are chunked trailers: never headers
        self.fields = 0  # field lines seen, trailers included
        self.head_bytes = 0  # the target's and the field lines' bytes, trailers included
        self.held = 0  # body bytes counted against the engine's buffered budget
        self.over_budget = False  # the engine's budget for buffered bodies ran out for this one
        self.released = False  # served or refused: body bytes still arriving are discarded uncounted
        self.upgrade: str | None = None  # "websocket": the bytes after this request belong to a pipe
        self.refusal = refusal  # set: not a request, but a broken one's answer, in its turn

    def add_url(self, url: bytes, limits: Limits) -> None:
        """More of the request target, as it is parsed; 414 past ``limits.max_request_line_bytes``."""
        self.url += url
        self.head_bytes += len(url)
        if len(self.url) > limits.max_request_line_bytes:
            raise ProxyError(414, "uri-too-long", "request target exceeds limits.max_request_line_bytes")

    def add_field(self, name: bytes, value: bytes, limits: Limits) -> None:
        """One field line, as it is parsed; 431 past ``limits.max_header_fields`` or ``max_header_bytes``."""
        self.fields += 1
        self.head_bytes += len(name) + len(value) + 4
        if self.fields > limits.max_header_fields:
            raise ProxyError(
                431, "too-many-header-fields", "the request has more than limits.max_header_fields"
            )
        if self.head_bytes > limits.max_header_bytes:
            raise ProxyError(
                431, "header-too-large", "request header section exceeds limits.max_header_bytes"
            )
        if self.head_done:
            return  # a chunked trailer: never merged into the (signed) header section; dropped
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def read_framing(self) -> None:
        """Content-Length, Transfer-Encoding and Host of a complete head (llhttp checked the syntax and
        that they do not conflict). ProxyError 501 for a transfer coding other than chunked: llhttp
        decodes only that layer, and what is left would go on as if it were the content."""
        codings: list[str] = []
        for name, value in self.headers:
            lname = name.lower()
            if lname == "content-length":
                self.framed = True
                with contextlib.suppress(ValueError):
                    self.content_length = int(value)
            elif lname == "transfer-encoding":
                self.framed = True
                codings += list_tokens(value)
            elif lname == "host":
                self.host_lines += 1
                self.host = value
        if codings and codings != ["chunked"]:  # RFC 9112 section 6.1: 501 for a coding not understood
            raise ProxyError(
                501,
                "transfer-coding-not-implemented",
                "a request may use no transfer coding but chunked",
            )
        if codings and self.version == "1.0":
            self.keep_alive = False  # RFC 9112 section 6.1: its framing is faulty; close after the answer

    def upgrades_to_websocket(self) -> bool:
        """``Upgrade: websocket`` (the only upgrade we proxy) on an HTTP/1.1 request with exactly one
        ``Sec-WebSocket-Key`` and no body of its own.

        Every ``Upgrade`` line counts, joined as RFC 9110 section 5.3 combines them: ``websocket`` and
        a second line ``h2c`` are refused as ``websocket, h2c`` on one line is. An HTTP/1.0 request's
        ``Upgrade`` is never honoured (RFC 9110 section 7.8: a server MUST ignore it). The key is what
        the upstream's ``Sec-WebSocket-Accept`` is checked against (``net.websocket``): none, or two,
        and no answer could be told from one that never switched.
        """
        return (
            self.version == "1.1"
            and not self.framed
            and list_tokens(", ".join(self.values("upgrade"))) == ["websocket"]
            and len(self.values("sec-websocket-key")) == 1
        )

    def values(self, name: str) -> list[str]:
        """The values of every field line called ``name``, in order (a field may be split over lines)."""
        lname = name.lower()
        return [v for n, v in self.headers if n.lower() == lname]

    def header(self, name: str) -> str | None:
        lname = name.lower()
        for n, v in self.headers:
            if n.lower() == lname:
                return v
        return None


class AbortConnection(Exception):
    """The response already started; the only honest signal left is closing the connection.
    ``status`` and ``bytes_out``: what a response cut off after its head had sent (its access line
    and byte count report them); 0 without a head."""

    def __init__(self, status: int = 0, bytes_out: int = 0) -> None:
        super().__init__(status, bytes_out)
        self.status, self.bytes_out = status, bytes_out


def full() -> ProxyError:
    return ProxyError(
        503,
        "too-many-connections",
        "the proxy holds limits.max_connections connections; try again shortly",
        headers=(("Retry-After", str(RETRY_AFTER_S)),),
    )


def head_too_large() -> ProxyError:
    return ProxyError(431, "header-too-large", "request head or trailers exceed limits.max_header_bytes")


def too_large(limit: int) -> ProxyError:
    return ProxyError(413, "body-too-large", f"request body exceeds limits.max_body_bytes ({limit} bytes)")


def busy() -> ProxyError:
    return ProxyError(
        503,
        "server-busy",
        "the proxy holds limits.max_buffered_bytes of request bodies; try again shortly",
        headers=(("Retry-After", str(RETRY_AFTER_S)),),
    )


def parse_connect_target(raw: str) -> tuple[str, int]:
    """CONNECT's authority-form target -> (host, port); a port is required. A fully qualified name's
    root dot goes (``a.example.`` is ``a.example``), as a client's SNI and a leaf name it."""
    if not raw.rsplit("]", 1)[-1].partition(":")[2]:  # RFC 9110 section 9.3.6: no port, or an empty one
        raise ProxyError(400, "malformed-target", "CONNECT needs host:port")
    if "@" in raw:  # authority-form is host and port: userinfo would only hide the port's absence
        raise ProxyError(400, "malformed-target", "a CONNECT target is host:port, without userinfo")
    try:
        host, port = parse_authority(raw, "https")
    except FieldError as exc:
        raise ProxyError.of(exc) from None
    return host.removesuffix("."), port
