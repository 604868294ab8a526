"""HTTP/1.1 framing in one place: hop-by-hop rules, request and response heads, problem responses.

The engine (``net.server``, ``net.upstream``) and the policy (``proxy``) both build heads here and
nowhere else, so the bytes that go on the wire have one author.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from http import HTTPStatus

from ..core.fields import Fields
from ..core.uri import Target
from ..errors import ProxyError, problem_body

__all__ = [
    "BODY_METHODS",
    "HOP_BY_HOP",
    "NOT_FORWARDED",
    "Outgoing",
    "drop_hop_by_hop",
    "framed_interim",
    "keep_piece",
    "list_tokens",
    "list_tokens_bytes",
    "outgoing",
    "phrase",
    "problem_response",
    "regenerated",
    "response_framing",
    "response_head",
    "serialize_head",
]

# RFC 9110 section 7.6.1 plus the proxy-only fields; never covered, never forwarded.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-authorization",
        "proxy-authenticate",
        "proxy-authentication-info",  # RFC 9110 section 11.7.3: for the next outbound client only
    }
)
# Regenerated for every request: framing, Host (RFC 9112 section 3.2.2), Expect (we answer 100 ourselves).
_REGENERATED = frozenset({"host", "content-length", "expect"})
# Never forwarded from a request as it came: hop-by-hop and regenerated (plus what its Connection names).
NOT_FORWARDED = HOP_BY_HOP | _REGENERATED
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})  # a Content-Length is always sent for these


@dataclass(slots=True)
class Outgoing:
    """A request ready for the wire: head bytes, body, and what we did to it."""

    target: Target
    method: str
    head: bytes
    body: bytes
    keyid: str | None  # None when forwarded unsigned by a host rule
    connect_to: Target  # where the bytes go: the target's origin, or the next-hop relay
    profile: str | None = None  # the signing profile that signed it ("svc", "web-bot-auth"); None: unsigned


def framed_interim(status: int, headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """A 1xx response that carries Content-Length or Transfer-Encoding, other than the 100, 102 and
    103 llhttp ends at their head: llhttp would read content for it. RFC 9112 section 6.3 says a 1xx
    ends at its head whatever it says, so such an answer is refused rather than mis-framed."""
    return status not in _BODILESS_INTERIM and any(name.lower() in _FRAMING for name, _ in headers)


_BODILESS_INTERIM = frozenset({100, 102, 103})
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})


# A chunked body arrives in as many pieces as its sender likes. Kept as a bytes object each, a piece
# of one byte held about 90 bytes that no byte bound counted: a 2 MiB upload sent a byte a chunk grew
# the proxy by 178 MiB. Pieces shorter than this are joined in one bytearray as they come.
SMALL_PIECE_BYTES = 16 * 1024


def keep_piece(pieces: list[bytes | bytearray], piece: bytes) -> None:
    """Append ``piece`` to a body held in ``pieces`` (``b"".join`` them): the memory held stays within
    a few percent of the bytes counted, however finely the sender cut them. A body that comes in one
    piece (the common one) is kept as it came, never copied."""
    if pieces and len(piece) < SMALL_PIECE_BYTES:
        last = pieces[-1]
        if isinstance(last, bytearray):
            last += piece
            return
        if len(last) < SMALL_PIECE_BYTES:
            joined = bytearray(last)
            joined += piece
            pieces[-1] = joined
            return
    pieces.append(piece)


def response_framing(headers: Iterable[tuple[bytes, bytes]]) -> tuple[int | None, bool, set[bytes]]:
    """A final response head's framing: its Content-Length (None: none, or not a number), whether
    it is chunked, and the fields its ``Connection`` names (lower case). ProxyError 502 for a
    transfer coding other than chunked (RFC 9112 section 6.1: we ask for none, and can decode only
    chunked; another one, passed on, would reach the client as if it were the content)."""
    content_length = None
    codings: list[bytes] = []
    named: set[bytes] = set()
    for name, value in headers:
        lname = name.lower()
        if lname == b"content-length":
            with contextlib.suppress(ValueError):
                content_length = int(value)
        elif lname == b"transfer-encoding":
            codings += list_tokens_bytes(value)
        elif lname == b"connection":
            named.update(list_tokens_bytes(value))
    if codings and codings != [b"chunked"]:
        raise ProxyError(502, "upstream-bad-response", "upstream used a transfer coding other than chunked")
    return content_length, bool(codings), named


def list_tokens(value: str) -> list[str]:
    """The lower-case members of a comma-separated field value (``Connection``, ``Upgrade``,
    ``Transfer-Encoding``); empty ones are ignored, as RFC 9110 section 5.6.1 asks of a recipient."""
    return [token for token in (t.strip() for t in value.lower().split(",")) if token]


def list_tokens_bytes(value: bytes) -> list[bytes]:
    """``list_tokens`` of a field value as llhttp hands it over."""
    return [token for token in (t.strip() for t in value.lower().split(b",")) if token]


def drop_hop_by_hop(lines: Sequence[tuple[str, str]], *, keep_regenerated: bool = False) -> Fields:
    """The fields of ``lines`` but the hop-by-hop ones and those ``Connection`` names; with
    ``keep_regenerated``, ``Host``, ``Content-Length`` and ``Expect`` stay as received (what a
    verifier at the end of the signed path reads: the client signed them as it sent them)."""
    named: set[str] = set()
    for name, value in lines:
        if name.lower() == "connection":
            named.update(list_tokens(value))
    drop = HOP_BY_HOP if keep_regenerated else NOT_FORWARDED
    drop = drop | named if named else drop
    return Fields((n, v) for n, v in lines if n.lower() not in drop)


def serialize_head(
    method: str,
    target: Target,
    fields: Iterable[tuple[str, str]],
    body_len: int,
    framed: bool,
    *,
    absolute_form: bool = False,
) -> bytes:
    """Request line, Host, the fields in order, Content-Length when there is (or may be) a body.

    ``absolute_form`` is for a next-hop relay (RFC 9112 section 3.2.2), which then sees the full URI.
    The target goes out in the spelling it travels in (``Target.wire_parts``): a relay's or a
    gateway's as received, so that what was signed over it still verifies.
    """
    if target.received is None:  # the agent's hop: its canonical target, as signed
        authority, request_target = target.authority, target.uri if absolute_form else target.path_query
    else:
        authority, request_target = target.wire_parts()
        if absolute_form:
            request_target = target.received
    lines = "".join([f"{name}: {value}\r\n" for name, value in fields])
    length = f"Content-Length: {body_len}\r\n" if body_len or framed or method in BODY_METHODS else ""
    head = f"{method} {request_target} HTTP/1.1\r\nHost: {authority}\r\n{lines}{length}\r\n"
    try:
        return head.encode("latin-1")
    except UnicodeEncodeError:
        raise ProxyError(400, "malformed-header", "a header value cannot be sent as HTTP/1.1 bytes") from None


def regenerated(method: str, target: Target, body_len: int, framed: bool) -> list[tuple[str, str]]:
    """The ``Host`` and ``Content-Length`` lines ``serialize_head`` writes for this request."""
    authority = target.authority if target.received is None else target.wire_parts()[0]
    lines = [("Host", authority)]
    if body_len or framed or method in BODY_METHODS:
        lines.append(("Content-Length", str(body_len)))
    return lines


def outgoing(
    method: str,
    target: Target,
    fields: Iterable[tuple[str, str]],
    body: bytes,
    *,
    framed: bool,
    keyid: str | None,
    via: Target | None,
    profile: str | None = None,
) -> Outgoing:
    """Serialize for the wire: origin-form to the target's origin, absolute-form to a next-hop relay."""
    head = serialize_head(method, target, fields, len(body), framed, absolute_form=via is not None)
    return Outgoing(target, method, head, body, keyid, via or target, profile)


def phrase(status: int) -> str:
    """The reason phrase of ``status`` (RFC 9110 section 15), or ``Unknown``."""
    try:
        return str(HTTPStatus(status).phrase)
    except ValueError:
        return "Unknown"


def response_head(status: int, fields: Sequence[tuple[str, str]], *, close: bool = False) -> bytes:
    """A response head: status line, the fields in order, ``Connection: close`` when asked."""
    parts = [f"HTTP/1.1 {status} {phrase(status)}\r\n"]
    parts.extend(f"{name}: {value}\r\n" for name, value in fields)
    if close:
        parts.append("Connection: close\r\n")
    parts.append("\r\n")
    return "".join(parts).encode("latin-1")


def local_answer(
    status: int, content_type: str, body: bytes, *, close: bool, head_only: bool = False
) -> bytes:
    """A whole response the proxy makes itself: never cached. ``head_only``: the answer to a HEAD,
    its head alone with the Content-Length the body would have (RFC 9110 section 9.3.2)."""
    fields = [
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Cache-Control", "no-store"),
    ]
    head = response_head(status, fields, close=close)
    return head if head_only else head + body


def problem_response(
    error: ProxyError, *, close: bool = False, head_only: bool = False, **extra: object
) -> bytes:
    """A whole problem+json response (RFC 9457) for ``error``, its extra header fields included;
    ``head_only`` as for ``local_answer``."""
    body = problem_body(error.status, error.reason, error.detail, **extra)
    fields = [
        ("Content-Type", "application/problem+json"),
        ("Content-Length", str(len(body))),
        *error.headers,
    ]
    head = response_head(error.status, fields, close=close)
    return head if head_only else head + body
