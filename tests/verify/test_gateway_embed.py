"""The gateway's steps embedded in an aiohttp exchange (middleware + verdict), the scope check and
the disclosure policy helper."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from signing_proxy.verify import (
    GATEWAY,
    SCOPE_INSUFFICIENT,
    apply_disclosure,
    build_gateway_verifier,
    covers,
    gateway_middleware,
)
from tests.verify.strangers import signed
from tests.verify.test_gateway import AGENT, EXCHANGE, World, world  # noqa: F401 (the fixture)

CATALOG = {
    "https://pub.example/ca": "dist:US:CA",
    "https://pub.example/ny": "dist:US:NY",
    "https://pub.example/free": None,
}


async def discover(request: web.Request) -> web.Response:
    verdict = request[GATEWAY]
    groups = [{"uri": uri, "offers": [{"pricing": "per_request"}]} for uri in CATALOG]
    shown = apply_disclosure(groups, verdict.scopes, lambda g: CATALOG[g["uri"]], policy="reveal")
    return web.json_response({"offer_groups": shown, "remaining": verdict.remaining_accesses})


ClientMaker = Any


@pytest.fixture
async def client(world: World, aiohttp_client: ClientMaker) -> TestClient[Any, Any]:  # noqa: F811
    app = web.Application(
        middlewares=[gateway_middleware(world.gateway, external_origin="https://exchange.example")]
    )
    app.router.add_post("/v1/svc.v1.ExchangeService/DiscoverResources", discover)
    made: TestClient[Any, Any] = await aiohttp_client(app)
    return made


async def post(client: TestClient[Any, Any], world: World, body: bytes) -> Any:  # noqa: F811
    fields = signed(AGENT, world.agent, now=int(world.clock.now), url=EXCHANGE, body=body)
    return await client.post("/v1/svc.v1.ExchangeService/DiscoverResources", data=body, headers=list(fields))


async def test_middleware_hands_the_verdict_to_the_handler(
    client: TestClient[Any, Any],
    world: World,  # noqa: F811
) -> None:
    resp = await post(client, world, world.body(world.chain()))
    assert resp.status == 200, await resp.text()
    groups = {g["uri"]: g for g in (await resp.json())["offer_groups"]}
    assert "offers" in groups["https://pub.example/ca"]  # covered by the chain's dist:US:CA
    assert groups["https://pub.example/ny"] == {
        "uri": "https://pub.example/ny",
        "absence_reason": SCOPE_INSUFFICIENT,
    }
    assert "offers" in groups["https://pub.example/free"]


async def test_middleware_refuses_with_status_reason_and_headers(
    client: TestClient[Any, Any],
    world: World,  # noqa: F811
) -> None:
    resp = await post(client, world, world.body(type="REQUESTER_TYPE_UNSPECIFIED"))
    assert resp.status == 400
    assert resp.content_type == "application/problem+json"
    assert (await resp.json())["reason"] == "requester-type-unspecified"
    chain = world.chain(max_accesses=1, quota_period_s=30)
    assert (await post(client, world, world.body(chain))).status == 200
    world.clock.now += 1
    refused = await post(client, world, world.body(chain))
    assert refused.status == 429
    assert refused.headers["Retry-After"] == "29"
    assert json.loads(await refused.text())["reason"] == "DENIAL_REASON_QUOTA_EXCEEDED"


def test_covers_and_default_policy() -> None:
    assert covers(["dist:US:*"], "dist:US:CA")
    assert not covers(["dist:US:*"], "dist:EU")
    assert covers(None, "public:x", default_scopes=["public:*"])
    assert covers([], "public:x", default_scopes=["public:*"])  # an empty list: the default policy
    assert not covers(None, "dist:US")


def test_disclosure_hide_omits_and_reveal_marks() -> None:
    groups = [{"uri": "a", "offers": []}, {"uri": "b", "offers": []}]
    scope = {"a": "dist:US", "b": "dist:EU"}.get
    assert apply_disclosure(groups, ["dist:US"], lambda g: scope(g["uri"]), policy="hide") == [groups[0]]
    revealed = apply_disclosure(groups, ["dist:US"], lambda g: scope(g["uri"]), policy="reveal")
    assert revealed == [groups[0], {"uri": "b", "absence_reason": SCOPE_INSUFFICIENT}]
    with pytest.raises(ValueError, match="hide or reveal"):
        apply_disclosure(groups, None, lambda g: None, policy="show")  # type: ignore[arg-type]


async def test_build_gateway_verifier_closes_what_it_made() -> None:
    gateway = build_gateway_verifier(issuer_key_grace_s=0)
    assert gateway.store is None
    assert gateway.issuers.grace_s == 0
    await gateway.close()
