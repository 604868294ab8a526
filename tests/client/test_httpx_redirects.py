"""httpx: a redirect the client follows itself is signed for its own URL (``redirect_hooks``).

httpx never hands a redirect it follows to an auth: it copied the first request's fields, signature
included, to the new URL (another origin, even), which could replay it for the first. With the auth's
request hooks each such request is signed anew, for its method and URL, over the caller's body.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from signing_proxy.client import HttpxAuth, Signer, key_file
from signing_proxy.config import parse_config
from tests.client.conftest import REDIRECT_KEY
from tests.harness import WAIT_S, VerifyingOrigin

pytestmark = pytest.mark.integration

KEY = REDIRECT_KEY
BODY = b'{"a":1}'
CALL = "/v1/svc.v1.ExchangeService/ExecuteTransaction"


def make_signer(tmp_path: Path, exchange: str | None = None) -> Signer:
    path = tmp_path / "agent-key.pem"
    path.write_bytes(KEY.to_pem())
    path.chmod(0o600)
    config: dict[str, object] = {"signing": {"signature_agent": "https://agent.example"}}
    if exchange is not None:
        config["requester"] = {
            "id": "agent-7",
            "domain": "agent.example",
            "type": "REQUESTER_TYPE_AGENT",
            "exchanges": [exchange],
        }
    return Signer(key_file(path), parse_config(config))


def redirect_with(origin: VerifyingOrigin, status: int, landing: VerifyingOrigin) -> None:
    async def moved(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, headers={"Location": landing.url("/landing")})

    origin.handler = moved


@pytest.mark.parametrize(
    ("status", "method"), [(301, "GET"), (302, "GET"), (303, "GET"), (307, "POST"), (308, "POST")]
)
def test_a_followed_redirect_is_signed_for_its_own_url(
    tmp_path: Path, redirecting: VerifyingOrigin, landing: VerifyingOrigin, status: int, method: str
) -> None:
    redirect_with(redirecting, status, landing)
    auth = HttpxAuth(make_signer(tmp_path))
    with httpx.Client(
        auth=auth, event_hooks=auth.redirect_hooks(), follow_redirects=True, trust_env=False, timeout=WAIT_S
    ) as client:
        response = client.post(redirecting.url("/start"), content=BODY)
    assert response.status_code == 200
    assert [r.status_code for r in response.history] == [status]
    (first,) = redirecting.arrivals
    (landed,) = landing.arrivals
    assert (first.verified, first.oracle) == (True, "ok")
    assert (landed.method, landed.verified, landed.oracle) == (method, True, "ok"), landed.reason
    assert landed.target_uri == landing.url("/landing")
    assert landed.body == (BODY if method == "POST" else b"")
    assert landed.header("signature") != first.header("signature")


def test_an_async_client_signs_a_followed_redirect_too(
    tmp_path: Path, redirecting: VerifyingOrigin, landing: VerifyingOrigin
) -> None:
    auth = HttpxAuth(make_signer(tmp_path))

    async def send() -> int:
        async with httpx.AsyncClient(
            auth=auth, event_hooks=auth.async_redirect_hooks(), follow_redirects=True, trust_env=False
        ) as client:
            return (await client.post(redirecting.url("/start"), content=BODY)).status_code

    assert asyncio.run(asyncio.wait_for(send(), WAIT_S)) == 200
    (landed,) = landing.arrivals  # the fixture's 307
    assert (landed.method, landed.verified, landed.oracle, landed.body) == ("POST", True, "ok", BODY)


def test_a_307_from_the_exchange_resends_the_callers_body_not_the_requester(
    tmp_path: Path, redirecting: VerifyingOrigin, landing: VerifyingOrigin
) -> None:
    auth = HttpxAuth(make_signer(tmp_path, exchange=redirecting.url("/v1")))
    with httpx.Client(
        auth=auth, event_hooks=auth.redirect_hooks(), follow_redirects=True, trust_env=False, timeout=WAIT_S
    ) as client:
        assert client.post(redirecting.url(CALL), content=BODY).status_code == 200
    (called,) = redirecting.arrivals
    assert json.loads(called.body)["requester"]["id"] == "agent-7"  # injected for the exchange
    (landed,) = landing.arrivals
    assert (landed.body, landed.verified) == (BODY, True)  # the caller's, signed for where it went


def test_without_the_hooks_a_redirect_carries_the_first_signature(
    tmp_path: Path, redirecting: VerifyingOrigin, landing: VerifyingOrigin
) -> None:
    """What the hooks are for: the landing origin gets a signature made for another URL."""
    auth = HttpxAuth(make_signer(tmp_path))
    with httpx.Client(auth=auth, follow_redirects=True, trust_env=False, timeout=WAIT_S) as client:
        assert client.post(redirecting.url("/start"), content=BODY).status_code == 200
    (first,) = redirecting.arrivals
    (landed,) = landing.arrivals
    assert landed.header("signature") == first.header("signature")
    assert landed.verified is False
