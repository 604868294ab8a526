"""Revocation lists of other participants' directories: one revoked set per directory, polled while the
directory is cached.

A list applies only to the keys of the directory that names it (DESIGN section 7): a stranger's
directory can name anyone's thumbprints and change nothing for anyone else. ``RevocationPoller``
keeps, per directory URL, the set its ``revocation_url`` served: each successful poll replaces it
(spec "Key publication, rotation and revocation" 3), except that a thumbprint this directory's list
once named stays refused for this directory (spec "States and transitions": "a revoked thumbprint
stays revoked"), also after the directory left the cache and came back: sets of directories that
left are kept aside, for 4,096 directories and 8 MiB at most (each charged its thumbprints and its
URL). Strangers' lists can push strangers' sets out of that store, never those of the directories
the operator named (``configure``: brokers, issuers, exchanges), which are kept whatever comes. One
directory holds at most ``MAX_REVOKED_PER_DIRECTORY`` (11,468) thumbprints, charged a quarter of
either store at most: a longer list is refused (``revocation-list-too-large``) like any unusable
list, so no one directory's list pushes other directories out of the cache, nor their sets out of
the store. A directory whose list was never fetched fails closed (``revocation-unavailable``),
retried at most every ``retry_s``; a failed later poll keeps the last set. Each tracked directory is
polled every 300 s +/-10 % with an injected clock, sleep and random source, and its poller cancelled
when the resolver drops the directory. Attempts, successes and ages are timed on ``monotonic``
(``duration_clock``): a wall clock stepped back held a list never fetched refused for as long.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field

from ..core.keys import (
    MAX_DIRECTORY_BYTES,
    RevocationList,
    merge_revocation_lists,
    next_poll_delay,
    parse_revocation_list,
)
from ..errors import DirectoryError
from ..net.egress import MAX_URL_CHARS
from .cache import LruCache
from .directory import (
    CACHE_BYTES,
    FETCH_TIMEOUT_S,
    NEGATIVE_TTL_S,
    PARSED_COST_FACTOR,
    DirectoryResolver,
    Fetcher,
    duration_clock,
    fetch_parsed,
    settle,
)

__all__ = ["MAX_REVOCATION_LIST_BYTES", "MAX_REVOKED_PER_DIRECTORY", "RevocationPoller"]

log = logging.getLogger("signing_proxy.directory")

MAX_REVOCATION_LIST_BYTES = 4 * 1024 * 1024  # issue 15: "revocation lists up to 4 MiB"
REVOKED_ENTRY_COST = 160  # measured: what one revoked thumbprint costs in memory (str + set slot), charged
# A directory leaving the cache keeps what its lists revoked, here, for when it comes back (spec: "a
# revoked thumbprint stays revoked"); bounded like every store a stranger can fill, oldest dropped
RETIRED_DIRECTORIES = 4096
RETIRED_BYTES = 8 * 1024 * 1024  # as charged: REVOKED_ENTRY_COST per thumbprint, and per set its URL
RETIRED_SET_COST = 512  # measured: a kept set's objects beside its thumbprints and its URL (~400 bytes)
# What one directory's lists may make us hold: its set is charged to its directory's cache entry
# (CACHE_BYTES, shared by all directories, beside its parsed document), then kept aside (RETIRED_BYTES,
# shared too). When one list could fill either (91,180 thumbprints, what 4 MiB holds, charged 14.6 MB),
# one stranger's list emptied both, and with them every other directory's "stays revoked". At a
# quarter of the smaller store, the largest document or a kept set's objects counted in: 11,468
# thumbprints, more than our own key store ever lists (core.keys.MAX_REVOKED_THUMBPRINTS); a longer
# list is refused.
DIRECTORY_SHARE = 4
MAX_REVOKED_PER_DIRECTORY = (
    min(CACHE_BYTES, RETIRED_BYTES) // DIRECTORY_SHARE
    - max(MAX_DIRECTORY_BYTES * PARSED_COST_FACTOR, RETIRED_SET_COST + MAX_URL_CHARS)
) // REVOKED_ENTRY_COST


def parse_bounded_list(body: bytes) -> RevocationList:
    """A revocation list of up to 4 MiB and ``MAX_REVOKED_PER_DIRECTORY`` thumbprints (KeyFormatError
    ``revocation-list-too-large`` beyond either)."""
    return parse_revocation_list(
        body, max_entries=MAX_REVOKED_PER_DIRECTORY, max_bytes=MAX_REVOCATION_LIST_BYTES
    )


@dataclass(slots=True)
class _State:
    url: str  # the revocation_url the directory names
    current: RevocationList | None = None  # the latest list, plus what earlier lists of it named
    last_success: float | None = None  # on the poller's monotonic clock, as last_attempt
    last_attempt: float | None = None
    failures: int = 0
    loop: asyncio.Task[None] | None = None  # the periodic poller
    inflight: asyncio.Task[bool] | None = None  # the poll in progress, shared by its waiters
    inflight_url: str | None = None  # the list ``inflight`` fetches: a moved list's is not this one's

    @property
    def revoked(self) -> frozenset[str]:
        return self.current.revoked if self.current is not None else frozenset()


@dataclass
class RevocationPoller:
    """Per-directory revoked sets and their pollers; ``attach`` binds it to a resolver's cache."""

    fetch: Fetcher
    clock: Callable[[], float] = time.time  # reads no date: a test's fake one alone drives ``monotonic``
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    rand: Callable[[], float] = random.random
    retry_s: float = NEGATIVE_TTL_S  # a list never fetched is tried again on demand after this long
    fetch_timeout_s: float = FETCH_TIMEOUT_S
    holds: Callable[[str], bool] = lambda _url: True  # is this directory still cached?
    charge: Callable[[str, int], None] = lambda _url, _bytes: None  # count a set's bytes against it
    polls: int = 0
    _states: dict[str, _State] = field(default_factory=dict)
    # revoked sets of directories that left the cache (non-empty ones only)
    _retired: LruCache[str, RevocationList] = field(
        default_factory=lambda: LruCache(RETIRED_DIRECTORIES, RETIRED_BYTES, key_size=len)
    )
    configured: set[str] = field(default_factory=set)  # directory URLs the operator named
    _kept: dict[str, RevocationList] = field(default_factory=dict)  # theirs, never dropped
    _closed: bool = False  # by ``close``: no poller starts any more
    # every poll in flight, also one of a list its directory no longer names (``close`` stops them)
    _polling: set[asyncio.Task[bool]] = field(default_factory=set, init=False, repr=False)
    monotonic: Callable[[], float] | None = None  # None: ``duration_clock(clock, None)``
    _elapsed: Callable[[], float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._elapsed = duration_clock(self.clock, self.monotonic)

    def configure(self, directory_urls: Iterable[str]) -> None:
        """Directories the operator named (brokers, issuers, exchanges): what their lists revoked is
        kept when they leave the cache, outside the store strangers' sets share, so no stranger's
        list can push it out (DESIGN section 7: one party's input never changes what is believed
        about another). Bounded by the configuration, each by ``MAX_REVOKED_PER_DIRECTORY``."""
        self.configured.update(directory_urls)

    def attach(self, resolver: DirectoryResolver) -> None:
        """Track only directories ``resolver`` holds, charge their sets to it, forget what it drops."""
        self.holds = resolver.holds
        self.charge = resolver.charge
        resolver.listeners.append(self.forget)

    def __len__(self) -> int:
        """Directories tracked (each with at most one poller)."""
        return len(self._states)

    def pollers(self) -> int:
        """Periodic pollers still running."""
        return sum(1 for s in self._states.values() if s.loop is not None and not s.loop.done())

    def revoked(self, directory_url: str) -> frozenset[str]:
        """What the lists of the directory at ``directory_url`` revoked, held or kept aside (empty
        when none): it stays revoked when the directory stops naming a list."""
        state = self._states.get(directory_url)
        if state is not None:
            return state.revoked
        kept = self._kept_aside(directory_url)
        return kept.revoked if kept is not None else frozenset()

    def _kept_aside(self, directory_url: str) -> RevocationList | None:
        return self._kept.get(directory_url) or self._retired.peek(directory_url)

    async def revoked_by(self, directory_url: str, revocation_url: str | None) -> frozenset[str]:
        """Every thumbprint the directory at ``directory_url`` has revoked: what its lists revoked
        before (it stays revoked once the directory names no list: spec "A revoked thumbprint stays
        revoked") and, while it names the list at ``revocation_url``, that list's set (``ensure``:
        DirectoryError ``revocation-unavailable`` while the list was never fetched). Every verifier
        asks this: one that asked only ``ensure`` forgot revocations when the list left the
        directory."""
        before = self.revoked(directory_url)
        if revocation_url is None:
            return before
        listed = await self.ensure(directory_url, revocation_url)
        return listed if before is listed or not before else before | listed

    def age_s(self, directory_url: str) -> float | None:
        """Seconds since the directory's list was last fetched successfully (None: never)."""
        state = self._states.get(directory_url)
        if state is None or state.last_success is None:
            return None
        return self._elapsed() - state.last_success

    def ages(self) -> Iterator[float | None]:
        """The age of every tracked list (None: never fetched); bounded by the directory cache."""
        return (self.age_s(url) for url in list(self._states))

    async def ensure(self, directory_url: str, revocation_url: str) -> frozenset[str]:
        """The revoked set of the directory at ``directory_url``, whose list is at ``revocation_url``.

        A directory seen for the first time is polled now and then periodically while cached; a
        list never fetched successfully raises DirectoryError ``revocation-unavailable``.
        """
        state = self._state_for(directory_url, revocation_url)
        if state.last_success is None:
            now = self._elapsed()
            if state.last_attempt is None or now - state.last_attempt >= self.retry_s or state.inflight:
                await self._poll_shared(directory_url, state)
        if self._states.get(directory_url) is state and state.loop is None and not self._closed:
            state.loop = asyncio.get_running_loop().create_task(self._run(directory_url, state))
        if state.last_success is None:
            raise DirectoryError("revocation-unavailable", f"{revocation_url} was never fetched successfully")
        return state.revoked

    async def poll_once(self, directory_url: str, revocation_url: str) -> bool:
        """Poll the list of the directory at ``directory_url`` now; True on success."""
        return await self._poll_shared(directory_url, self._state_for(directory_url, revocation_url))

    def _state_for(self, directory_url: str, revocation_url: str) -> _State:
        state = self._states.get(directory_url)
        if state is None:
            # what its lists revoked before it left the cache stays revoked (the list is still
            # fetched before its keys are trusted)
            state = _State(revocation_url, current=self._kept_aside(directory_url))
            if self.holds(directory_url) and not self._closed:  # else: the request in hand's alone
                self._states[directory_url] = state
                self._retired.pop(directory_url)
                self._kept.pop(directory_url, None)
        elif state.url != revocation_url:
            # the directory moved its list: earlier entries stay refused, the new list must arrive
            state.url, state.last_success, state.last_attempt = revocation_url, None, None
        return state

    def forget(self, directory_url: str) -> None:
        """The directory left the cache: stop its poller; keep its revoked set aside (bounded)."""
        state = self._states.pop(directory_url, None)
        if state is not None and state.current is not None and state.current.revoked:
            revoked = state.current
            if directory_url in self.configured:
                self._kept[directory_url] = revoked
            else:
                cost = len(revoked.revoked) * REVOKED_ENTRY_COST + RETIRED_SET_COST  # and its URL
                self._retired.put(directory_url, revoked, cost)
        loop = state.loop if state is not None else None
        if state is not None and loop is not None:
            # dropped, not only cancelled: a task cancelled before it ran holds its frame, which holds
            # the state, which would hold the task (a cycle until a full collection; see ``_run``)
            state.loop = None
            loop.cancel()

    async def close(self) -> None:
        """Stop every poller and every poll in flight; none starts afterwards (a verification whose
        directory arrives meanwhile would have started one, polling through a closed client)."""
        self._closed = True
        loops = [s.loop for s in self._states.values() if s.loop is not None]
        tasks = [*loops, *self._polling]
        self._states.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _run(self, directory_url: str, state: _State) -> None:
        try:
            while self._states.get(directory_url) is state:
                await self.sleep(next_poll_delay(self.rand()))
                if self._states.get(directory_url) is not state:
                    return
                await self._poll_shared(directory_url, state)
        except asyncio.CancelledError:
            # The error keeps this frame (its traceback), and the sleep's cancelled future keeps the
            # error: a cycle only a full collection frees. Without the state in the frame, the set
            # of a forgotten directory goes at once.
            del state
            raise

    async def _poll_shared(self, directory_url: str, state: _State) -> bool:
        """Join the poll in flight of the list the directory names now, or start one. A poll of the
        list it named before is not joined: the directory moved its list (its old host died, likely),
        and waiting for the old one's fetch refused every request until it timed out, the new list
        untried; it runs on, bounded by ``fetch_timeout_s``, its answer not applied (``_poll``)."""
        task = state.inflight
        if task is None or state.inflight_url != state.url:
            task = asyncio.get_running_loop().create_task(self._poll(directory_url, state, state.url))
            state.inflight, state.inflight_url = task, state.url
            self._polling.add(task)
            task.add_done_callback(lambda done: self._polled(state, done))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and (current is None or current.cancelling() == 0):
                return False  # the poller is closing: the waiter gets a refusal, not a hang
            raise

    def _polled(self, state: _State, task: asyncio.Task[bool]) -> None:
        self._polling.discard(task)
        if state.inflight is task:  # not the poll of the list named now, started after this one
            state.inflight = state.inflight_url = None

    async def _poll(self, directory_url: str, state: _State, url: str) -> bool:
        self.polls += 1
        state.last_attempt = self._elapsed()
        try:
            fresh, _result = await settle(
                fetch_parsed(self.fetch, url, parse_bounded_list, "revocation"),
                self.fetch_timeout_s,
                "revocation",
                url,
            )
        except DirectoryError as exc:
            if state.url == url:  # a moved list's failure is no failure of the list named now
                state.failures += 1
            log.warning(
                "revocation poll of %s failed (%s: %s); keeping the last set", url, exc.reason, exc.detail
            )
            return False
        if state.url != url:
            return False  # the directory named another list meanwhile: this one is not its word
        state.current = _sticky(state.current, fresh)
        state.last_success = self._elapsed()
        state.failures = 0
        if self._states.get(directory_url) is state:
            self.charge(directory_url, len(state.current.revoked) * REVOKED_ENTRY_COST)
        return True


def _sticky(current: RevocationList | None, fresh: RevocationList) -> RevocationList:
    """``fresh`` replaces ``current``, but what ``current`` named stays (bounded: ``fresh`` first)."""
    merged = merge_revocation_lists(current, fresh)
    if len(merged.revoked) <= MAX_REVOKED_PER_DIRECTORY:
        return merged
    room = MAX_REVOKED_PER_DIRECTORY - len(fresh.revoked)
    kept = sorted(merged.revoked - fresh.revoked)[: max(room, 0)]
    return RevocationList(merged.as_of, fresh.revoked | frozenset(kept))
