"""A method the HTTP parser does not know (any token is a method, RFC 9110 section 9.1: ``FOO``, or
``get`` in lower case) is refused ``400 malformed-request`` before the handler sees it, as the README
says ("Methods"): llhttp stops at its first byte, so the answer cannot tell an unknown method from a
line that is no request at all (a TLS ClientHello sent to the plain port), and the answer is the
same for both. Methods llhttp knows, WebDAV's and ``QUERY`` among them, are served."""

from __future__ import annotations

import json

import pytest

from .test_engine import LIMITS, Echo, exchange, running


@pytest.mark.parametrize("method", [b"FOO", b"get", b"M-SEARCHX"])
async def test_an_unknown_method_is_400_malformed_request(method: bytes) -> None:
    async with running(Echo(), LIMITS) as (_engine, port):
        answer = await exchange(port, method + b" /x HTTP/1.1\r\nHost: h\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    problem = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert problem["reason"] == "malformed-request"
    assert "method" in problem["detail"].lower()


@pytest.mark.parametrize("method", [b"PROPFIND", b"QUERY", b"PATCH", b"PURGE"])
async def test_a_method_the_parser_knows_is_served(method: bytes) -> None:
    async with running(Echo(), LIMITS) as (_engine, port):
        answer = await exchange(port, method + b" /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
