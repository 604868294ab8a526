"""``exempt_paths`` of both aiohttp middlewares: an exempt path lets an unsigned request reach only
the route registered for it, never a protected handler without a verdict.

The exchange here has a GET-only exempt route and a catch-all protected handler that reads the
verdict the way a real one does (``request[SIGNATURE]`` / ``request[GATEWAY]``). A path that only
decodes to the exempt one (``%2F``), or a method the exempt route does not take, must be refused
like any unsigned request (401 ``missing-signature``), with the protected handler never run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from aiohttp.typedefs import Middleware
from yarl import URL

from signing_proxy.verify import EgressPolicy, VerifierPolicy
from signing_proxy.verify.build import build_verifier
from signing_proxy.verify.gateway_aiohttp import GATEWAY, gateway_middleware
from signing_proxy.verify.gateway_build import build_gateway_verifier
from signing_proxy.verify.middleware import SIGNATURE, signature_middleware

EXEMPT = "/.well-known/svc.json"
ClientMaker = Callable[..., Awaitable[TestClient[Any, Any]]]


@dataclass
class Exchange:
    client: TestClient[Any, Any]
    protected: list[str] = field(default_factory=list)  # raw paths the protected handler ran for
    manifest: list[str] = field(default_factory=list)  # raw paths the exempt handler ran for


async def _app(
    middleware: Middleware, read_verdict: Callable[[web.Request], object]
) -> tuple[web.Application, list[str], list[str]]:
    protected: list[str] = []
    manifest: list[str] = []

    async def protected_handler(request: web.Request) -> web.Response:
        protected.append(request.raw_path)
        read_verdict(request)  # KeyError (a 500) if the middleware let it through without a verdict
        return web.json_response({"handler": "protected"})

    async def manifest_handler(request: web.Request) -> web.Response:
        manifest.append(request.raw_path)
        return web.json_response({"handler": "manifest"})

    app = web.Application(middlewares=[middleware])
    app.router.add_get(EXEMPT, manifest_handler)
    app.router.add_route("*", "/{tail:.*}", protected_handler)
    return app, protected, manifest


@pytest.fixture(params=["signature_middleware", "gateway_middleware"])
async def exchange(request: pytest.FixtureRequest, aiohttp_client: ClientMaker) -> AsyncIterator[Exchange]:
    if request.param == "signature_middleware":
        verifier = build_verifier(VerifierPolicy(), egress=EgressPolicy())
        mw = signature_middleware(verifier, exempt_paths=(EXEMPT,))
        app, protected, manifest = await _app(mw, lambda r: r[SIGNATURE])
        close = verifier.close
    else:
        gateway = build_gateway_verifier(VerifierPolicy(), egress=EgressPolicy())
        mw = gateway_middleware(gateway, exempt_paths=(EXEMPT,))
        app, protected, manifest = await _app(mw, lambda r: r[GATEWAY])
        close = gateway.close
    try:
        yield Exchange(await aiohttp_client(app), protected, manifest)
    finally:
        await close()


async def _refused_unsigned(exchange: Exchange, method: str, path: str) -> None:
    resp = await exchange.client.request(method, URL(path, encoded=True), data=b"{}")
    doc = await resp.json(content_type=None)
    assert (resp.status, doc["reason"]) == (401, "missing-signature"), doc
    assert exchange.protected == []
    assert exchange.manifest == []


async def test_a_path_that_only_decodes_to_an_exempt_one_is_verified(exchange: Exchange) -> None:
    await _refused_unsigned(exchange, "GET", "/.well-known%2Fsvc.json")


async def test_a_method_the_exempt_route_does_not_take_is_verified(exchange: Exchange) -> None:
    await _refused_unsigned(exchange, "POST", EXEMPT)
    await _refused_unsigned(exchange, "POST", EXEMPT + "?strict=1")


async def test_the_exempt_route_itself_still_passes_unsigned(exchange: Exchange) -> None:
    for path in (EXEMPT, EXEMPT + "?v=1"):
        resp = await exchange.client.get(URL(path, encoded=True))
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["handler"] == "manifest"
    resp = await exchange.client.head(EXEMPT)
    assert resp.status == 200
    assert exchange.manifest == [EXEMPT, EXEMPT + "?v=1", EXEMPT]
    assert exchange.protected == []


async def test_an_exempt_path_routed_to_another_handler_is_verified(aiohttp_client: ClientMaker) -> None:
    """The catch-all registered first takes the exempt path: its handler still gets a verdict."""
    verifier = build_verifier(VerifierPolicy(), egress=EgressPolicy())
    ran: list[str] = []

    async def protected_handler(request: web.Request) -> web.Response:
        ran.append(request.raw_path)
        return web.json_response({"verified": request[SIGNATURE] is not None})

    app = web.Application(middlewares=[signature_middleware(verifier, exempt_paths=(EXEMPT,))])
    app.router.add_route("*", "/{tail:.*}", protected_handler)
    try:
        client = await aiohttp_client(app)
        resp = await client.get(EXEMPT)
        assert (resp.status, (await resp.json(content_type=None))["reason"]) == (401, "missing-signature")
        assert ran == []
    finally:
        await verifier.close()
