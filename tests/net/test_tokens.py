"""Comma-separated field values (``Connection``, ``Upgrade``, ``Transfer-Encoding``): one reader each
for text and for llhttp's bytes, both ignoring empty members as RFC 9110 section 5.6.1 asks."""

from __future__ import annotations

import pytest

from signing_proxy.net.framing import drop_hop_by_hop, list_tokens, list_tokens_bytes
from signing_proxy.net.request import Request


@pytest.mark.parametrize(
    ("value", "tokens"),
    [
        ("close", ["close"]),
        (" Keep-Alive ,X-Trace", ["keep-alive", "x-trace"]),
        (",, x-a , ,X-B,", ["x-a", "x-b"]),  # empty members ignored
        ("", []),
        (" , ", []),
    ],
)
def test_a_list_reads_the_same_from_text_and_from_bytes(value: str, tokens: list[str]) -> None:
    assert list_tokens(value) == tokens
    assert list_tokens_bytes(value.encode("latin-1")) == [token.encode("latin-1") for token in tokens]


def test_the_fields_a_connection_line_names_are_dropped_and_an_empty_member_names_nothing() -> None:
    lines = [("Connection", "x-trace, , Keep-Alive"), ("X-Trace", "1"), ("Keep-Alive", "5"), ("X-Kept", "")]
    assert list(drop_hop_by_hop(lines)) == [("X-Kept", "")]


def request(*headers: tuple[str, str], framed: bool = False) -> Request:
    req = Request()
    req.method = "GET"
    req.headers = [*headers, ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")]  # one, as a handshake must
    req.framed = framed
    return req


@pytest.mark.parametrize(
    ("headers", "framed", "websocket"),
    [
        ([("Upgrade", "websocket")], False, True),
        ([("upgrade", "WebSocket")], False, True),
        ([("Upgrade", "websocket, ")], False, True),  # an empty member is no second protocol
        ([("Upgrade", "websocket, h2c")], False, False),  # the pipe would not know which
        ([("Upgrade", "h2c")], False, False),
        ([("Upgrade", "websocket")], True, False),  # a body of its own: not a handshake
        ([], False, False),
    ],
)
def test_only_an_upgrade_to_websocket_alone_is_a_handshake(
    headers: list[tuple[str, str]], framed: bool, websocket: bool
) -> None:
    assert request(*headers, framed=framed).upgrades_to_websocket() is websocket
