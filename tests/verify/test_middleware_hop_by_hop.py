"""A covered field named by ``Connection`` is hop-by-hop: it ends at this hop, so every verifying
face treats it as absent, as the gateway mode does (it verifies after ``drop_hop_by_hop``).

Spec "Request signature" rule 4: a verifier MUST reject a request that omits a covered header. The
aiohttp ``signature_middleware``, ``verify-origin`` and the embedded ``gateway_middleware`` verified
the raw lines with the named field still in them and accepted the request; they now refuse it with
the gateway mode's reasons
(``missing-covered-header`` for ``Authorization``, ``missing-signature`` for ``Signature-Input``).
Requests go over a raw socket so the ``Connection`` line is exactly the one written here.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.signatures import Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.verify import EgressPolicy, VerifierPolicy, build_verify_origin
from signing_proxy.verify.build import build_verifier
from signing_proxy.verify.gateway_aiohttp import GATEWAY, gateway_middleware
from signing_proxy.verify.gateway_build import build_gateway_verifier
from signing_proxy.verify.middleware import SIGNATURE, signature_middleware
from tests.verify.directory_host import served_directory

AGENT = SigningKey.from_seed(bytes(range(5, 37)))
LOOPBACK = EgressPolicy(allow_private=("127.0.0.1/32",))  # the directory host: allow-listed
BODY = b"{}"
WAIT_S = 10


@pytest.fixture
def directory_base() -> Iterator[str]:
    with served_directory(AGENT) as base:
        yield base


@pytest.fixture(params=["signature_middleware", "verify-origin", "gateway_middleware"])
async def face(request: pytest.FixtureRequest) -> AsyncIterator[int]:
    """The port of a verifying face: 200 for a verified request, 401 problem+json otherwise."""
    if request.param == "verify-origin":
        async with TestServer(build_verify_origin(VerifierPolicy(), egress=LOOPBACK), host="127.0.0.1") as s:
            assert s.port is not None
            yield s.port
        return
    if request.param == "gateway_middleware":
        gateway = build_gateway_verifier(VerifierPolicy(), egress=LOOPBACK)
        middleware = gateway_middleware(gateway)
        close = gateway.close

        async def handler(req: web.Request) -> web.Response:
            return web.json_response({"verified": req[GATEWAY] is not None})

    else:
        verifier = build_verifier(VerifierPolicy(), egress=LOOPBACK)
        middleware = signature_middleware(verifier)
        close = verifier.close

        async def handler(req: web.Request) -> web.Response:
            return web.json_response({"verified": req[SIGNATURE] is not None})

    app = web.Application(middlewares=[middleware])
    app.router.add_route("*", "/{tail:.*}", handler)
    try:
        async with TestServer(app, host="127.0.0.1") as s:
            assert s.port is not None
            yield s.port
    finally:
        await close()


def signed(port: int, directory_base: str) -> list[tuple[str, str]]:
    now = int(time.time())
    fields = Fields(
        [
            ("Content-Digest", content_digest(BODY)),
            ("Authorization", "Bearer t"),
            ("Signature-Agent", f'"{directory_base}"'),
        ]
    )
    url = f"http://127.0.0.1:{port}/x"
    message = Message("POST", parse_absolute_uri(url), fields)
    attach_signature(fields, sign_message(message, AGENT, created=now, expires=now + 60))
    return list(fields)


async def post(port: int, lines: list[tuple[str, str]], connection: str) -> tuple[int, dict[str, object]]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
    try:
        head = (
            f"POST /x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: {connection}\r\n"
            f"Content-Length: {len(BODY)}\r\n" + "".join(f"{n}: {v}\r\n" for n, v in lines) + "\r\n"
        )
        writer.write(head.encode("latin-1") + BODY)
        data = await asyncio.wait_for(reader.read(), WAIT_S)
    finally:
        writer.close()
    status_head, _, body = data.partition(b"\r\n\r\n")
    doc: dict[str, object] = json.loads(body)
    return int(status_head.split(b" ", 2)[1]), doc


async def test_a_signed_request_is_accepted(face: int, directory_base: str) -> None:
    status, doc = await post(face, signed(face, directory_base), "close")
    assert (status, doc["verified"]) == (200, True), doc


@pytest.mark.parametrize(
    ("named", "reason"),
    [
        ("authorization", "missing-covered-header"),
        ("Authorization", "missing-covered-header"),
        ("signature-input", "missing-signature"),
    ],
)
async def test_a_covered_field_named_by_connection_counts_as_absent(
    face: int, directory_base: str, named: str, reason: str
) -> None:
    status, doc = await post(face, signed(face, directory_base), f"close, {named}")
    assert (status, doc["reason"]) == (401, reason), doc
