"""Issue 15 attack 4, "hang it": whatever a directory fetch raises — a parser's TypeError on
``"alg": {}``, a fetcher bug, a server that never answers — the shared fetch settles and every
concurrent request gets an answer, with a stable reason and a generic detail, within the fetch timeout."""

from __future__ import annotations

import asyncio
import time

import pytest

from signing_proxy.core.jwk import SigningKey
from signing_proxy.verify import (
    DirectoryResolver,
    FetchResult,
    HttpClient,
    RequestVerifier,
    VerificationError,
    build_verifier,
    directory_url,
)
from tests.verify.strangers import BODY, LOOPBACK, TARGET, CountingFetch, signed

AGENT = SigningKey.from_seed(bytes(range(32)))
AGENT_DIR = "https://agent.example"
FETCH_TIMEOUT_S = 1.0  # the resolver's bound on one fetch, shortened for the test


async def three_at_once(verifier: RequestVerifier, agent: str) -> list[BaseException | object]:
    now = int(time.time())
    calls = [verifier.verify("POST", TARGET, signed(agent, AGENT, now=now), BODY) for _ in range(3)]
    # every request answered within the fetch timeout (plus scheduling slack), none left waiting
    return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), FETCH_TIMEOUT_S + 2)


def assert_refused(results: list[BaseException | object], reason: str) -> None:
    for result in results:
        assert isinstance(result, VerificationError), result
        assert result.reason == reason
        assert result.detail == "the key directory named by Signature-Agent is unavailable"


async def test_hangs_a_directory_key_with_alg_object_answers_every_concurrent_request() -> None:
    fetch = CountingFetch()
    key = '{"kty":"OKP","crv":"Ed25519","x":"' + AGENT.public.jwk()["x"] + '","alg":{},'
    key += '"not_before":"2020-01-01T00:00:00Z","not_after":"2999-01-01T00:00:00Z"}'
    fetch.answers[directory_url(AGENT_DIR)] = FetchResult(200, ('{"keys":[' + key + "]}").encode(), None)
    verifier = RequestVerifier(DirectoryResolver(fetch, fetch_timeout_s=FETCH_TIMEOUT_S))
    assert_refused(await three_at_once(verifier, f'"{AGENT_DIR}"'), "directory-unavailable")
    assert len(fetch.calls) == 1  # one shared fetch, settled with a negative entry
    await verifier.close()


@pytest.mark.parametrize("error", [TypeError("bug"), UnicodeError("label empty"), RuntimeError("x")])
async def test_hangs_a_fetcher_that_raises_anything_answers_every_concurrent_request(
    error: Exception,
) -> None:
    fetch = CountingFetch()
    fetch.answers[directory_url(AGENT_DIR)] = error
    verifier = RequestVerifier(DirectoryResolver(fetch, fetch_timeout_s=FETCH_TIMEOUT_S))
    assert_refused(await three_at_once(verifier, f'"{AGENT_DIR}"'), "directory-unavailable")
    assert len(fetch.calls) == 1
    await verifier.close()


async def test_hangs_a_directory_that_never_answers_times_out_for_every_request() -> None:
    async def never(_url: str) -> FetchResult:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    verifier = RequestVerifier(DirectoryResolver(never, fetch_timeout_s=FETCH_TIMEOUT_S))
    assert_refused(await three_at_once(verifier, f'"{AGENT_DIR}"'), "directory-unavailable")
    await verifier.close()


async def test_hangs_signature_agent_with_an_empty_label_is_refused_at_once() -> None:
    async with HttpClient.standalone() as client:
        verifier = build_verifier(client=client, egress=LOOPBACK)
        results = await three_at_once(verifier, "http://a..b/")
        for result in results:
            assert isinstance(result, VerificationError), result
            assert result.reason == "malformed-signature-agent"  # no host: no directory base
        await verifier.close()


async def test_hangs_a_waiter_that_goes_away_does_not_cancel_the_others() -> None:
    gate = asyncio.Event()
    now = int(time.time())
    body = (
        '{"keys":[{"kty":"OKP","crv":"Ed25519","x":"' + AGENT.public.jwk()["x"] + '",'
        '"not_before":"2020-01-01T00:00:00Z","not_after":"2999-01-01T00:00:00Z"}]}'
    ).encode()

    async def slow(_url: str) -> FetchResult:
        await gate.wait()
        return FetchResult(200, body, None)

    verifier = RequestVerifier(DirectoryResolver(slow, fetch_timeout_s=FETCH_TIMEOUT_S))
    first = asyncio.ensure_future(
        verifier.verify("POST", TARGET, signed(f'"{AGENT_DIR}"', AGENT, now=now), BODY)
    )
    second = asyncio.ensure_future(
        verifier.verify("POST", TARGET, signed(f'"{AGENT_DIR}"', AGENT, now=now), BODY)
    )
    await asyncio.sleep(0)
    first.cancel()  # the client that started the fetch disconnects
    gate.set()
    stack = await asyncio.wait_for(second, FETCH_TIMEOUT_S + 2)
    assert stack.agent.keyid == AGENT.thumbprint
    await verifier.close()
