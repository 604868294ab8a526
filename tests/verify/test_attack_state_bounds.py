"""Issue 15 attack 3, "grow its memory without bound": 10,000 requests naming unique directories
(each with its own revocation list) leave the directory cache, the negative cache and the pollers at
their caps, and no metric series per URL. Driven in-process with a fake, instant fetcher."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import DIRECTORY_PATH
from signing_proxy.errors import DirectoryError
from signing_proxy.verify import (
    DirectoryResolver,
    FetchResult,
    RequestVerifier,
    RevocationPoller,
    VerificationError,
)
from signing_proxy.verify.directory import URL_STORE_BYTES
from tests.memory import held_after
from tests.verify.strangers import BODY, TARGET, directory_doc, forged, revocation_doc

ATTACKER = SigningKey.from_seed(bytes(range(7, 39)))
UNIQUE = 10_000
CACHE_ENTRIES = 1024  # verify.directory_cache_entries default
NEGATIVE_ENTRIES = 4096  # verify.negative_cache_entries default


class AttackerWorld:
    """Every ``https://dN.attacker.example`` serves a directory with the attacker's key and its own
    revocation list; ``failing`` makes every directory answer 404 instead."""

    def __init__(self, now: int, *, failing: bool = False) -> None:
        self.now = now
        self.failing = failing
        self.revocations = FetchResult(200, revocation_doc(as_of=now), None)
        self.calls = 0

    async def __call__(self, url: str) -> FetchResult:
        self.calls += 1
        if url.endswith(DIRECTORY_PATH):
            if self.failing:
                return FetchResult(404, b"", None)
            base = url.removesuffix(DIRECTORY_PATH)
            return FetchResult(
                200, directory_doc(ATTACKER, now=self.now, revocation_url=f"{base}/r.json"), None
            )
        return self.revocations


async def flood(verifier: RequestVerifier, now: int, count: int) -> set[str]:
    reasons = set()
    for n in range(count):
        fields = forged(f'"https://d{n}.attacker.example"', ATTACKER.thumbprint, now=now)
        try:
            await verifier.verify("POST", TARGET, fields, BODY)
        except VerificationError as exc:
            reasons.add(exc.reason)
    return reasons


async def test_state_bounds_10000_unique_directories_keep_cache_and_pollers_at_their_caps() -> None:
    now = int(time.time())
    world = AttackerWorld(now)
    poller = RevocationPoller(world)
    resolver = DirectoryResolver(world)
    verifier = RequestVerifier(resolver, revocations=poller)
    reasons = await flood(verifier, now, UNIQUE)
    assert reasons == {"bad-signature"}  # every directory and list was fetched, then the forgery refused
    assert world.calls == 2 * UNIQUE
    await asyncio.sleep(0)  # let cancelled pollers finish
    assert len(resolver) == CACHE_ENTRIES
    assert len(poller) <= CACHE_ENTRIES
    assert poller.pollers() <= CACHE_ENTRIES
    running = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert len(running) <= CACHE_ENTRIES
    assert len(list(poller.ages())) <= CACHE_ENTRIES  # the revocation-age metric aggregates these
    await verifier.close()


async def test_state_bounds_10000_failing_directories_keep_the_negative_cache_at_its_cap() -> None:
    now = int(time.time())
    world = AttackerWorld(now, failing=True)
    resolver = DirectoryResolver(world)
    verifier = RequestVerifier(resolver)
    assert await flood(verifier, now, UNIQUE) == {"directory-unavailable"}
    assert resolver.failures_cached == NEGATIVE_ENTRIES
    assert len(resolver) == 0
    await verifier.close()


async def test_state_bounds_the_byte_budget_holds_before_the_entry_cap() -> None:
    now = int(time.time())
    world = AttackerWorld(now)
    budget = 256 * 1024
    resolver = DirectoryResolver(world, max_bytes=budget)
    verifier = RequestVerifier(resolver)
    await flood(verifier, now, 2_000)
    assert 0 < resolver.cached_bytes <= budget
    await verifier.close()


async def test_state_bounds_failing_directories_with_long_urls_hold_what_the_store_is_charged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The negative cache was bounded by count only: 4,096 failed directory URLs of 2,000 characters
    held about 9 MiB. Each entry is now charged its URL against URL_STORE_BYTES. (Each failure is
    logged at info: with a test before it leaving that level on, pytest's capture kept 70 MB of
    records; only what the resolver holds is measured here.)"""
    caplog.set_level(logging.WARNING, logger="signing_proxy")
    world = AttackerWorld(int(time.time()), failing=True)
    resolver = DirectoryResolver(world)
    with held_after() as held:
        for n in range(NEGATIVE_ENTRIES):
            with pytest.raises(DirectoryError):
                await resolver.get(f"https://d{n}.attacker.example/{'p' * 1900}", budgeted=False)
    assert 0 < resolver.failures_cached < NEGATIVE_ENTRIES
    assert held.bytes < 1.5 * URL_STORE_BYTES  # 9 MiB when only the count bounded it


def test_state_bounds_directories_that_vouched_are_charged_their_urls() -> None:
    """A stranger's directory is remembered as vouched once a signature of its verified (one
    budgeted fetch each): long URLs reach the byte bound before the count."""
    resolver = DirectoryResolver(AttackerWorld(int(time.time())))
    for n in range(4096):
        resolver.vouch(f"https://d{n}.attacker.example/{'p' * 1900}{DIRECTORY_PATH}")
    assert 0 < len(resolver._vouched) < 4096
    assert resolver._vouched.bytes <= URL_STORE_BYTES
