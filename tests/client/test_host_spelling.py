"""A caller's ``Host`` goes out in the spelling signed.

The in-process signer signed the canonical form of a caller's Host (``localhost``) while the library
sent the caller's own (``LocalHost``); a verifier rebuilds ``@target-uri`` from the Host it receives
(RFC 9421 section 2.2.2), so our own request was refused by our own verifier. The adapters now send
the spelling signed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest
import requests

from signing_proxy.client import HttpxAuth, RequestsAuth, Signer, SigningMiddleware, key_file
from signing_proxy.config import parse_config
from tests.client.conftest import REDIRECT_KEY
from tests.harness import WAIT_S, VerifyingOrigin

pytestmark = pytest.mark.integration

KEY = REDIRECT_KEY


@pytest.fixture
def signer(tmp_path: Path) -> Signer:
    path = tmp_path / "agent-key.pem"
    path.write_bytes(KEY.to_pem())
    path.chmod(0o600)
    return Signer(key_file(path), parse_config({"signing": {"signature_agent": "https://agent.example"}}))


@pytest.fixture
def origin() -> Iterator[VerifyingOrigin]:
    with VerifyingOrigin({KEY.thumbprint: KEY.public}) as started:
        yield started


def via_httpx(signer: Signer, url: str, host: str) -> int:
    with httpx.Client(auth=HttpxAuth(signer), trust_env=False, timeout=WAIT_S) as client:
        return client.post(url, content=b"{}", headers={"Host": host}).status_code


def via_requests(signer: Signer, url: str, host: str) -> int:
    with requests.Session() as session:
        session.trust_env = False
        return session.post(
            url, data=b"{}", headers={"Host": host}, auth=RequestsAuth(signer), timeout=WAIT_S
        ).status_code


def via_aiohttp(signer: Signer, url: str, host: str) -> int:
    async def send() -> int:
        async with (
            aiohttp.ClientSession(middlewares=(SigningMiddleware(signer),)) as session,
            session.post(url, data=b"{}", headers={"Host": host}) as response,
        ):
            return response.status

    return asyncio.run(asyncio.wait_for(send(), WAIT_S))


@pytest.mark.parametrize("send", [via_httpx, via_requests, via_aiohttp], ids=["httpx", "requests", "aiohttp"])
@pytest.mark.parametrize("spelling", ["LocalHost:{port}", "LOCALHOST:{port}"])
def test_a_callers_host_goes_out_in_the_spelling_signed(
    signer: Signer, origin: VerifyingOrigin, send: Callable[[Signer, str, str], int], spelling: str
) -> None:
    port = origin.url("/").rsplit(":", 1)[1].rstrip("/")
    assert send(signer, origin.url("/x"), spelling.format(port=port)) == 200
    (arrival,) = origin.arrivals
    assert arrival.header("host") == f"localhost:{port}"
    assert (arrival.verified, arrival.oracle) == (True, "ok"), arrival.reason
