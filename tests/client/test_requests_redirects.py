"""requests: the URL goes out in the form signed, and a redirect never carries the first signature.

requests re-applies no auth to a redirect it follows: it copied the first request's fields, so the
signature for one URL went to another (another origin, even), which could replay it for the first.
And a URL written with its default port (``http://h:80/p``) was signed as ``http://h/p`` but sent to
a proxy as written, so no verifier rebuilding the target from the wire could check it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from aiohttp import web

from signing_proxy.client import RequestsAuth, Signer, key_file
from signing_proxy.config import parse_config
from tests.client.conftest import REDIRECT_KEY
from tests.harness import VerifyingOrigin
from tests.oracle import oracle_verify

KEY = REDIRECT_KEY
TIMEOUT_S = 10
SIGNATURE_FIELDS = ("signature", "signature-input", "content-digest", "signature-agent")


@pytest.fixture
def auth(tmp_path: Path) -> RequestsAuth:
    path = tmp_path / "agent-key.pem"
    path.write_bytes(KEY.to_pem())
    path.chmod(0o600)
    config = parse_config({"signing": {"signature_agent": "https://agent.example"}})
    return RequestsAuth(Signer(key_file(path), config))


@pytest.mark.parametrize(
    ("url", "sent"),
    [
        ("http://example.com:80/p", "http://example.com/p"),
        ("https://EXAMPLE.com:443/p?q=1", "https://example.com/p?q=1"),
        ("http://example.com:8080/p", "http://example.com:8080/p"),  # not a default port: kept
    ],
)
def test_the_url_sent_is_the_url_signed(auth: RequestsAuth, url: str, sent: str) -> None:
    prepared = requests.Request("POST", url, data=b"{}").prepare()
    signed = auth(prepared)
    assert signed.url == sent
    lines = list(signed.headers.items())
    assert isinstance(signed.body, bytes)
    assert oracle_verify("POST", sent, lines, signed.body, {KEY.thumbprint: KEY.public.key}) == ["agent"]


@pytest.mark.integration
@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_followed_redirect_never_carries_the_first_signature(
    auth: RequestsAuth, redirecting: VerifyingOrigin, landing: VerifyingOrigin, status: int
) -> None:
    async def moved(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, headers={"Location": landing.url("/landing")})

    redirecting.handler = moved
    with requests.Session() as session:
        session.trust_env = False
        response = session.post(redirecting.url("/start"), data=b'{"a":1}', auth=auth, timeout=TIMEOUT_S)
    assert response.status_code == 200
    assert [r.status_code for r in response.history] == [status]
    (signed,) = redirecting.arrivals
    assert (signed.verified, signed.oracle) == (True, "ok")  # the first request was signed
    (landed,) = landing.arrivals  # another origin: none of the first signature's fields reach it
    assert not [name for name, _ in landed.lines if name.lower() in SIGNATURE_FIELDS]
    assert landed.verified is False


@pytest.mark.integration
def test_a_redirect_not_followed_is_answered_and_the_next_request_signed_anew(
    auth: RequestsAuth, redirecting: VerifyingOrigin, landing: VerifyingOrigin
) -> None:
    """``allow_redirects=False``, then the next request sent by the caller: both verify."""
    with requests.Session() as session:
        session.trust_env = False
        moved = session.get(redirecting.url("/start"), auth=auth, allow_redirects=False, timeout=TIMEOUT_S)
        assert moved.status_code == 307
        assert session.get(moved.headers["Location"], auth=auth, timeout=TIMEOUT_S).status_code == 200
    assert [(a.verified, a.oracle) for a in [*redirecting.arrivals, *landing.arrivals]] == [(True, "ok")] * 2
