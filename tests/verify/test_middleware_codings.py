"""A body sent with a Content-Encoding, at the aiohttp faces of the verifier.

Content-Digest covers the content as sent, its coding included (RFC 9530; what our signer digests).
aiohttp's server decodes gzip, deflate, br and zstd bodies by default (``auto_decompress``), and then
``request.read()`` has only the decoded bytes: the middleware refused a digest over the bytes sent
(``content-digest-mismatch``) and accepted one over the decoded content, which no byte on the wire
matched. On such a server an encoded body is now refused as what it is; with
``auto_decompress=False`` it is verified against the bytes sent. Real aiohttp servers on 127.0.0.1.
"""

from __future__ import annotations

import gzip
import time
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from signing_proxy.core.jwk import SigningKey
from signing_proxy.verify import DirectoryResolver, RequestVerifier, VerifierPolicy, signature_middleware
from tests.verify.fakes import FakeFetch
from tests.verify.strangers import TARGET, signed

KEY = SigningKey.from_seed(bytes([3]) * 32)
CONTENT = b'{"ver":"1.0","note":"' + b"x" * 400 + b'"}'
WIRE = gzip.compress(CONTENT)


async def handler(request: web.Request) -> web.Response:
    return web.Response(text=f"{len(await request.read())}")


async def post(signed_body: bytes, coding: str | None, **server: Any) -> tuple[int, str]:
    """POST ``WIRE`` with a Content-Digest over ``signed_body``; (status, reason or what the handler read)."""
    verifier = RequestVerifier(
        DirectoryResolver(FakeFetch()), VerifierPolicy(pinned_agent_keys=(KEY.public,))
    )
    app = web.Application(
        middlewares=[signature_middleware(verifier, external_origin="https://exchange.example")]
    )
    app.router.add_post("/svc.v1.ExchangeService/DiscoverResources", handler)
    fields = signed("", KEY, now=int(time.time()), url=TARGET, body=signed_body)
    if coding is not None:
        fields.add("Content-Encoding", coding)  # not covered: the digest is what binds the bytes
    test_server = TestServer(app, host="127.0.0.1")
    await test_server.start_server(**server)  # its constructor would drop them (aiohttp 3.14)
    async with TestClient(test_server) as client:
        path = "/svc.v1.ExchangeService/DiscoverResources"
        resp = await client.post(path, data=WIRE, headers=list(fields), auto_decompress=False)
        text = await resp.text()
        reason = (await resp.json())["reason"] if resp.status != 200 else text
    await verifier.close()
    return resp.status, reason


@pytest.mark.parametrize("coding", ["gzip", "GZIP"])
async def test_an_encoded_body_on_a_decoding_server_is_refused_as_such(coding: str) -> None:
    assert await post(WIRE, coding) == (401, "content-coding-decoded")
    # the digest over the decoded content, which matches no byte sent, passed before
    assert await post(CONTENT, coding) == (401, "content-coding-decoded")


async def test_an_encoded_body_is_verified_as_sent_when_the_server_keeps_it() -> None:
    assert await post(WIRE, "gzip", auto_decompress=False) == (200, str(len(WIRE)))
    assert await post(CONTENT, "gzip", auto_decompress=False) == (401, "content-digest-mismatch")


async def test_a_coding_aiohttp_does_not_decode_is_verified_as_sent() -> None:
    assert await post(WIRE, "identity") == (200, str(len(WIRE)))
    assert await post(WIRE, "x-private") == (200, str(len(WIRE)))
