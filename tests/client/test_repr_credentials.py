"""No credential in a ``repr``: ``SignedRequest`` (public API) carries a configured bearer in its
``Authorization``, and the httpx auth keeps the caller's ``Authorization`` in ``request.extensions``;
both were shown in full by their ``repr`` (a log line, a traceback, a debugger). The other fields
still show."""

from __future__ import annotations

import httpx

from signing_proxy.client import HttpxAuth, SignedRequest, Signer
from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider

KEY = SigningKey.from_seed(b"\x43" * 32)
BEARER = "SUPERSECRETBEARER123"
CALLER = "CALLERSECRET456"


def test_a_signed_requests_repr_hides_the_bearer_and_shows_the_rest() -> None:
    rule = {"hosts": ["api.example"], "bearer_env": "API_TOKEN"}
    signer = Signer(
        StaticKeyProvider(KEY), parse_config({"credentials": [rule]}), environ={"API_TOKEN": BEARER}
    )
    signed = signer.sign("POST", "https://api.example/x", [("Host", "API.example")], b"body")
    assert signed is not None
    assert ("Authorization", f"Bearer {BEARER}") in signed.fields  # sent as it is
    shown = repr(signed)
    assert BEARER not in shown
    assert "('Authorization', '<redacted>')" in shown
    for name, value in signed.fields:
        if name != "Authorization":
            assert repr((name, value)) in shown  # Content-Digest, Signature-Input, Signature, ...
    assert repr(KEY.thumbprint) in shown
    assert "body=<4 bytes>" in shown
    assert "host='api.example'" in shown


def test_proxy_authorization_is_hidden_and_an_empty_authorization_shown() -> None:
    shown = repr(
        SignedRequest(
            (("Authorization", ""), ("Proxy-Authorization", "Basic dXNlcjpwYXNz")), b"", "kid", None
        )
    )
    assert "dXNlcjpwYXNz" not in shown
    assert "('Proxy-Authorization', '<redacted>')" in shown
    assert "('Authorization', '')" in shown  # nothing to hide: shown as sent


def test_the_httpx_auths_record_of_a_request_hides_the_callers_authorization() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    auth = HttpxAuth(Signer(StaticKeyProvider(KEY)))
    hooks = auth.redirect_hooks()  # the auth then remembers each request in its extensions
    transport = httpx.MockTransport(answer)
    with httpx.Client(auth=auth, transport=transport, event_hooks=hooks, follow_redirects=True) as client:
        client.post("https://api.example/x", content=b"body", headers={"Authorization": f"Bearer {CALLER}"})
    [request] = seen
    assert request.headers["Authorization"] == f"Bearer {CALLER}"  # sent as the caller gave it
    shown = repr(request.extensions)
    assert CALLER not in shown
    assert "method='POST'" in shown
    assert "authorization='<redacted>'" in shown
    assert "body=<4 bytes>" in shown
