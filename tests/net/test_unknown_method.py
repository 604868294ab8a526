"""A method the parser does not know (any token is a method, RFC 9110 section 9.1: ``FOO``, or
``get`` in lower case) is ``501 method-not-implemented`` (section 15.6.2), not a ``400
malformed-request`` that told the client its request was broken. Methods llhttp knows pass."""

from __future__ import annotations

import json

import pytest

from .test_engine import LIMITS, Echo, exchange, running


@pytest.mark.parametrize("method", [b"FOO", b"get", b"M-SEARCHX"])
async def test_an_unknown_method_is_501_method_not_implemented(method: bytes) -> None:
    async with running(Echo(), LIMITS) as (_engine, port):
        answer = await exchange(port, method + b" /x HTTP/1.1\r\nHost: h\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 501 "), answer[:200]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["reason"] == "method-not-implemented"


@pytest.mark.parametrize("method", [b"PROPFIND", b"QUERY", b"PATCH", b"PURGE"])
async def test_a_method_the_parser_knows_is_served(method: bytes) -> None:
    async with running(Echo(), LIMITS) as (_engine, port):
        answer = await exchange(port, method + b" /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
