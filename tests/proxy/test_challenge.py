"""Challenge-driven signing against a test origin: 401 + ``Accept-Signature`` asking for web-bot-auth
gets exactly one signed retry for a GET (with the origin's nonce and components), none for a POST
(the challenge goes back to the agent), never a loop, and ``profiles.learn`` remembers the host."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from aiohttp import web

from signing_proxy.core.jwk import SigningKey
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin, wait_for

pytestmark = pytest.mark.integration

KEY = SigningKey.generate()
NONCE = "b3JpZ2luLWNob3Nlbi1ub25jZQ=="
CHALLENGE = f'sig1=("@authority" "@path" "signature-agent");tag="web-bot-auth";nonce="{NONCE}"'


def _web_signed(request: web.Request) -> bool:
    return 'tag="web-bot-auth"' in request.headers.get("Signature-Input", "")


async def challenging(request: web.Request) -> web.StreamResponse:
    """200 to a web-bot-auth signature, else 401 asking for one; ``/always`` asks every time."""
    if _web_signed(request) and request.path != "/always":
        return web.json_response({"ok": True})
    return web.json_response({"ok": False}, status=401, headers={"Accept-Signature": CHALLENGE})


@pytest.fixture
def origin() -> Iterator[VerifyingOrigin]:
    with VerifyingOrigin(handler=challenging) as server:
        server.trust(KEY)
        yield server


def _proxy(tmp: Path, **profiles: Any) -> ProxyProcess:
    config = {
        "log": {"format": "json"},
        "signing": {"signature_agent": "https://agent.example"},
        "profiles": profiles,
    }
    return ProxyProcess(tmp, config, key=KEY)


def _send(proxy: ProxyProcess, method: str, url: str) -> requests.Response:
    return requests.request(
        method, url, data=b"x" if method == "POST" else None, proxies={"http": proxy.url}, timeout=WAIT_S
    )


def test_a_get_gets_exactly_one_retry_signed_as_the_challenge_asked(
    origin: VerifyingOrigin, tmp_path: Path
) -> None:
    with _proxy(tmp_path) as proxy:
        resp = _send(proxy, "GET", origin.url("/page?x=1"))
        wait_for(lambda: len(proxy.access_lines()) == 1, "the access-log line")
        (line,) = proxy.access_lines()
    assert line["profile"] == "web-bot-auth"  # the retry's, the one whose answer the agent got
    assert resp.status_code == 200
    first, retry = origin.arrivals  # exactly two
    assert first.verified
    assert 'tag="web-bot-auth"' not in (first.header("signature-input") or "")  # svc, the default
    assert retry.verified, retry.reason
    assert retry.oracle == "ok"
    raw = retry.header("signature-input") or ""
    assert raw.startswith('agent=("@authority" "@path" "signature-agent";key="agent");')
    assert f'nonce="{NONCE}";tag="web-bot-auth"' in raw
    assert retry.header("signature-agent") == 'agent="https://agent.example"'


def test_a_post_is_not_retried_and_the_challenge_goes_back(origin: VerifyingOrigin, tmp_path: Path) -> None:
    with _proxy(tmp_path) as proxy:
        resp = _send(proxy, "POST", origin.url("/submit"))
        wait_for(lambda: len(proxy.access_lines()) == 1, "the access-log line")
        (line,) = proxy.access_lines()
    assert line["profile"] == "svc"
    assert line["status"] == 401
    assert resp.status_code == 401
    assert resp.headers["Accept-Signature"] == CHALLENGE
    assert len(origin.arrivals) == 1


def test_a_challenge_repeated_after_the_retry_is_passed_back(origin: VerifyingOrigin, tmp_path: Path) -> None:
    with _proxy(tmp_path) as proxy:
        resp = _send(proxy, "GET", origin.url("/always"))
    assert resp.status_code == 401
    assert resp.headers["Accept-Signature"] == CHALLENGE
    assert len(origin.arrivals) == 2  # one retry, no loop


def test_learning_remembers_the_host(origin: VerifyingOrigin, tmp_path: Path) -> None:
    with _proxy(tmp_path, learn=True) as proxy:
        assert _send(proxy, "GET", origin.url("/a")).status_code == 200
        assert _send(proxy, "GET", origin.url("/b")).status_code == 200
    assert len(origin.arrivals) == 3  # challenged once; the next request is signed web-bot-auth at once
    assert 'tag="web-bot-auth"' in (origin.arrivals[2].header("signature-input") or "")


def test_without_learning_every_request_is_challenged(origin: VerifyingOrigin, tmp_path: Path) -> None:
    with _proxy(tmp_path) as proxy:
        assert _send(proxy, "GET", origin.url("/a")).status_code == 200
        assert _send(proxy, "GET", origin.url("/b")).status_code == 200
    assert len(origin.arrivals) == 4


def test_with_a_registry_path_the_challenge_goes_back_and_no_broken_member_is_sent(
    origin: VerifyingOrigin, tmp_path: Path
) -> None:
    """protocol-02: a Signature-Agent member is an https origin, and a verifier ignores any other. A
    registry path (``/agents/alice``, right for the spec's profile) went out on the retry as
    ``agent="https://.../agents/alice"``: declined now, the origin's challenge reaches the agent."""
    registry = "https://registry.example/agents/alice"
    config = {"log": {"format": "json"}, "signing": {"signature_agent": registry}}
    with ProxyProcess(tmp_path, config, key=KEY) as proxy:
        resp = _send(proxy, "GET", origin.url("/page"))
        wait_for(lambda: len(proxy.access_lines()) == 1, "the access-log line")
        (line,) = proxy.access_lines()
        declined = [entry for entry in proxy.stderr_lines if "retry declined" in entry]
    assert resp.status_code == 401
    assert resp.headers["Accept-Signature"] == CHALLENGE
    assert (line["profile"], line["status"]) == ("svc", 401)
    (first,) = origin.arrivals  # no retry
    assert first.verified
    assert first.header("signature-agent") == f'"{registry}"'  # the spec's profile takes a path
    assert len(declined) == 1
    assert f"signing.signature_agent '{registry}' is no https origin" in declined[0]
