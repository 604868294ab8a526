"""Key directories of other participants: fetched through the package's one client, cached, bounded.

A verifier finds a signer's key at ``{Signature-Agent}/.well-known/http-message-signatures-directory``
(spec "Key lookup"). ``DirectoryResolver`` fetches it once per URL at a time (concurrent callers
share the fetch), caches it for the response's ``Cache-Control`` max-age clamped between a floor
and a ceiling, refuses oversized or slow answers, remembers failures briefly (negative cache), and
keeps serving the last good copy when a refresh fails — a failed fetch is no evidence that a key
was withdrawn. Fetches go through a ``Fetcher``: ``http_fetcher`` builds one on ``net.client.HttpClient``
(no redirects, bounded size and time); tests pass a fake. Revocation lists: ``verify.revocation``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from ..core.errors import KeyFormatError
from ..core.keys import DIRECTORY_PATH, MAX_DIRECTORY_BYTES, Directory, parse_directory
from ..errors import DirectoryError, ProxyError
from ..net.client import HttpClient

__all__ = [
    "DirectoryError",
    "DirectoryResolver",
    "FetchResult",
    "Fetcher",
    "directory_url",
    "fetch_parsed",
    "http_fetcher",
    "ttl_from_cache_control",
]

log = logging.getLogger("signing_proxy.directory")

DEFAULT_TTL_S = 300.0  # no Cache-Control: "minutes to hours" (spec: Limits) -> five minutes
MIN_TTL_S = 60.0  # floor: never re-fetch a directory more often than once a minute
MAX_TTL_S = 6 * 3600.0  # ceiling: re-fetch at least every six hours, whatever the server says
NEGATIVE_TTL_S = 30.0  # a failed fetch is retried after this long, not on every request
FETCH_TIMEOUT_S = 5.0  # our choice: a whole directory or revocation-list exchange, connect included
_MAX_AGE = re.compile(r"(?:^|[,\s])max-age\s*=\s*\"?(\d+)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class FetchResult:
    """What a resolver needs of an answer: status, body, ``Cache-Control``."""

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


def http_fetcher(
    client: HttpClient, *, max_bytes: int = MAX_DIRECTORY_BYTES, timeout_s: float = FETCH_TIMEOUT_S
) -> Fetcher:
    """A fetcher on ``client``: unsigned GET, no redirects (drafts: MUST NOT follow), bounded size and time.

    Failures become DirectoryError: ``directory-too-large``, ``directory-fetch-timeout`` or
    ``directory-fetch-failed`` (the client's reason in the detail).
    """

    async def fetch(url: str) -> FetchResult:
        try:
            answer = await client.fetch("GET", url, max_bytes=max_bytes, total_s=timeout_s)
        except ProxyError as exc:
            if exc.reason == "response-too-large":
                raise DirectoryError(
                    "directory-too-large", f"{url} is larger than {max_bytes} bytes"
                ) from None
            if exc.reason in ("upstream-timeout", "upstream-connect-timeout"):
                raise DirectoryError(
                    "directory-fetch-timeout", f"{url} did not answer in {timeout_s:g} s"
                ) from None
            raise DirectoryError("directory-fetch-failed", f"{url}: {exc.reason}: {exc.detail}") from None
        return FetchResult(answer.status, answer.body, answer.header("Cache-Control"))

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
