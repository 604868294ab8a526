"""A directory a signature verified with ("vouched") comes back into the byte-bounded cache without
spending fetch budget, but at most once per ``VOUCHED_RETURN_S``: a stranger's few dozen vouched
directories, padded to push one another out, came back free on every request, and so did the
revocation lists they name (anyone's URL): the fetch budget bounded nothing any more."""

from __future__ import annotations

import json

import pytest

from signing_proxy.core.jwk import SigningKey
from signing_proxy.verify import (
    DirectoryResolver,
    FetchResult,
    RequestVerifier,
    RevocationPoller,
    VerificationError,
    VerifierPolicy,
    directory,
    directory_url,
)
from signing_proxy.verify.cache import TokenBucket
from signing_proxy.verify.directory import VOUCHED_RETURN_S
from tests.verify.fakes import NOW, Clock
from tests.verify.strangers import BODY, TARGET, CountingFetch, directory_doc, revocation_doc, signed

KEY = SigningKey.from_seed(bytes(range(32)))
DIRECTORIES = 40  # each charged ~240 KB: more than the 8 MiB cache holds at once


async def test_vouched_directories_come_back_free_once_a_minute_not_on_every_request() -> None:
    clock, fetch = Clock(), CountingFetch()
    bases = [f"https://evil.example/d{i}" for i in range(DIRECTORIES)]
    for i, base in enumerate(bases):
        listed = f"https://victim.example/anything?{i}"
        doc = directory_doc(KEY, now=int(NOW), revocation_url=listed)
        padded = doc[:-1] + b" " * (60_000 - len(doc)) + doc[-1:]  # JSON whitespace: 60 KB
        assert json.loads(padded)
        fetch.answers[directory_url(base)] = FetchResult(200, padded, "max-age=21600")
        fetch.answers[listed] = FetchResult(200, revocation_doc(as_of=int(NOW)), "max-age=60")
    budget = TokenBucket(0.0001, DIRECTORIES, clock)  # one token each, none refilled to speak of
    resolver = DirectoryResolver(fetch, clock=clock, fetch_budget=budget)
    verifier = RequestVerifier(
        resolver, VerifierPolicy(), revocations=RevocationPoller(fetch, clock=clock), clock=clock
    )
    try:
        for base in bases:  # each verified once: vouched
            await verifier.verify("POST", TARGET, signed(f'"{base}"', KEY, now=int(NOW)), BODY)
        assert not budget.take()
        before = len(fetch.calls)
        reasons: list[str] = []
        for _round in range(5):
            for base in bases:
                try:
                    await verifier.verify("POST", TARGET, signed(f'"{base}"', KEY, now=int(NOW)), BODY)
                except VerificationError as exc:
                    reasons.append(exc.reason)
        directories = [url for url in fetch.calls[before:] if ".well-known" in url]
        assert len(directories) <= DIRECTORIES  # each came back free once in the minute, no more
        assert "verifier-busy" in reasons  # then a return spends a token, and there is none
        clock.now += VOUCHED_RETURN_S  # a minute on: each may come back free once more
        for base in bases[:3]:
            stack = await verifier.verify("POST", TARGET, signed(f'"{base}"', KEY, now=int(clock.now)), BODY)
            assert stack.hops == 1
    finally:
        await verifier.close()


def test_a_directory_vouched_again_is_the_most_recently_vouched(monkeypatch: pytest.MonkeyPatch) -> None:
    """Vouching again left a directory where its first vouch put it: a stranger's own vouched
    directories, enough of them, pushed out an agent that verified every second."""
    monkeypatch.setattr(directory, "VOUCHED_ENTRIES", 4)
    resolver = DirectoryResolver(CountingFetch(), clock=Clock())
    ours = directory_url("https://agent.example")
    resolver.vouch(ours)
    for n in range(3):
        resolver.vouch(directory_url(f"https://s{n}.evil.example"))
        resolver.vouch(ours)  # a signature of ours verified again
    resolver.vouch(directory_url("https://s3.evil.example"))  # the fifth: the least recent goes
    assert ours in resolver._vouched
