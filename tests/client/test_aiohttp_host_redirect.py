"""aiohttp: a redirect to another origin is never signed for the caller's ``Host``.

aiohttp keeps a ``Host`` the caller set when it follows a redirect to another origin, and the
middleware signed each hop for that Host: the second origin received a signature (over the path the
redirect chose, the method, a 307's body) that verified for the first, to replay there. A redirect to
an origin other than the one the caller's Host was set for is now signed for its own URL and sent
with that URL's Host, as httpx's redirect hooks sign it; within that origin the caller's Host stays.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from signing_proxy.client import Signer, SigningMiddleware, key_file
from signing_proxy.config import parse_config
from tests.client.conftest import REDIRECT_KEY
from tests.harness import WAIT_S, Arrival, VerifyingOrigin

pytestmark = pytest.mark.integration

KEY = REDIRECT_KEY
BODY = b'{"a":1}'
HOST = "api.example"  # the name the caller signs for, sending to an address
JSON = {"Content-Type": "application/json", "Host": HOST}


@pytest.fixture
def signer(tmp_path: Path) -> Signer:
    path = tmp_path / "agent-key.pem"
    path.write_bytes(KEY.to_pem())
    path.chmod(0o600)
    return Signer(key_file(path), parse_config({"signing": {"signature_agent": "https://agent.example"}}))


def send(signer: Signer, *urls: str, follow: bool = True) -> list[int]:
    """POST ``BODY`` with ``Host: api.example`` to each of ``urls`` in turn, on one session and task."""

    async def run() -> list[int]:
        statuses = []
        async with aiohttp.ClientSession(
            middlewares=(SigningMiddleware(signer),), trust_env=False
        ) as session:
            for url in urls:
                async with session.post(url, data=BODY, headers=JSON, allow_redirects=follow) as response:
                    await response.read()
                    statuses.append(response.status)
        return statuses

    return asyncio.run(asyncio.wait_for(run(), WAIT_S))


def redirect_to(origin: VerifyingOrigin, status: int, location: str, *, only: str = "/hello") -> None:
    """``origin`` answers ``status`` to ``location`` for a request to ``only``, and 200 otherwise."""

    async def moved(request: web.Request) -> web.StreamResponse:
        if request.path != only:
            return web.json_response({})
        return web.Response(status=status, headers={"Location": location})

    origin.handler = moved


def replayed_at(origin: VerifyingOrigin, arrival: Arrival, authority: str) -> bool:
    """Would ``arrival``'s signature verify, sent on as it came to a server named ``authority``?"""
    lines = [(name, authority if name.lower() == "host" else value) for name, value in arrival.lines]
    path = arrival.target_uri.split("/", 3)[3]
    return origin.verify(arrival.method, f"http://{authority}/{path}", lines, arrival.body).verified


@pytest.mark.parametrize(("status", "method"), [(302, "GET"), (303, "GET"), (307, "POST"), (308, "POST")])
def test_a_redirect_to_another_origin_is_signed_for_where_it_goes(
    signer: Signer,
    redirecting: VerifyingOrigin,
    landing: VerifyingOrigin,
    status: int,
    method: str,
) -> None:
    redirect_to(redirecting, status, landing.url("/svc.v1.ExchangeService/ExecuteTransaction"))
    assert send(signer, redirecting.url("/hello")) == [200]
    (first,) = redirecting.arrivals
    (landed,) = landing.arrivals
    assert not replayed_at(redirecting, landed, HOST)  # nothing to replay at the first origin
    assert (first.header("host"), first.verified, first.oracle) == (HOST, True, "ok"), first.reason
    assert landed.header("host") == f"127.0.0.1:{landing.port}"
    assert landed.target_uri == landing.url("/svc.v1.ExchangeService/ExecuteTransaction")
    assert (landed.method, landed.verified, landed.oracle) == (method, True, "ok"), landed.reason
    assert landed.body == (BODY if method == "POST" else b"")


def test_a_redirect_within_the_origin_keeps_the_callers_host(
    signer: Signer, redirecting: VerifyingOrigin
) -> None:
    redirect_to(redirecting, 307, redirecting.url("/again"))
    assert send(signer, redirecting.url("/hello")) == [200]
    assert [a.target_uri for a in redirecting.arrivals] == [f"http://{HOST}/hello", f"http://{HOST}/again"]
    assert all((a.verified, a.oracle) == (True, "ok") for a in redirecting.arrivals)


def test_back_at_the_first_origin_the_callers_host_is_signed_again(
    signer: Signer, redirecting: VerifyingOrigin, landing: VerifyingOrigin
) -> None:
    """The Host was set for the first origin, wherever the chain went in between."""
    redirect_to(redirecting, 307, landing.url("/landing"))
    redirect_to(landing, 307, redirecting.url("/back"), only="/landing")
    assert send(signer, redirecting.url("/hello")) == [200]
    (landed,) = landing.arrivals
    assert (landed.header("host"), landed.verified) == (f"127.0.0.1:{landing.port}", True)
    assert [a.target_uri for a in redirecting.arrivals] == [f"http://{HOST}/hello", f"http://{HOST}/back"]
    assert all(a.verified for a in redirecting.arrivals)


def test_a_later_request_of_the_task_keeps_the_callers_host(
    signer: Signer, redirecting: VerifyingOrigin, landing: VerifyingOrigin
) -> None:
    """What a followed redirect left for its next hop is not applied to the caller's next request."""
    redirect_to(redirecting, 307, landing.url("/landing"))
    assert send(signer, redirecting.url("/hello"), landing.url("/next")) == [200, 200]
    landed, following = landing.arrivals
    assert landed.header("host") == f"127.0.0.1:{landing.port}"
    assert (following.target_uri, following.verified) == (f"http://{HOST}/next", True)


def test_a_redirect_followed_by_hand_is_signed_for_where_it_goes(
    signer: Signer, redirecting: VerifyingOrigin, landing: VerifyingOrigin
) -> None:
    """``allow_redirects=False``, then the same Host to the Location: the middleware cannot tell it
    from the redirect aiohttp follows, and takes the side that hands the second origin nothing."""
    redirect_to(redirecting, 307, landing.url("/landing"))
    assert send(signer, redirecting.url("/hello"), landing.url("/landing"), follow=False) == [307, 200]
    (landed,) = landing.arrivals
    assert not replayed_at(redirecting, landed, HOST)
    assert (landed.header("host"), landed.verified) == (f"127.0.0.1:{landing.port}", True)
