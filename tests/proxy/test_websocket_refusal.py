"""A refused WebSocket handshake (any answer but 101) as the client gets it: whole or not at all.

A refusal's body is relayed up to ``REFUSAL_BODY_MAX_BYTES``; a larger one is a 502
``response-too-large``, never the first part under a ``Content-Length`` that says it is whole
(RFC 9112 section 6.3). A relayed 204 or 304 carries no ``Content-Length`` (RFC 9110 section 8.6).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from signing_proxy.core.jwk import SigningKey
from signing_proxy.net.websocket import REFUSAL_BODY_MAX_BYTES
from tests.harness import ProxyProcess
from tests.proxy.raw_upstream import websocket_handshake

KEY = SigningKey.generate()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    with ProxyProcess(tmp_path_factory.mktemp("proxy"), {}, key=KEY) as process:
        yield process


def refused_through(
    proxy: ProxyProcess, answer: bytes, *, reset: bool = False
) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """A WebSocket handshake through the proxy to a raw upstream that answers ``answer`` and closes:
    the status line, the fields (lower-cased names) and the body the client read to EOF."""
    got, _ = websocket_handshake(proxy.port, answer, to_eof=True, reset=reset)  # a refusal closes
    head, _, body = got.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    fields = {
        name.strip().lower(): value.strip() for name, _, value in (line.partition(b":") for line in lines)
    }
    return status, fields, body


@pytest.mark.parametrize("framing", ["content-length", "close-delimited"])
def test_a_refusal_larger_than_the_cap_is_502_not_a_truncated_body_that_looks_whole(
    proxy: ProxyProcess, framing: str
) -> None:
    body = b"x" * 100_000
    length = b"Content-Length: %d\r\n" % len(body) if framing == "content-length" else b""
    status, fields, got = refused_through(proxy, b"HTTP/1.1 403 Forbidden\r\n" + length + b"\r\n" + body)
    assert status.startswith(b"HTTP/1.1 502 "), (status, fields.get(b"content-length"), len(got))
    assert fields[b"content-type"] == b"application/problem+json"
    assert int(fields[b"content-length"]) == len(got)
    assert json.loads(got)["reason"] == "response-too-large"


def test_a_refusal_at_the_cap_is_relayed_whole(proxy: ProxyProcess) -> None:
    body = b"y" * REFUSAL_BODY_MAX_BYTES
    status, fields, got = refused_through(
        proxy, b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    assert status.startswith(b"HTTP/1.1 403 ")
    assert fields[b"content-length"] == str(len(body)).encode()
    assert got == body


@pytest.mark.parametrize("answer", [b"HTTP/1.1 204 No Content\r\n\r\n", b"HTTP/1.1 304 Not Modified\r\n\r\n"])
def test_a_relayed_204_or_304_has_no_content_length(proxy: ProxyProcess, answer: bytes) -> None:
    status, fields, got = refused_through(proxy, answer)
    assert status.startswith(answer[:12])
    assert b"content-length" not in fields, fields
    assert got == b""


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 403 Forbidden\r\nContent-Length: 1000\r\n\r\npartial",
        b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n7\r\npartial\r\n",
    ],
    ids=["content-length", "chunked"],
)
def test_a_framed_refusal_cut_short_by_the_upstream_is_502_never_relayed_as_whole(
    proxy: ProxyProcess, answer: bytes
) -> None:
    """The upstream closes before the body it framed is whole (RFC 9112 section 8): what arrived
    ("partial") is not the refusal, and a ``Content-Length`` of 7 would say it was."""
    status, _, got = refused_through(proxy, answer)
    assert status.startswith(b"HTTP/1.1 502 "), (status, got)
    assert json.loads(got)["reason"] == "upstream-reset"
    assert b"partial" not in got


def test_a_refusal_in_a_transfer_coding_other_than_chunked_is_502(proxy: ProxyProcess) -> None:
    """Its ``Transfer-Encoding`` is hop-by-hop and dropped: relayed, the gzip-coded bytes would reach
    the client as the content itself (as for any response: ``net.upstream``)."""
    status, _, got = refused_through(
        proxy, b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: gzip\r\n\r\n\x1f\x8b\x08\x00coded"
    )
    assert status.startswith(b"HTTP/1.1 502 "), (status, got)
    assert json.loads(got)["reason"] == "upstream-bad-response"


def test_a_close_delimited_refusal_is_relayed_whole_at_eof(proxy: ProxyProcess) -> None:
    status, fields, got = refused_through(proxy, b"HTTP/1.1 403 Forbidden\r\n\r\nno entry")
    assert status.startswith(b"HTTP/1.1 403 ")
    assert fields[b"content-length"] == b"8"
    assert got == b"no entry"


@pytest.mark.parametrize("attempt", range(3))
def test_a_close_delimited_refusal_ended_by_a_reset_is_never_relayed_as_whole(
    proxy: ProxyProcess, attempt: int
) -> None:
    """Its body ends at the close, but only a clean one: after a reset what arrived may be a part
    (RFC 9112 section 8), and a Content-Length of it would say it was whole."""
    status, _, got = refused_through(proxy, b"HTTP/1.1 403 Forbidden\r\n\r\nno entry", reset=True)
    assert status.startswith(b"HTTP/1.1 502 "), (attempt, status, got)
    assert json.loads(got)["reason"] == "upstream-reset"
