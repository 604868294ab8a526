"""The body a handler gets after an aiohttp face of the verifier has read and verified it.

The faces read the whole body to check its Content-Digest. aiohttp's ``request.read()`` drains the
request's input stream, so afterwards only ``read``/``text``/``json`` and an url-encoded ``post``
saw the body (from read's cache): a handler streaming ``request.content`` got zero bytes and
answered as if the body were empty, and ``multipart()`` or ``post()`` on a multipart form raised
(500). Now every way of reading replays exactly the verified bytes, on every face: both middlewares,
``verify_aiohttp_request``, ``verify_gateway_request`` and ``verify_delivery_request``. These tests
also pin how that replay reaches into aiohttp (``middleware._replay``): an aiohttp that reads the
body elsewhere fails here. Real aiohttp servers on 127.0.0.1, port 0.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import BodyPartReader, web
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.typedefs import Middleware

from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.retrieval import sign_retrieval_url
from signing_proxy.core.signature_key import RETRIEVAL_COMPONENTS, signature_key_member
from signing_proxy.core.signatures import Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.verify import (
    GATEWAY,
    SIGNATURE,
    DeliveryPolicy,
    DeliveryVerifier,
    DirectoryResolver,
    RequestVerifier,
    VerifierPolicy,
    gateway_middleware,
    signature_middleware,
    verify_aiohttp_request,
    verify_delivery_request,
    verify_gateway_request,
)
from signing_proxy.verify.middleware import Handler
from tests.verify.fakes import NOW, Clock, FakeFetch
from tests.verify.strangers import signed
from tests.verify.test_gateway import AGENT, World, world  # noqa: F401 (the fixture)

ORIGIN = "https://exchange.example"
KEY = SigningKey.from_seed(bytes([5]) * 32)
EXCHANGE_KEY = SigningKey.from_seed(bytes([6]) * 32)
FETCHER = SigningKey.from_seed(bytes([7]) * 32)
BOUNDARY = "verified-b0undary"
LARGE = 300_000  # well past a stream's 64 KiB limit and aiohttp's read chunks; under client_max_size
LIMIT_S = 30.0  # a bound on each exchange, never a measured time

_unique = itertools.count()  # every body differs: the gateway refuses a replayed signature


def payload(size: int) -> bytes:
    tag = f"{next(_unique)}:".encode()
    return (tag + bytes(range(256)) * (size // 256 + 1))[:size]


def multipart(file: bytes) -> bytes:
    """A multipart/form-data body (``BOUNDARY``): field ``a`` = ``1`` and file ``f`` (f.bin)."""
    return b"".join(
        [
            f"--{BOUNDARY}\r\n".encode(),
            b'Content-Disposition: form-data; name="a"\r\n\r\n1\r\n',
            f"--{BOUNDARY}\r\n".encode(),
            b'Content-Disposition: form-data; name="f"; filename="f.bin"\r\n',
            b"Content-Type: application/octet-stream\r\n\r\n",
            file,
            f"\r\n--{BOUNDARY}--\r\n".encode(),
        ]
    )


# --- handlers: each answers what it read --------------------------------------------------------


async def iter_any(request: web.Request) -> web.Response:
    data = bytearray()
    async for chunk in request.content.iter_any():
        data.extend(chunk)
    return web.Response(body=bytes(data))


async def iter_chunked(request: web.Request) -> web.Response:
    data = bytearray()
    async for chunk in request.content.iter_chunked(1000):
        data.extend(chunk)
    return web.Response(body=bytes(data))


async def read_twice(request: web.Request) -> web.Response:
    first, second = await request.read(), await request.read()
    assert first == second
    assert (await request.text()).encode("latin-1") == first  # sent as latin-1 text
    return web.Response(body=first + await request.content.read())  # the stream replays them too


async def json_body(request: web.Request) -> web.Response:
    return web.json_response({"json": await request.json()})


async def form(request: web.Request) -> web.Response:
    fields = await request.post()
    out: dict[str, Any] = {}
    for name, value in fields.items():
        out[name] = value.file.read().hex() if isinstance(value, web.FileField) else value
    return web.json_response(out)


async def parts(request: web.Request) -> web.Response:
    reader = await request.multipart()
    out: dict[str, Any] = {}
    while (part := await reader.next()) is not None:
        assert isinstance(part, BodyPartReader)  # no nested multipart here
        out[str(part.name)] = (await part.read()).hex()
    return web.json_response(out)


async def untouched(request: web.Request) -> web.Response:
    return web.Response(text="not read")  # the next request on the connection must still be served


ROUTES: dict[str, Handler] = {
    "/iter-any": iter_any,
    "/iter-chunked": iter_chunked,
    "/read-twice": read_twice,
    "/json": json_body,
    "/form": form,
    "/parts": parts,
    "/untouched": untouched,
}


# --- faces: a middleware per face and how its requests are signed -------------------------------

Sign = Callable[[str, bytes], tuple[str, list[tuple[str, str]]]]  # (path, body) -> (target, fields)


@dataclass
class Face:
    middleware: Middleware
    sign: Sign
    closing: Callable[[], Awaitable[None]]


def calling(verify: Callable[[web.Request], Awaitable[object]]) -> Middleware:
    """A middleware calling a function face before the handler (a refusal: 401)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            await verify(request)
        except Exception as exc:
            return web.Response(status=401, text=f"refused: {exc!r}")
        return await handler(request)

    return middleware


def stack_face(*, function: bool) -> Face:
    verifier = RequestVerifier(
        DirectoryResolver(FakeFetch()), VerifierPolicy(pinned_agent_keys=(KEY.public,))
    )

    def sign(path: str, body: bytes) -> tuple[str, list[tuple[str, str]]]:
        return path, list(signed("", KEY, now=int(time.time()), url=ORIGIN + path, body=body))

    if function:
        middleware = calling(lambda r: verify_aiohttp_request(verifier, r, external_origin=ORIGIN))
    else:
        inner = signature_middleware(verifier, external_origin=ORIGIN)

        @web.middleware
        async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
            response = await inner(request, handler)
            if response.status == 200:
                assert request[SIGNATURE].agent is not None
            return response

    return Face(middleware, sign, verifier.close)


def gateway_face(world: World, *, function: bool) -> Face:  # noqa: F811
    def sign(path: str, body: bytes) -> tuple[str, list[tuple[str, str]]]:
        fields = signed(AGENT, world.agent, now=int(world.clock.now), url=ORIGIN + path, body=body)
        return path, list(fields)

    if function:
        middleware = calling(lambda r: verify_gateway_request(world.gateway, r, external_origin=ORIGIN))
    else:
        inner = gateway_middleware(world.gateway, external_origin=ORIGIN)

        @web.middleware
        async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
            response = await inner(request, handler)
            if response.status == 200:
                assert request[GATEWAY].stack is not None
            return response

    async def nothing() -> None:  # the world fixture closes its gateway
        return None

    return Face(middleware, sign, nothing)


def delivery_face() -> Face:
    clock = Clock()
    resolver = DirectoryResolver(FakeFetch(), clock=clock)
    policy = DeliveryPolicy(pinned_exchange_keys=(EXCHANGE_KEY.public,))
    verifier = DeliveryVerifier(RequestVerifier(resolver, clock=clock), policy)

    def sign(path: str, body: bytes) -> tuple[str, list[tuple[str, str]]]:
        url = sign_retrieval_url(
            "https://cdn.example" + path, EXCHANGE_KEY, agent_id=FETCHER.thumbprint, expires=NOW + 600
        )
        fields = Fields(
            [("Content-Digest", content_digest(body)), ("Authorization", ""), ("Signature-Agent", "")]
        )
        fields.add("Signature-Key", signature_key_member("agent", FETCHER.public))
        target = parse_absolute_uri(url)
        message = Message("POST", target, fields)
        member = sign_message(
            message, FETCHER, created=NOW, expires=NOW + 300, components=RETRIEVAL_COMPONENTS
        )
        attach_signature(fields, member)
        return target.path_query, list(fields)

    middleware = calling(
        lambda r: verify_delivery_request(verifier, r, external_origin="https://cdn.example")
    )
    return Face(middleware, sign, verifier.close)


FACES = [
    "signature_middleware",
    "verify_aiohttp_request",
    "gateway_middleware",
    "verify_gateway_request",
    "verify_delivery_request",
]


@pytest.fixture(params=FACES)
async def face(request: pytest.FixtureRequest, world: World) -> AsyncIterator[Face]:  # noqa: F811
    name: str = request.param
    if "gateway" in name:
        made = gateway_face(world, function=name.startswith("verify"))
    elif name == "verify_delivery_request":
        made = delivery_face()
    else:
        made = stack_face(function=name.startswith("verify"))
    yield made
    await made.closing()


@pytest.fixture
async def client(face: Face) -> AsyncIterator[TestClient[Any, Any]]:
    app = web.Application(middlewares=[face.middleware])
    for path, handler in ROUTES.items():
        app.router.add_post(path, handler)
    async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as made:
        yield made


async def send(
    client: TestClient[Any, Any], face: Face, path: str, body: bytes, content_type: str
) -> tuple[int, bytes]:
    """POST ``body`` to ``path`` signed for this face; (status, the handler's answer)."""
    target, fields = face.sign(path, body)
    async with asyncio.timeout(LIMIT_S):
        resp = await client.post(target, data=body, headers=[*fields, ("Content-Type", content_type)])
        return resp.status, await resp.read()


# --- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/iter-any", "/iter-chunked"])
@pytest.mark.parametrize("size", [1000, LARGE])
async def test_a_handler_streaming_the_body_gets_every_verified_byte(
    client: TestClient[Any, Any], face: Face, path: str, size: int
) -> None:
    body = payload(size)
    status, seen = await send(client, face, path, body, "application/octet-stream")
    assert status == 200, seen[:300]
    assert seen == body  # was b"": the middleware had drained the stream


async def test_read_twice_text_and_content_all_give_the_same_bytes(
    client: TestClient[Any, Any], face: Face
) -> None:
    body = payload(5000)
    status, seen = await send(client, face, "/read-twice", body, "text/plain; charset=latin-1")
    assert status == 200, seen[:300]
    assert seen == body + body


async def test_json_is_read_from_the_verified_body(client: TestClient[Any, Any], face: Face) -> None:
    body = b'{"n": %d}' % next(_unique)
    status, seen = await send(client, face, "/json", body, "application/json")
    assert status == 200, seen[:300]
    assert seen == b'{"json": ' + body + b"}"


async def test_a_multipart_upload_reaches_post_with_its_fields_and_file(
    client: TestClient[Any, Any], face: Face
) -> None:
    file = payload(LARGE)
    status, seen = await send(
        client, face, "/form", multipart(file), f"multipart/form-data; boundary={BOUNDARY}"
    )
    assert status == 200, seen[:300]  # was 500: "Could not find starting boundary"
    assert json.loads(seen) == {"a": "1", "f": file.hex()}


async def test_a_multipart_upload_reaches_multipart_part_by_part(
    client: TestClient[Any, Any], face: Face
) -> None:
    file = payload(2000)
    status, seen = await send(
        client, face, "/parts", multipart(file), f"multipart/form-data; boundary={BOUNDARY}"
    )
    assert status == 200, seen[:300]
    assert json.loads(seen) == {"a": b"1".hex(), "f": file.hex()}


async def test_an_urlencoded_form_reaches_post(client: TestClient[Any, Any], face: Face) -> None:
    body = b"a=1&b=%d" % next(_unique)
    status, seen = await send(client, face, "/form", body, "application/x-www-form-urlencoded")
    assert status == 200, seen[:300]
    assert json.loads(seen) == {"a": "1", "b": body.split(b"=")[-1].decode()}


async def test_a_body_the_handler_leaves_unread_does_not_hold_up_the_connection(
    client: TestClient[Any, Any], face: Face
) -> None:
    for _ in range(3):  # one client, one keep-alive connection: each answer must come
        status, seen = await send(client, face, "/untouched", payload(LARGE), "application/octet-stream")
        assert (status, seen) == (200, b"not read")
    body = payload(1000)
    assert await send(client, face, "/iter-any", body, "application/octet-stream") == (200, body)


async def test_a_request_refused_never_reaches_the_handler(client: TestClient[Any, Any], face: Face) -> None:
    target, fields = face.sign("/iter-any", b"signed")
    async with asyncio.timeout(LIMIT_S):
        resp = await client.post(target, data=b"another body", headers=fields)
        assert resp.status != 200
        assert await resp.read() != b"another body"


async def test_the_stream_an_outer_middleware_already_looked_at_is_replaced_too(face: Face) -> None:
    """``request.content`` is computed once per request: one an outer middleware touched (a logger
    reading its size) must not stay the drained stream for the handler."""

    @web.middleware
    async def outer(request: web.Request, handler: Handler) -> web.StreamResponse:
        assert request.content.total_bytes >= 0
        return await handler(request)

    app = web.Application(middlewares=[outer, face.middleware])
    app.router.add_post("/iter-any", iter_any)
    body = payload(4000)
    async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as client:
        assert await send(client, face, "/iter-any", body, "application/octet-stream") == (200, body)
