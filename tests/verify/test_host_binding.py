"""The target URI a verifier checks is the one the request goes to (issue: Host binding).

Without ``external_origin`` the aiohttp faces (and the gateway mode, tests/proxy/test_gateway_pipeline)
build the target URI from ``Host``. A ``/``, ``?`` or ``#`` riding in Host would move the path the
signature covers away from the path the application routes: a signature captured for ``/feed`` would
pass for ``/admin``, and an exchange call could pass as a path the gateway does not check. Each case
here was accepted before the fix; now each is refused before the handler runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer, make_mocked_request
from multidict import CIMultiDict

from signing_proxy.core.errors import VerificationError
from signing_proxy.core.jwk import SigningKey
from signing_proxy.verify import (
    DirectoryResolver,
    FetchResult,
    RequestVerifier,
    directory_url,
    refusal,
    signature_middleware,
)
from signing_proxy.verify.gateway import GatewayVerifier
from signing_proxy.verify.gateway_aiohttp import gateway_middleware
from signing_proxy.verify.issuers import IssuerKeys
from signing_proxy.verify.middleware import as_received
from tests.harness import WAIT_S
from tests.oracle import oracle_agent_sign
from tests.verify import strangers
from tests.verify.strangers import directory_doc

AGENT = SigningKey.generate()
AGENT_DIR = "https://agent.example"


async def fetch(url: str) -> FetchResult:
    if url != directory_url(AGENT_DIR):
        return FetchResult(404, b"", None)
    return FetchResult(200, directory_doc(AGENT, now=int(time.time())), None)


def signed(uri: str, body: bytes) -> list[tuple[str, str]]:
    return list(strangers.signed(f'"{AGENT_DIR}"', AGENT, now=int(time.time()), url=uri, body=body))


async def send(
    port: int, target: str, hosts: list[str], fields: list[tuple[str, str]], body: bytes
) -> tuple[int, str]:
    """One request on a raw socket (no client library rewrites Host); the status and the body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        lines = [f"POST {target} HTTP/1.1", *(f"Host: {h}" for h in hosts), f"Content-Length: {len(body)}"]
        lines += ["Connection: close", *(f"{n}: {v}" for n, v in fields)]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        answer = await asyncio.wait_for(reader.read(), WAIT_S)
    finally:
        writer.close()
    head, _, rest = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), rest.decode("latin-1")


@contextlib.asynccontextmanager
async def serving(kind: str, **origin: Any) -> AsyncIterator[tuple[int, list[str]]]:
    """An application behind the verifier's middleware ``kind`` (``origin``: its external_origin and
    hosts arguments); the paths its handler ran for."""
    verifier = RequestVerifier(DirectoryResolver(fetch))
    if kind == "signature_middleware":
        middleware = signature_middleware(verifier, **origin)
    else:
        assert verifier.revocations is not None  # RequestVerifier makes one when none is given
        issuers = IssuerKeys(verifier.resolver, verifier.revocations, verifier.egress, grace_s=0)
        middleware = gateway_middleware(GatewayVerifier(verifier, issuers), **origin)
    ran: list[str] = []

    async def handler(req: web.Request) -> web.Response:
        ran.append(req.path)
        return web.Response(text="ran")

    application = web.Application(middlewares=[middleware])
    application.router.add_route("*", "/{tail:.*}", handler)
    server = TestServer(application, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        assert server.port is not None
        yield server.port, ran
    finally:
        await server.close()
        await verifier.close()


FACES = ["signature_middleware", "gateway_middleware"]


@pytest.fixture(params=FACES)
async def app(request: pytest.FixtureRequest) -> AsyncIterator[tuple[int, list[str]]]:
    """An application behind one of the verifier's middlewares, with their defaults."""
    async with serving(request.param) as served:
        yield served


async def test_a_signature_passes_for_the_path_it_covers(app: tuple[int, list[str]]) -> None:
    port, ran = app
    host = f"127.0.0.1:{port}"
    status, text = await send(port, "/feed", [host], signed(f"http://{host}/feed", b"{}"), b"{}")
    assert (status, ran) == (200, ["/feed"]), text


@pytest.mark.parametrize(
    ("host_suffix", "signed_path", "target"),
    [
        ("/feed#", "/feed", "/admin"),  # a captured signature for /feed, replayed to /admin
        ("/?", "/?/admin", "/admin"),  # the path moved into the query of the signed URI
        ("/feed?", "/feed?/admin", "/admin"),
    ],
)
async def test_a_host_carrying_a_path_is_refused(
    app: tuple[int, list[str]], host_suffix: str, signed_path: str, target: str
) -> None:
    port, ran = app
    host = f"127.0.0.1:{port}"
    fields = signed(f"http://{host}{signed_path}", b"{}")
    status, text = await send(port, target, [host + host_suffix], fields, b"{}")
    assert (status, ran) == (401, []), text
    assert '"reason":"malformed-host"' in text


async def test_userinfo_in_host_is_refused(app: tuple[int, list[str]]) -> None:
    port, ran = app
    host = f"127.0.0.1:{port}"
    status, text = await send(port, "/feed", [f"user@{host}"], signed(f"http://{host}/feed", b"{}"), b"{}")
    assert (status, ran) == (401, []), text
    assert '"reason":"malformed-host"' in text


async def test_a_port_too_long_for_int_is_a_malformed_host_not_a_500(app: tuple[int, list[str]]) -> None:
    """Python refuses ``int()`` of more than 4,300 digits with a ValueError; a Host under aiohttp's
    field limit carried one past every face's refusal (a 500 and a traceback)."""
    port, ran = app
    host = f"127.0.0.1:{port}"
    long_port = f"127.0.0.1:{'9' * 4301}"
    status, text = await send(port, "/feed", [long_port], signed(f"http://{host}/feed", b"{}"), b"{}")
    assert (status, ran) == (401, []), text
    assert '"reason":"malformed-host"' in text


async def test_a_second_host_is_refused() -> None:
    """aiohttp's own server refuses a second Host before any middleware runs; an application that
    hands the faces a request some other way (a test client, another server) still gets a refusal."""
    host = "127.0.0.1:8080"
    request = make_mocked_request("POST", "/feed", headers=CIMultiDict([("Host", host), ("Host", host)]))
    with pytest.raises(VerificationError) as refused:
        await as_received(request, None)
    assert refused.value.reason == "malformed-host"


async def test_a_target_in_absolute_form_is_refused(app: tuple[int, list[str]]) -> None:
    port, ran = app
    host = f"127.0.0.1:{port}"
    uri = f"http://{host}/feed"
    status, text = await send(port, uri, [host], signed(uri, b"{}"), b"{}")
    assert (status, ran) == (401, []), text
    assert '"reason":"malformed-target"' in text


# A request a client signed for another service: the middlewares took any Host as their origin, so a
# signature captured at (or made for) publisher-a verified at any service that it was sent to with
# that Host; replay protection does not help, it was never seen here.
ELSEWHERE = "publisher-a.example"


async def send_signed_for_elsewhere(port: int) -> tuple[int, str]:
    uri = f"http://{ELSEWHERE}/article"
    return await send(port, "/article", [ELSEWHERE], signed(uri, b"{}"), b"{}")


@pytest.mark.parametrize("kind", FACES)
async def test_a_signature_made_for_another_origin_is_misdirected(kind: str) -> None:
    async with serving(kind) as (port, ran):
        status, text = await send_signed_for_elsewhere(port)
    assert (status, ran) == (421, []), text
    assert '"reason":"misdirected-request"' in text
    assert "hosts" in text  # the answer names the setting


@pytest.mark.parametrize("kind", FACES)
async def test_a_name_in_hosts_is_answered_for(kind: str) -> None:
    async with serving(kind, hosts=["Publisher-A.example"]) as (port, ran):
        status, text = await send_signed_for_elsewhere(port)
        assert (status, ran) == (200, ["/article"]), text
        loopback = f"127.0.0.1:{port}"  # no longer among the names
        status, text = await send(port, "/feed", [loopback], signed(f"http://{loopback}/feed", b"{}"), b"{}")
    assert (status, ran) == (421, ["/article"]), text
    assert "publisher-a" not in text.lower()  # the names it answers for are configuration: not shown


@pytest.mark.parametrize("kind", FACES)
async def test_external_origin_decides_whatever_the_host(kind: str) -> None:
    async with serving(kind, external_origin=f"http://{ELSEWHERE}") as (port, ran):
        status, text = await send(
            port, "/article", ["anything.example"], signed(f"http://{ELSEWHERE}/article", b"{}"), b"{}"
        )
    assert (status, ran) == (200, ["/article"]), text


@pytest.mark.parametrize("hosts", [["exchange.example:443"], ["user@exchange.example"], [""], "a:1"])
def test_hosts_take_names_without_ports(hosts: Any) -> None:
    verifier = RequestVerifier(DirectoryResolver(fetch))
    with pytest.raises(ValueError, match="without a port"):
        signature_middleware(verifier, hosts=hosts)


async def test_the_misdirected_answer_has_no_signature_challenge() -> None:
    """421 is not an authentication failure: no ``WWW-Authenticate`` (RFC 9110 section 11.6.1)."""
    request = make_mocked_request("POST", "/article", headers=CIMultiDict([("Host", ELSEWHERE)]))
    with pytest.raises(VerificationError) as refused:
        await as_received(request, None)
    assert refused.value.reason == "misdirected-request"
    response = refusal(refused.value)
    assert response.status == 421
    assert "WWW-Authenticate" not in response.headers


@pytest.mark.parametrize("kind", FACES)
async def test_a_third_partys_signature_over_the_uri_it_sent_passes(kind: str) -> None:
    """pyauth signs the URI as it sends it: an upper-case Host, an empty query. The faces rebuilt
    ``@target-uri`` in our normal form (``http://localhost:…/feed``) and refused it."""
    async with serving(kind) as (port, ran):
        host = f"LocalHost:{port}"
        fields = oracle_agent_sign("POST", f"http://{host}/feed?", b"{}", AGENT, signature_agent=AGENT_DIR)
        status, text = await send(port, "/feed?", [host], fields, b"{}")
    assert (status, ran) == (200, ["/feed"]), text
