"""A key on a PKCS#11 token signs in-process off the event loop and within ``signing.pkcs11.timeout_s``.

``Signer.from_config`` takes ``signing.key: pkcs11:...``; the async adapters (aiohttp, httpx) signed
with it on the event loop, and every adapter waited on a token that hangs for as long as it hung. Now
the async adapters sign in a worker thread (the loop runs meanwhile) and every path waits at most
``timeout_s``: then ``NotSigned`` 503 and nothing is sent. Here the token is held (its ``sign`` waits
until the test releases it), so a refusal before the release can only be the timeout's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import requests

from signing_proxy.client import HttpxAuth, NotSigned, RequestsAuth, Signer, SigningMiddleware
from signing_proxy.config import parse_config
from signing_proxy.core.pkcs11_uri import parse_pkcs11_uri
from signing_proxy.service.tokenkeys import token_slot_for
from signing_proxy.storage.pkcs11 import TokenKey, generate_token_key
from tests.harness import WAIT_S, VerifyingOrigin
from tests.softhsm import SoftHsm, use_in_this_process

pytestmark = pytest.mark.integration

TIMEOUT_S = 0.3  # signing.pkcs11.timeout_s
HOLD_S = 5.0  # the longest the held token waits for its release (old code: the time the test took)


@dataclass
class HeldToken:
    """The token's ``sign`` waits for ``release``: ``entered`` once called, ``left`` once it returned."""

    entered: threading.Event = field(default_factory=threading.Event)
    left: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    threads: list[str] = field(default_factory=list)


@pytest.fixture
def held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Signer, HeldToken]]:
    hsm = SoftHsm(tmp_path / "hsm")
    use_in_this_process(hsm, monkeypatch)
    uri = hsm.uri("agent")
    config = parse_config(
        {"signing": {"key": uri, "pkcs11": {**hsm.pkcs11_config(), "timeout_s": TIMEOUT_S}}}
    )
    generate_token_key(token_slot_for(config, uri), parse_pkcs11_uri(uri))
    signer = Signer.from_config(config)
    token = HeldToken()
    sign = TokenKey.sign

    def held_sign(self: TokenKey, data: bytes) -> bytes:
        token.threads.append(threading.current_thread().name)
        token.entered.set()
        try:
            token.release.wait(HOLD_S)
            return sign(self, data)
        finally:
            token.left.set()

    monkeypatch.setattr(TokenKey, "sign", held_sign)
    try:
        yield signer, token
    finally:
        token.release.set()
        token.left.wait(WAIT_S)  # the token's thread is free again for the next test


@pytest.fixture
def origin() -> Iterator[VerifyingOrigin]:
    with VerifyingOrigin() as started:
        yield started


async def _held_then_refused(
    asked: asyncio.Future[Any], token: HeldToken, origin: VerifyingOrigin
) -> NotSigned:
    """Await ``asked`` (a request whose signature the token holds): the loop runs while the token
    holds it, and the request fails closed before the token answers."""
    assert await asyncio.wait_for(asyncio.to_thread(token.entered.wait, WAIT_S), WAIT_S)
    # this coroutine ran while the token was signing: the loop was not held with it
    assert not token.left.is_set()
    assert not asked.done()
    with pytest.raises(NotSigned) as refused:
        await asyncio.wait_for(asked, WAIT_S)
    assert not token.left.is_set()  # refused while the token still held it: the timeout's doing
    assert threading.main_thread().name not in token.threads  # never on the loop's thread
    assert origin.arrivals == []  # nothing was sent
    return refused.value


async def _released(token: HeldToken) -> None:
    token.release.set()
    assert await asyncio.to_thread(token.left.wait, WAIT_S)


async def test_aiohttp_signs_with_a_token_off_the_loop_and_fails_closed_after_timeout_s(
    held: tuple[Signer, HeldToken], origin: VerifyingOrigin
) -> None:
    signer, token = held

    async def get(session: aiohttp.ClientSession) -> int:
        async with session.get(origin.url("/feed")) as answer:
            return answer.status

    timeout = aiohttp.ClientTimeout(total=WAIT_S)
    async with aiohttp.ClientSession(middlewares=(SigningMiddleware(signer),), timeout=timeout) as session:
        refused = await _held_then_refused(asyncio.ensure_future(get(session)), token, origin)
        assert (refused.status, refused.reason) == (503, "signing-token-unavailable")
        await _released(token)
        origin.trust(token_public(signer))
        assert await get(session) == 200  # the token answers again: signed and sent
    [arrival] = origin.arrivals
    assert arrival.verified


async def test_httpx_async_signs_with_a_token_off_the_loop_and_fails_closed_after_timeout_s(
    held: tuple[Signer, HeldToken], origin: VerifyingOrigin
) -> None:
    signer, token = held
    async with httpx.AsyncClient(auth=HttpxAuth(signer), trust_env=False, timeout=WAIT_S) as client:
        asked = asyncio.ensure_future(client.post(origin.url("/feed"), content=b"payload"))
        refused = await _held_then_refused(asked, token, origin)
        assert (refused.status, refused.reason) == (503, "signing-token-unavailable")
        await _released(token)
        origin.trust(token_public(signer))
        assert (await client.post(origin.url("/feed"), content=b"payload")).status_code == 200
    [arrival] = origin.arrivals
    assert arrival.verified


def test_requests_waits_for_a_token_at_most_timeout_s(
    held: tuple[Signer, HeldToken], origin: VerifyingOrigin
) -> None:
    signer, token = held
    with pytest.raises(NotSigned) as refused:
        requests.get(origin.url("/feed"), auth=RequestsAuth(signer), timeout=WAIT_S)
    assert (refused.value.status, refused.value.reason) == (503, "signing-token-unavailable")
    assert not token.left.is_set()  # refused while the token still held it
    assert origin.arrivals == []


def token_public(signer: Signer) -> TokenKey:
    key = signer.keys.current(0)
    assert isinstance(key, TokenKey)
    return key
