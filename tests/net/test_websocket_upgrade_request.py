"""Which requests are WebSocket handshakes (``Request.upgrades_to_websocket``), and the
``Sec-WebSocket-Accept`` a ``101`` owes one (``net.websocket.accept_for``).

A review found three gaps: a handshake without a ``Sec-WebSocket-Key`` (or with two) was switched,
though no ``101`` could then be checked against it (RFC 6455 section 4.1); an HTTP/1.0 request's
``Upgrade`` was honoured (RFC 9110 section 7.8: a server MUST ignore it); and only the first
``Upgrade`` line was read, so ``websocket`` plus a second line ``h2c`` was a handshake while
``websocket, h2c`` on one line was refused (RFC 9110 section 5.3: the lines are one field).
"""

from __future__ import annotations

import base64
import hashlib

import pytest

from signing_proxy.net.request import Request
from signing_proxy.net.websocket import accept_for

KEY = ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")


def request(*headers: tuple[str, str], version: str = "1.1") -> Request:
    req = Request()
    req.method = "GET"
    req.version = version
    req.headers = list(headers)
    return req


def test_the_accept_value_is_rfc_6455_section_1_3s_example() -> None:
    assert accept_for(b"dGhlIHNhbXBsZSBub25jZQ==") == b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_the_accept_value_is_base64_of_sha1_of_key_and_guid() -> None:
    key = base64.b64encode(bytes(range(16)))
    digest = hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11", usedforsecurity=False).digest()
    assert accept_for(key) == base64.b64encode(digest)


@pytest.mark.parametrize(
    ("keys", "websocket"),
    [
        ([KEY], True),
        ([], False),
        ([KEY, KEY], False),
        ([KEY, ("sec-websocket-key", "AQIDBAUGBwgJCgsMDQ4PEA==")], False),
    ],
    ids=["one", "none", "the-same-twice", "two-different"],
)
def test_a_handshake_carries_exactly_one_key(keys: list[tuple[str, str]], websocket: bool) -> None:
    assert request(("Upgrade", "websocket"), *keys).upgrades_to_websocket() is websocket


@pytest.mark.parametrize("version", ["1.0", "0.9"])
def test_an_upgrade_on_an_http_1_0_request_is_never_honoured(version: str) -> None:
    assert request(("Upgrade", "websocket"), KEY, version=version).upgrades_to_websocket() is False


def test_an_http_1_1_request_with_the_same_fields_is_a_handshake() -> None:
    assert request(("Upgrade", "websocket"), KEY, version="1.1").upgrades_to_websocket() is True


@pytest.mark.parametrize(
    ("one_line", "two_lines"),
    [
        ("websocket, h2c", ["websocket", "h2c"]),
        ("h2c, websocket", ["h2c", "websocket"]),
        ("websocket, websocket", ["websocket", "websocket"]),
        ("websocket, ", ["websocket", ""]),
        ("websocket", ["", "websocket"]),
    ],
    ids=["websocket-then-h2c", "h2c-then-websocket", "websocket-twice", "empty-second", "empty-first"],
)
def test_upgrade_lines_are_read_as_one_field(one_line: str, two_lines: list[str]) -> None:
    """Split over lines or on one line, the same ``Upgrade`` field gets the same answer."""
    joined = request(("Upgrade", one_line), KEY).upgrades_to_websocket()
    split = request(*(("Upgrade", value) for value in two_lines), KEY).upgrades_to_websocket()
    assert split is joined


def test_a_second_upgrade_line_naming_another_protocol_is_no_handshake() -> None:
    assert request(("Upgrade", "websocket"), ("Upgrade", "h2c"), KEY).upgrades_to_websocket() is False
