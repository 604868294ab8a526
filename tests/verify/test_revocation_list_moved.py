"""A directory that moves its revocation list (R1 -> R2), most likely because R1's host died: a poll
of R1 still in flight is not the new list's poll. Joined, it refused every request
``revocation-unavailable`` until R1's fetch timed out, R2 untried; now R2 is fetched at once, what
R1 answers late is not applied, and ``close`` stops the old poll too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import RevocationList, render_revocation_list
from signing_proxy.verify import FetchResult, RevocationPoller
from tests.verify.fakes import NOW, Clock

DIR_URL = "https://agent.example/.well-known/http-message-signatures-directory"
R1, R2 = "https://old.example/revoked.json", "https://new.example/revoked.json"
FETCH_TIMEOUT_S = 30.0  # far beyond every wait of the test: no answer here comes from a timeout
WAIT_S = 5.0
# what R1 revoked first, what R2 lists, what R1 answers too late
FIRST, LISTED, LATE = (SigningKey.from_seed(bytes([n]) * 32).thumbprint for n in (1, 2, 3))


def listing(*thumbprints: str) -> FetchResult:
    return FetchResult(200, render_revocation_list(RevocationList(NOW, frozenset(thumbprints))), None)


async def never_wakes(_seconds: float) -> None:
    await asyncio.Event().wait()


@dataclass
class MovingLists:
    """R1 answers its first fetch, then hangs until ``release`` (never, unless the test says so);
    R2 answers at once. Records every fetch and whether a hanging one was cancelled."""

    answers: dict[str, FetchResult] = field(default_factory=lambda: {R1: listing(FIRST), R2: listing(LISTED)})
    calls: list[str] = field(default_factory=list)
    hanging: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: list[str] = field(default_factory=list)

    async def __call__(self, url: str) -> FetchResult:
        self.calls.append(url)
        if url == R1 and self.calls.count(R1) > 1:  # the old host died after its first answer
            self.hanging.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.append(url)
                raise
        return self.answers[url]


@pytest.fixture
async def moved() -> AsyncIterator[tuple[RevocationPoller, MovingLists, asyncio.Task[bool]]]:
    """A poller that fetched R1 once, with a poll of R1 hanging in flight."""
    fetch = MovingLists()
    poller = RevocationPoller(
        fetch, clock=Clock(), sleep=never_wakes, fetch_timeout_s=FETCH_TIMEOUT_S, holds=lambda _url: True
    )
    assert await poller.ensure(DIR_URL, R1) == {FIRST}
    old_poll = asyncio.get_running_loop().create_task(poller.poll_once(DIR_URL, R1))  # the periodic one
    await asyncio.wait_for(fetch.hanging.wait(), WAIT_S)
    yield poller, fetch, old_poll
    fetch.release.set()
    await poller.close()
    await asyncio.wait_for(old_poll, WAIT_S)


async def test_a_moved_list_is_fetched_at_once_while_the_old_lists_poll_hangs(
    moved: tuple[RevocationPoller, MovingLists, asyncio.Task[bool]],
) -> None:
    poller, fetch, old_poll = moved
    # the directory was re-fetched and names R2 now; a request asks for the key's revoked set
    async with asyncio.timeout(WAIT_S):  # joined to R1's poll, this waited FETCH_TIMEOUT_S and refused
        revoked = await poller.ensure(DIR_URL, R2)
    assert revoked == {FIRST, LISTED}  # R2's set; what R1 named stays revoked
    assert fetch.calls == [R1, R1, R2]
    assert not old_poll.done()  # R1's poll runs on, bounded by its fetch timeout
    # R1 answers late with a list of its own: not the word of the list the directory names now
    fetch.answers[R1] = listing(LATE)
    fetch.release.set()
    assert await asyncio.wait_for(old_poll, WAIT_S) is False
    assert poller.revoked(DIR_URL) == {FIRST, LISTED}
    assert await poller.ensure(DIR_URL, R2) == {FIRST, LISTED}  # R2's success stands


async def test_close_stops_the_poll_of_a_list_the_directory_no_longer_names(
    moved: tuple[RevocationPoller, MovingLists, asyncio.Task[bool]],
) -> None:
    poller, fetch, old_poll = moved
    async with asyncio.timeout(WAIT_S):
        assert await poller.ensure(DIR_URL, R2) == {FIRST, LISTED}
    await asyncio.wait_for(poller.close(), WAIT_S)  # R1 never answers: close cancels its fetch
    assert fetch.cancelled == [R1]
    assert await asyncio.wait_for(old_poll, WAIT_S) is False  # its waiter gets a refusal, not a hang
