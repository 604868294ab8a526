"""Key directories of other participants: fetched, cached, bounded; and their revocation lists.

A verifier finds a signer's key at ``{Signature-Agent}/.well-known/http-message-signatures-directory``
(spec "Key lookup"). ``DirectoryResolver`` fetches it once per URL at a time (concurrent callers
share the fetch), caches it for the response's ``Cache-Control`` max-age clamped between a floor
and a ceiling, refuses oversized or slow answers, remembers failures briefly (negative cache), and
keeps serving the last good copy when a refresh fails — a failed fetch is no evidence that a key
was withdrawn. ``RevocationPoller`` polls every directory's ``revocation_url`` every 300 s +/-10 %
(spec "Key publication, rotation and revocation" 3) with an injected clock, sleep and random source.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import aiohttp

from ..core.errors import KeyFormatError
from ..core.keys import (
    DIRECTORY_PATH,
    MAX_DIRECTORY_BYTES,
    Directory,
    RevocationList,
    merge_revocation_lists,
    next_poll_delay,
    parse_directory,
    parse_revocation_list,
)
from ..errors import DirectoryError

__all__ = [
    "DirectoryError",
    "DirectoryResolver",
    "FetchResult",
    "Fetcher",
    "RevocationPoller",
    "aiohttp_fetcher",
    "directory_url",
]

log = logging.getLogger("signing_proxy.directory")

DEFAULT_TTL_S = 300.0  # no Cache-Control: "minutes to hours" (spec: Limits) -> five minutes
MIN_TTL_S = 60.0  # floor: never re-fetch a directory more often than once a minute
MAX_TTL_S = 6 * 3600.0  # ceiling: re-fetch at least every six hours, whatever the server says
NEGATIVE_TTL_S = 30.0  # a failed fetch is retried after this long, not on every request
FETCH_TIMEOUT_S = 5.0
_MAX_AGE = re.compile(r"(?:^|[,\s])max-age\s*=\s*\"?(\d+)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class FetchResult:
    status: int
    body: bytes
    cache_control: str | None


Fetcher = Callable[[str], Awaitable[FetchResult]]


def directory_url(base: str) -> str:
    """``{base}/.well-known/http-message-signatures-directory`` without a doubled slash."""
    return base.rstrip("/") + DIRECTORY_PATH


def ttl_from_cache_control(value: str | None, floor_s: float, ceiling_s: float) -> float:
    """Seconds to keep a response: max-age (``no-store``/``no-cache`` = 0), clamped to [floor, ceiling]."""
    if value is None:
        seconds = DEFAULT_TTL_S
    elif "no-store" in value.lower() or "no-cache" in value.lower():
        seconds = 0.0
    else:
        match = _MAX_AGE.search(value)
        seconds = float(match.group(1)) if match else DEFAULT_TTL_S
    return min(max(seconds, floor_s), ceiling_s)


def aiohttp_fetcher(
    session: aiohttp.ClientSession,
    *,
    max_bytes: int = MAX_DIRECTORY_BYTES,
    timeout_s: float = FETCH_TIMEOUT_S,
) -> Fetcher:
    """A fetcher on an aiohttp session: no redirects (drafts: MUST NOT follow), bounded size and time."""

    async def fetch(url: str) -> FetchResult:
        try:
            async with session.get(
                url, allow_redirects=False, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                body = await resp.content.read(max_bytes + 1)
                if len(body) > max_bytes:
                    raise DirectoryError("directory-too-large", f"{url} is larger than {max_bytes} bytes")
                return FetchResult(resp.status, body, resp.headers.get("Cache-Control"))
        except TimeoutError:
            raise DirectoryError(
                "directory-fetch-timeout", f"{url} did not answer in {timeout_s:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise DirectoryError("directory-fetch-failed", f"{url}: {exc}") from None

    return fetch


_T = TypeVar("_T")


async def fetch_parsed(
    fetch: Fetcher, url: str, parse: Callable[[bytes], _T], kind: str
) -> tuple[_T, FetchResult]:
    """Fetch ``url`` and parse a 200 answer; DirectoryError (``<kind>-fetch-failed``, or the parser's
    reason, prefixed with ``directory-`` for directories) otherwise."""
    result = await fetch(url)
    if result.status != 200:
        raise DirectoryError(f"{kind}-fetch-failed", f"{url} answered {result.status}")
    try:
        return parse(result.body), result
    except KeyFormatError as exc:
        reason = (
            exc.reason
            if kind != "directory" or exc.reason.startswith("directory")
            else f"directory-{exc.reason}"
        )
        raise DirectoryError(reason, f"{url}: {exc.detail}") from None


@dataclass
class _Entry:
    directory: Directory | None
    expires_at: float
    error: DirectoryError | None = None


@dataclass
class DirectoryResolver:
    """Fetch-and-cache of key directories, with pinned directories that are never fetched."""

    fetch: Fetcher
    clock: Callable[[], float] = time.time
    floor_s: float = MIN_TTL_S
    ceiling_s: float = MAX_TTL_S
    negative_ttl_s: float = NEGATIVE_TTL_S
    pinned: Mapping[str, Directory] = field(default_factory=dict)
    _cache: dict[str, _Entry] = field(default_factory=dict)
    _inflight: dict[str, asyncio.Future[Directory]] = field(default_factory=dict)
    fetches: int = 0
    hits: int = 0

    async def get(self, base: str) -> Directory:
        """The directory at ``base`` (a Signature-Agent value); raises DirectoryError."""
        pinned = self.pinned.get(base.rstrip("/"))
        if pinned is not None:
            return pinned
        url = directory_url(base)
        entry = self._cache.get(url)
        now = self.clock()
        if entry is not None and now < entry.expires_at:
            self.hits += 1
            if entry.directory is not None:
                return entry.directory
            assert entry.error is not None
            raise entry.error
        inflight = self._inflight.get(url)
        if inflight is not None:
            return await asyncio.shield(inflight)
        future: asyncio.Future[Directory] = asyncio.get_running_loop().create_future()
        self._inflight[url] = future
        try:
            directory = await self._refresh(url, entry)
            future.set_result(directory)
            return directory
        except DirectoryError as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here: concurrent waiters get it too; no "never retrieved" warning
            raise
        finally:
            del self._inflight[url]

    async def _refresh(self, url: str, stale: _Entry | None) -> Directory:
        self.fetches += 1
        try:
            directory, result = await fetch_parsed(self.fetch, url, parse_directory, "directory")
        except DirectoryError as exc:
            now = self.clock()
            if stale is not None and stale.directory is not None:
                log.warning("keeping the cached directory %s: refresh failed (%s)", url, exc.reason)
                stale.expires_at = now + self.negative_ttl_s
                return stale.directory
            self._cache[url] = _Entry(None, now + self.negative_ttl_s, exc)
            raise
        ttl = ttl_from_cache_control(result.cache_control, self.floor_s, self.ceiling_s)
        self._cache[url] = _Entry(directory, self.clock() + ttl)
        return directory

    def known_revocation_urls(self) -> set[str]:
        urls = {e.directory.revocation_url for e in self._cache.values() if e.directory is not None}
        urls.update(d.revocation_url for d in self.pinned.values())
        return {u for u in urls if u}


@dataclass
class _RevocationState:
    current: RevocationList | None = None
    last_success: float | None = None
    failures: int = 0


@dataclass
class RevocationPoller:
    """Polls revocation lists and keeps the latest revoked set per URL (a failed poll keeps the last)."""

    fetch: Fetcher
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    rand: Callable[[], float] = random.random
    _state: dict[str, _RevocationState] = field(default_factory=dict)

    def revoked(self) -> frozenset[str]:
        """Every thumbprint revoked by any list we hold."""
        out: set[str] = set()
        for state in self._state.values():
            if state.current is not None:
                out |= state.current.revoked
        return frozenset(out)

    def age_s(self, url: str) -> float | None:
        """Seconds since the last successful poll of ``url`` (None: never succeeded)."""
        state = self._state.get(url)
        if state is None or state.last_success is None:
            return None
        return self.clock() - state.last_success

    def ages(self) -> dict[str, float | None]:
        return {url: self.age_s(url) for url in self._state}

    async def poll_once(self, url: str) -> bool:
        """Fetch ``url`` once; replace the set on success, keep it on failure. True on success."""
        state = self._state.setdefault(url, _RevocationState())
        try:
            fresh, _result = await fetch_parsed(self.fetch, url, parse_revocation_list, "revocation")
        except DirectoryError as exc:
            state.failures += 1
            log.warning("revocation poll of %s failed (%s); keeping the last set", url, exc.reason)
            return False
        state.current = merge_revocation_lists(state.current, fresh)
        state.last_success = self.clock()
        state.failures = 0
        return True

    async def run(self, url: str, *, rounds: int | None = None) -> None:
        """Poll ``url`` now and then every 300 s +/-10 % (``rounds`` bounds the loop, for tests)."""
        done = 0
        while rounds is None or done < rounds:
            await self.poll_once(url)
            done += 1
            if rounds is not None and done >= rounds:
                return
            await self.sleep(next_poll_delay(self.rand()))
