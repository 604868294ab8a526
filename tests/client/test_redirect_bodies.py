"""What an in-process adapter adds for one origin never follows a redirect to another.

A configured exchange answering 307 had requests and aiohttp resend the body with the Requester
(and its delegation) injected for that exchange to wherever the redirect pointed. And a caller's
``Host`` (kept by aiohttp across a redirect) chose the bearer by that name, wherever the bytes went.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
import requests

from signing_proxy.client import RequestsAuth, Signer, SigningMiddleware, key_file
from signing_proxy.config import parse_config
from tests.client.conftest import REDIRECT_KEY
from tests.harness import WAIT_S, VerifyingOrigin

pytestmark = pytest.mark.integration

KEY = REDIRECT_KEY
BEARER = "s3cr3t-bearer-of-api.example"
CALL = "/v1/svc.v1.ExchangeService/ExecuteTransaction"
BODY = json.dumps({"ver": "1.0", "offers": ["o1"]}).encode()
JSON = {"Content-Type": "application/json"}  # aiohttp would send bytes as application/octet-stream


@pytest.fixture
def signer(tmp_path: Path, redirecting: VerifyingOrigin) -> Signer:
    key = tmp_path / "agent.pem"
    key.write_bytes(KEY.to_pem())
    key.chmod(0o600)
    bearer = tmp_path / "bearer"
    bearer.write_text(BEARER + "\n")
    bearer.chmod(0o600)
    config = {
        "requester": {
            "id": "agent-7",
            "domain": "agent.example",
            "type": "REQUESTER_TYPE_AGENT",
            "exchanges": [redirecting.url("/v1")],
        },
        "credentials": [{"hosts": ["api.example"], "bearer_file": str(bearer), "allow_plaintext": True}],
    }
    return Signer(key_file(key), parse_config(config))


def via_requests(signer: Signer, url: str) -> int:
    with requests.Session() as session:
        session.trust_env = False
        return session.post(
            url, data=BODY, headers=JSON, auth=RequestsAuth(signer), timeout=WAIT_S
        ).status_code


def via_aiohttp(signer: Signer, url: str, headers: dict[str, str] | None = None) -> int:
    async def send() -> int:
        async with (
            aiohttp.ClientSession(middlewares=(SigningMiddleware(signer),)) as session,
            session.post(url, data=BODY, headers={**JSON, **(headers or {})}) as response,
        ):
            await response.read()
            return response.status

    return asyncio.run(asyncio.wait_for(send(), WAIT_S))


@pytest.mark.parametrize("send", [via_requests, via_aiohttp], ids=["requests", "aiohttp"])
def test_a_307_from_the_exchange_resends_the_callers_body_not_the_requester(
    signer: Signer, redirecting: VerifyingOrigin, landing: VerifyingOrigin, send: Callable[[Signer, str], int]
) -> None:
    assert send(signer, redirecting.url(CALL)) == 200
    (called,) = redirecting.arrivals
    assert called.verified
    assert json.loads(called.body)["requester"]["id"] == "agent-7"  # injected for the exchange
    (landed,) = landing.arrivals
    assert landed.body == BODY  # as the caller gave it: nothing added for the exchange went on


def test_a_callers_host_never_chooses_the_bearer_for_bytes_sent_elsewhere(
    signer: Signer, redirecting: VerifyingOrigin, landing: VerifyingOrigin
) -> None:
    """``Host: api.example`` on a request to an address: aiohttp kept it across the redirect, and
    the bearer configured for api.example reached the other origin. A bearer is chosen by where the
    bytes go (as the proxy chooses it by the URL, never by Host); the hop to the other origin now
    carries (and is signed for) its own authority."""
    assert via_aiohttp(signer, redirecting.url("/x"), {"Host": "api.example"}) == 200
    arrivals = [*redirecting.arrivals, *landing.arrivals]
    assert len(arrivals) == 2
    assert [a.header("host") for a in arrivals] == ["api.example", f"127.0.0.1:{landing.port}"]
    for arrival in arrivals:
        assert arrival.header("authorization") == ""  # present and covered, empty
        assert BEARER not in json.dumps(arrival.lines)


def test_the_bearer_is_the_one_for_where_the_bytes_go(tmp_path: Path, landing: VerifyingOrigin) -> None:
    """With ``Host: api.example`` on a request to 127.0.0.1, no bearer went at all: the Host's would
    reach another origin, and the URL's, configured for the address the bytes go to, was dropped
    too. It is now the URL's, as the proxy chooses it."""
    key = tmp_path / "agent.pem"
    key.write_bytes(KEY.to_pem())
    key.chmod(0o600)
    files = {}
    for name, token in (("api", BEARER), ("address", "t0ken-of-127.0.0.1")):
        files[name] = tmp_path / name
        files[name].write_text(token + "\n")
        files[name].chmod(0o600)
    credentials = [
        {"hosts": ["api.example"], "bearer_file": str(files["api"]), "allow_plaintext": True},
        {"hosts": ["127.0.0.1"], "bearer_file": str(files["address"]), "allow_plaintext": True},
    ]
    signer = Signer(key_file(key), parse_config({"credentials": credentials}))
    assert via_aiohttp(signer, landing.url("/x"), {"Host": "api.example"}) == 200
    (arrival,) = landing.arrivals
    assert arrival.verified, arrival.reason  # over the Host's URI, as the origin rebuilds it
    assert arrival.header("host") == "api.example"
    assert arrival.header("authorization") == "Bearer t0ken-of-127.0.0.1"


@pytest.mark.parametrize("kind", ["file", "bytesio"])
def test_a_file_body_answered_307_is_resent_by_requests(
    signer: Signer, redirecting: VerifyingOrigin, landing: VerifyingOrigin, tmp_path: Path, kind: str
) -> None:
    """requests noted a file body's position to rewind it for a 307; the adapter had swapped the
    body for bytes, which cannot seek: ``UnrewindableBodyError``, and the redirect never went."""
    path = tmp_path / "body.json"
    path.write_bytes(BODY)
    with path.open("rb") if kind == "file" else io.BytesIO(BODY) as body, requests.Session() as session:
        session.trust_env = False
        answer = session.post(
            redirecting.url("/x"), data=body, headers=JSON, auth=RequestsAuth(signer), timeout=WAIT_S
        )
    assert answer.status_code == 200
    (called,) = redirecting.arrivals
    assert called.verified
    (landed,) = landing.arrivals
    assert landed.body == BODY  # the caller's body, resent (unsigned, as documented)
