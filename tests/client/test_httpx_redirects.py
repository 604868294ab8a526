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

KEY = REDIRECT_KEY
BODY = b'{"a":1}'
CALL = "/v1/svc.v1.ExchangeService/ExecuteTransaction"
SIGNATURE_FIELDS = ("signature", "signature-input", "content-digest", "signature-agent")


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


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.integration
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


# The cases below need origins a loopback test cannot be (a name marked unsigned, an https upgrade of
# one host): httpx's own MockTransport answers, and httpx's own redirect code runs as in service.


def mock_run(
    auth: HttpxAuth,
    start: str,
    location: str,
    status: int,
    method: str = "GET",
    *,
    headers: dict[str, str] | None = None,
) -> list[httpx.Request]:
    """Send ``method start`` through httpx following one redirect to ``location``; what was sent."""
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return (
            httpx.Response(status, headers={"Location": location}) if len(sent) == 1 else httpx.Response(200)
        )

    with httpx.Client(
        auth=auth,
        event_hooks=auth.redirect_hooks(),
        follow_redirects=True,
        transport=httpx.MockTransport(answer),
    ) as client:
        client.request(method, start, content=BODY if method == "POST" else None, headers=headers)
    return sent


def configured(tmp_path: Path, **config: object) -> HttpxAuth:
    path = tmp_path / "agent-key.pem"
    path.write_bytes(KEY.to_pem())
    path.chmod(0o600)
    return HttpxAuth(
        Signer(
            key_file(path), parse_config({"signing": {"signature_agent": "https://agent.example"}, **config})
        )
    )


def test_a_redirect_to_an_unsigned_host_carries_none_of_the_first_signature(tmp_path: Path) -> None:
    """httpx copied the first signature to a ``hosts.unsigned`` host, which could replay it for the
    first URL (the signer signs nothing there, and the hook returned)."""
    auth = configured(tmp_path, hosts={"unsigned": ["internal.example"]})
    first, landed = mock_run(auth, "https://pub.example/article", "https://internal.example/x", 302)
    assert "signature" in first.headers
    assert not [name for name in landed.headers if name.lower() in SIGNATURE_FIELDS]


def test_a_bearer_the_auth_added_does_not_follow_an_upgrade_its_rule_excludes(tmp_path: Path) -> None:
    """httpx keeps ``Authorization`` on an http -> https redirect of one host; the hook took the
    bearer it had added for port 80 as the caller's and sent it to 443, which the rule excludes."""
    token = tmp_path / "token"
    token.write_text("s3cr3t\n")
    token.chmod(0o600)
    rule = {"hosts": ["pub.example"], "bearer_file": str(token), "allow_plaintext": True, "ports": [80]}
    auth = configured(tmp_path, credentials=[rule])
    first, landed = mock_run(auth, "http://pub.example/a", "https://pub.example/b", 302)
    assert first.headers["authorization"] == "Bearer s3cr3t"
    assert (landed.url.scheme, landed.headers["authorization"]) == ("https", "")  # covered, empty


def test_a_callers_own_authorization_stays_on_a_same_origin_redirect(tmp_path: Path) -> None:
    auth = configured(tmp_path)
    headers = {"Authorization": "Bearer callers-own"}
    first, landed = mock_run(auth, "https://pub.example/a", "/b", 307, "POST", headers=headers)
    assert first.headers["authorization"] == landed.headers["authorization"] == "Bearer callers-own"
    assert landed.url.path == "/b"
    assert "signature" in landed.headers


def test_a_redirect_from_an_unsigned_host_is_signed_where_it_goes(tmp_path: Path) -> None:
    auth = configured(tmp_path, hosts={"unsigned": ["internal.example"]})
    first, landed = mock_run(auth, "https://internal.example/x", "https://pub.example/article", 302)
    assert "signature" not in first.headers
    assert "signature" in landed.headers
