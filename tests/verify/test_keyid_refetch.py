"""Unknown keyid after rotation: a cached directory that lacks the signature's ``keyid`` is re-fetched
at most once per ``verify.keyid_refetch_s`` before the request is refused (fake fetcher and clock)."""

from __future__ import annotations

import pytest

from signing_proxy.core.jwk import SigningKey
from signing_proxy.verify import (
    DirectoryResolver,
    FetchResult,
    RequestVerifier,
    VerificationError,
    directory_url,
)
from tests.verify.fakes import NOW, Clock
from tests.verify.strangers import BODY, TARGET, CountingFetch, directory_doc, signed

OLD = SigningKey.from_seed(bytes(range(32)))
NEW = SigningKey.from_seed(bytes(range(1, 33)))
STRANGER = SigningKey.from_seed(bytes(range(2, 34)))
AGENT_DIR = "https://agent.example"
URL = directory_url(AGENT_DIR)


async def test_a_key_rotated_in_is_found_by_one_refetch_then_refetches_are_rate_limited() -> None:
    clock, fetch = Clock(), CountingFetch()
    fetch.answers[URL] = FetchResult(200, directory_doc(OLD, now=NOW), "max-age=3600")
    verifier = RequestVerifier(DirectoryResolver(fetch, clock=clock, keyid_refetch_s=30), clock=clock)
    await verifier.verify("POST", TARGET, signed(f'"{AGENT_DIR}"', OLD, now=NOW), BODY)
    fetch.answers[URL] = FetchResult(200, directory_doc(OLD, NEW, now=NOW), "max-age=3600")
    clock.now += 30
    stack = await verifier.verify("POST", TARGET, signed(f'"{AGENT_DIR}"', NEW, now=int(clock.now)), BODY)
    assert stack.agent.keyid == NEW.thumbprint
    assert fetch.calls == [URL, URL]
    for _ in range(5):  # a stranger's keyids: refused from the cache, no fetch per request
        with pytest.raises(VerificationError) as err:
            await verifier.verify(
                "POST", TARGET, signed(f'"{AGENT_DIR}"', STRANGER, now=int(clock.now)), BODY
            )
        assert err.value.reason == "unknown-keyid"
    assert fetch.calls == [URL, URL]
    clock.now += 30
    with pytest.raises(VerificationError):
        await verifier.verify("POST", TARGET, signed(f'"{AGENT_DIR}"', STRANGER, now=int(clock.now)), BODY)
    assert fetch.calls == [URL, URL, URL]  # once more, 30 s later
    await verifier.close()


async def test_a_failed_refetch_keeps_the_cached_directory() -> None:
    clock, fetch = Clock(), CountingFetch()
    fetch.answers[URL] = FetchResult(200, directory_doc(OLD, now=NOW), "max-age=3600")
    verifier = RequestVerifier(DirectoryResolver(fetch, clock=clock), clock=clock)
    await verifier.verify("POST", TARGET, signed(f'"{AGENT_DIR}"', OLD, now=NOW), BODY)
    clock.now += 60
    fetch.answers[URL] = FetchResult(503, b"", None)
    with pytest.raises(VerificationError) as err:
        await verifier.verify("POST", TARGET, signed(f'"{AGENT_DIR}"', NEW, now=int(clock.now)), BODY)
    assert err.value.reason == "unknown-keyid"
    stack = await verifier.verify("POST", TARGET, signed(f'"{AGENT_DIR}"', OLD, now=int(clock.now)), BODY)
    assert stack.agent.keyid == OLD.thumbprint
    await verifier.close()
