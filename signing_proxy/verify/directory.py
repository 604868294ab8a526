"""Key directories of other participants: fetched through the package's one client, cached, bounded.

A verifier finds a signer's key at ``{Signature-Agent}/.well-known/http-message-signatures-directory``
(spec "Key lookup"). ``DirectoryResolver`` fetches it once per URL at a time (concurrent callers
share one fetch task, which settles whatever happens, within ``fetch_timeout_s``), caches it for the
response's ``Cache-Control`` max-age clamped between a floor and a ceiling in an LRU bounded by
entries and bytes, remembers failures briefly by their reason only (a bounded negative cache), keeps
serving the last good copy when a refresh fails — a failed fetch is no evidence that a key was
withdrawn — and re-fetches a cached directory for an unknown ``keyid`` at most once per
``keyid_refetch_s`` (rotation). The fetches a request can cause (a directory not cached, a
re-fetch for an unknown ``keyid``) spend a token of ``fetch_budget`` (``verify.fetches_per_s``);
without one the request is refused ``verifier-busy``, so strangers cannot make the verifier fetch
from hosts they name at the rate they send (a new directory's revocation list, fetched once with
it, rides on its token). Refreshes of cached directories, directories the configuration names and
directories that verified a signature lately (``vouch``) spend none. Fetches go through a
``Fetcher``: ``http_fetcher`` builds one on ``net.client.HttpClient`` under an ``EgressPolicy`` (no
redirects, bounded size and time); tests pass a fake. Revocation lists: ``verify.revocation``.

Two clocks: every lifetime, spacing and failure memory runs on ``monotonic`` (a wall clock stepped
back by NTP would hold a failure, or put off a re-fetch, for as long as the step); the wall ``clock``
only judges what carries dates of its own (a directory proof's ``created``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from ..core.directory_proof import proven_keys
from ..core.errors import FieldError, KeyFormatError
from ..core.fields import Fields
from ..core.keys import DIRECTORY_PATH, MAX_DIRECTORY_BYTES, Directory, parse_directory
from ..core.signature_verify import DEFAULT_SKEW_S
from ..core.uri import directory_base, parse_absolute_uri
from ..errors import VERIFIER_BUSY, DirectoryError, EgressError, Error, ProxyError
from ..logline import exception_kind
from ..net.client import HttpClient
from ..net.egress import EgressPolicy
from .cache import LruCache, TokenBucket

__all__ = [
    "VERIFIER_BUSY",
    "DirectoryError",
    "DirectoryResolver",
    "FetchResult",
    "Fetcher",
    "directory_url",
    "duration_clock",
    "fetch_parsed",
    "http_fetcher",
    "only_proven",
    "settle",
    "ttl_from_cache_control",
]

PARSED_COST_FACTOR = 4  # measured: a parsed directory (keys, windows) costs 2.7-4.3x its document's bytes

log = logging.getLogger("signing_proxy.directory")

DEFAULT_TTL_S = 300.0  # no Cache-Control: "minutes to hours" (spec: Limits) -> five minutes
MIN_TTL_S = 60.0  # floor: never re-fetch a directory more often than once a minute
MAX_TTL_S = 6 * 3600.0  # ceiling: re-fetch at least every six hours, whatever the server says
NEGATIVE_TTL_S = 30.0  # a failed fetch is retried after this long, not on every request
FETCH_TIMEOUT_S = 5.0  # our choice (config egress.fetch_timeout_s): one document, connect included
CACHE_ENTRIES = 1024  # config verify.directory_cache_entries
CACHE_BYTES = 8 * 1024 * 1024  # config verify.directory_cache_bytes (a 2-key directory: ~4 KiB charged)
NEGATIVE_ENTRIES = 4096  # config verify.negative_cache_entries
VOUCHED_ENTRIES = 4096  # directories that verified a signature lately: re-fetched without budget
# our choice: how often each may come back so: a stranger's few dozen vouched directories, padded to
# push one another out of the cache, came back free on every request (and so did the revocation
# lists they name, anyone's URL): past that, a return spends a token like any fetch
VOUCHED_RETURN_S = 60.0
# Both stores above are keyed by URLs strangers name (up to 2,048 characters): each is also bounded
# by this, charged per entry its URL and URL_ENTRY_COST (measured: ~300 bytes beside the URL).
URL_STORE_BYTES = 2 * 1024 * 1024
URL_ENTRY_COST = 320
KEYID_REFETCH_S = 30.0  # config verify.keyid_refetch_s (issue 15: "at most once per 30 s")
_MAX_AGE = re.compile(r"(?:^|[,\s])max-age\s*=\s*\"?(\d+)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class FetchResult:
    """What a resolver needs of an answer: status, body, ``Cache-Control``."""

    status: int
    body: bytes
    cache_control: str | None
    proof_fields: tuple[tuple[str, str], ...] = ()  # Content-Digest, Signature-Input, Signature (drafts)


Fetcher = Callable[[str], Awaitable[FetchResult]]


def directory_url(base: str) -> str:
    """``{base}/.well-known/http-message-signatures-directory`` for ``base`` in its one spelling
    (``directory_base``), which keys the directory's cache entry and its revocation state."""
    return base_key(base) + DIRECTORY_PATH


@functools.lru_cache(maxsize=64)
def each_directory_once(bases: tuple[str, ...]) -> tuple[str, ...]:
    """``bases`` (a configuration's) with each directory once, in its first spelling:
    ``https://b.example`` and ``https://b.example/`` are one directory (read twice, the broker's own
    key was listed twice: ``ambiguous-key``). Cached: a policy's bases are asked for per request."""
    first: dict[str, str] = {}
    for base in bases:
        first.setdefault(directory_url(base), base)
    return tuple(first.values())


def base_key(base: str) -> str:
    """``base`` in its one spelling; one that names no directory base (the configuration's, whose
    fetch will fail) only without a trailing ``/``."""
    try:
        return directory_base(base)
    except FieldError:
        return base.rstrip("/")


def only_proven(directory: Directory, result: FetchResult, url: str, now: float, skew_s: int) -> Directory:
    """The directory without the keys whose possession proof fails, when the response carries
    directory proofs (web-bot-auth drafts: "ignore keys without a valid signature"); else as is.
    ``skew_s``: how far ahead of ``now`` a proof's ``created`` may be (the verifier's own skew)."""
    if not result.proof_fields:
        return directory
    authority = parse_absolute_uri(url).authority  # the authority we asked: what a proof must bind
    listed = (*directory.keys, *directory.web_keys)
    publics = (key.public for key in listed)
    proven = proven_keys(result.body, authority, Fields(result.proof_fields), publics, now=now, skew_s=skew_s)
    if proven is None:
        return directory
    kept = [key for key in listed if key.thumbprint in proven]
    if len(kept) != len(listed):
        log.warning(
            "directory %s: %d key(s) without a valid possession proof ignored", url, len(listed) - len(kept)
        )
    return Directory.of(kept, directory.revocation_url)


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
    client: HttpClient,
    *,
    egress: EgressPolicy | None = None,
    max_bytes: int = MAX_DIRECTORY_BYTES,
    timeout_s: float = FETCH_TIMEOUT_S,
) -> Fetcher:
    """A fetcher on ``client``: unsigned GET under ``egress`` (default: public https only), connected
    to the vetted address, no redirects (drafts: MUST NOT follow), bounded size and time.

    Failures become DirectoryError: ``directory-too-large``, ``directory-fetch-timeout``,
    ``directory-egress-refused`` or ``directory-fetch-failed`` (the cause in the detail, for the log).
    """
    policy = egress if egress is not None else EgressPolicy()

    async def fetch(url: str) -> FetchResult:
        try:
            answer = await client.fetch("GET", url, max_bytes=max_bytes, total_s=timeout_s, egress=policy)
        except EgressError as exc:
            raise DirectoryError("directory-egress-refused", f"{url}: {exc.reason}: {exc.detail}") from None
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
        except Error as exc:
            raise DirectoryError("directory-fetch-failed", f"{url}: {exc.reason}: {exc.detail}") from None
        proofs = tuple(
            (name, value)
            for name in ("Content-Digest", "Signature-Input", "Signature")
            if (value := answer.header(name)) is not None
        )
        return FetchResult(answer.status, answer.body, answer.header("Cache-Control"), proofs)

    return fetch


_T = TypeVar("_T")


def duration_clock(clock: Callable[[], float], monotonic: Callable[[], float] | None) -> Callable[[], float]:
    """The clock that times lifetimes and schedules: ``monotonic`` when given; else ``time.monotonic``
    beside the real wall clock, and a test's fake ``clock`` given alone (it drives both, as before)."""
    if monotonic is not None:
        return monotonic
    return time.monotonic if clock is time.time else clock


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


async def settle(work: Awaitable[_T], timeout_s: float, kind: str, url: str) -> _T:
    """Await ``work`` and turn every failure into DirectoryError: a stranger's document never hangs
    nor crashes a verifier. The cause of an unexpected failure goes to the log, not to the caller."""
    try:
        async with asyncio.timeout(timeout_s):
            return await work
    except DirectoryError:
        raise
    except TimeoutError:
        raise DirectoryError(f"{kind}-fetch-timeout", f"{url} did not answer in {timeout_s:g} s") from None
    except Exception as exc:  # a parser or fetcher bug on hostile input must still settle the fetch
        log.warning("%s %s unusable: %s", kind, url, exception_kind(exc), exc_info=True)
        raise DirectoryError(f"{kind}-unusable", f"{url}: {exception_kind(exc)}") from None


@dataclass(slots=True)
class _Entry:
    directory: Directory
    expires_at: float  # on the monotonic clock, as every time below
    fetched_at: float
    size: int  # bytes of the served document
    extra: int = 0  # bytes charged by what hangs on the directory (its revocation set)
    keyid_refetch_at: float = float("-inf")


@dataclass(frozen=True, slots=True)
class _Failure:
    reason: str  # the reason only: no exception object, no traceback (bounded, issue 15)
    expires_at: float


@dataclass
class DirectoryResolver:
    """Fetch-and-cache of key directories, with pinned directories that are never fetched.

    ``listeners`` hear the URL of every directory leaving the cache (revocation pollers stop then).
    ``clock`` (wall) judges directory proofs; ``monotonic`` (``duration_clock``) everything timed.
    """

    fetch: Fetcher
    clock: Callable[[], float] = time.time
    floor_s: float = MIN_TTL_S
    ceiling_s: float = MAX_TTL_S
    negative_ttl_s: float = NEGATIVE_TTL_S
    pinned: Mapping[str, Directory] = field(default_factory=dict)
    max_entries: int = CACHE_ENTRIES
    max_bytes: int = CACHE_BYTES
    negative_entries: int = NEGATIVE_ENTRIES
    keyid_refetch_s: float = KEYID_REFETCH_S
    fetch_timeout_s: float = FETCH_TIMEOUT_S
    listeners: list[Callable[[str], None]] = field(default_factory=list)
    fetch_budget: TokenBucket | None = None  # None: requests may cause fetches at any rate
    skew_s: int = DEFAULT_SKEW_S  # a directory proof's created may be this far ahead (verify.skew_s)
    fetches: int = 0
    hits: int = 0
    monotonic: Callable[[], float] | None = None  # None: ``duration_clock(clock, None)``; last: order kept
    _cache: LruCache[str, _Entry] = field(init=False, repr=False)
    _negative: LruCache[str, _Failure] = field(init=False, repr=False)
    _vouched: LruCache[str, float] = field(init=False, repr=False)  # url -> its last free return
    _inflight: dict[str, asyncio.Task[Directory]] = field(init=False, repr=False, default_factory=dict)
    _elapsed: Callable[[], float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._elapsed = duration_clock(self.clock, self.monotonic)
        self.pinned = {base_key(base): d for base, d in self.pinned.items()}
        self._cache = LruCache(self.max_entries, self.max_bytes, on_evict=self._evicted)
        self._negative = LruCache(self.negative_entries, URL_STORE_BYTES, key_size=len)
        self._vouched = LruCache(VOUCHED_ENTRIES, URL_STORE_BYTES, key_size=len)

    def __len__(self) -> int:
        """Directories cached (pinned ones not counted)."""
        return len(self._cache)

    @property
    def cached_bytes(self) -> int:
        return self._cache.bytes

    @property
    def failures_cached(self) -> int:
        return len(self._negative)

    def is_pinned(self, base: str) -> bool:
        return base_key(base) in self.pinned

    def holds(self, url: str) -> bool:
        """True while the directory at ``url`` is cached or pinned (its pollers may run)."""
        return url in self._cache or any(directory_url(b) == url for b in self.pinned)

    def charge(self, url: str, extra_bytes: int) -> None:
        """Count ``extra_bytes`` of dependent state against the directory at ``url`` (may evict the
        least recently used). An entry that no longer fits in the cache by itself leaves it alone:
        it never empties the cache of other directories on its way out."""
        entry = self._cache.peek(url)
        if entry is not None:
            entry.extra = extra_bytes
            if not self._dropped_if_too_large(url, entry.size + extra_bytes):
                self._cache.resize(url, entry.size + extra_bytes)

    async def get(self, base: str, *, budgeted: bool = True) -> Directory:
        """The directory at ``base`` (a Signature-Agent value); raises DirectoryError.

        ``budgeted=False`` for a directory the configuration names (a broker's): its first fetch
        spends no token of ``fetch_budget``."""
        pinned = self.pinned.get(base_key(base))
        if pinned is not None:
            return pinned
        url = directory_url(base)
        now = self._elapsed()
        entry = self._cache.get(url)
        if entry is not None and now < entry.expires_at:
            self.hits += 1
            return entry.directory
        if entry is None and url not in self._inflight:
            failure = self._negative.get(url)
            if failure is not None and now < failure.expires_at:
                self.hits += 1
                raise DirectoryError(failure.reason, f"{url} failed recently")
            if budgeted and not self._free_return(url, now):
                self._spend(url)
        return await self._shared(url)

    def _free_return(self, url: str, now: float) -> bool:
        """Whether the directory at ``url``, vouched for, comes back without budget now (at most
        once per ``VOUCHED_RETURN_S``)."""
        last = self._vouched.peek(url)
        if last is None or now - last < VOUCHED_RETURN_S:
            return False
        self._vouched.put(url, now, URL_ENTRY_COST)
        return True

    def vouch(self, url: str) -> None:
        """A signature just verified with a key of the directory at ``url``: should strangers'
        directories push it out of the (byte-bounded) cache, it comes back without budget. Strangers
        can add theirs only by verifying, one budgeted fetch each; the least recently vouched go."""
        if self._vouched.get(url) is None:  # (get: the most recently vouched again) its first
            self._vouched.put(url, -VOUCHED_RETURN_S, URL_ENTRY_COST)  # return is free at once

    async def refetch_for_keyid(self, base: str, *, budgeted: bool = True) -> Directory | None:
        """Re-fetch a cached directory that lacks a signature's ``keyid`` (a key rotated in), at most
        once per ``keyid_refetch_s``; None when not cached, pinned or refetched too recently.
        ``budgeted=False`` for a directory the configuration names."""
        if self.is_pinned(base):
            return None
        url = directory_url(base)
        entry = self._cache.peek(url)
        if entry is None:
            return None
        if url not in self._inflight:
            now = self._elapsed()
            if now - max(entry.fetched_at, entry.keyid_refetch_at) < self.keyid_refetch_s:
                return None
            if budgeted:
                self._spend(url)
            entry.keyid_refetch_at = now
        return await self._shared(url)

    def _spend(self, url: str) -> None:
        if self.fetch_budget is not None and not self.fetch_budget.take():
            raise DirectoryError(VERIFIER_BUSY, f"{url}: no fetch budget left this second")

    async def close(self) -> None:
        """Cancel fetches in flight (their waiters get a DirectoryError)."""
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _shared(self, url: str) -> Directory:
        task = self._inflight.get(url)
        if task is None:
            # a task of its own: a waiter that goes away (client disconnect) never cancels the others
            task = asyncio.get_running_loop().create_task(self._refresh(url))
            self._inflight[url] = task
            task.add_done_callback(lambda done: self._done(url, done))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled() and not _current_cancelling():
                raise DirectoryError("directory-fetch-failed", f"{url}: the verifier is closing") from None
            raise

    def _done(self, url: str, task: asyncio.Task[Directory]) -> None:
        if self._inflight.get(url) is task:
            del self._inflight[url]
        if not task.cancelled():
            task.exception()  # retrieved here: no "never retrieved" warning when every waiter left

    async def _refresh(self, url: str) -> Directory:
        self.fetches += 1
        stale = self._cache.peek(url)
        try:
            directory, result = await settle(
                fetch_parsed(self.fetch, url, parse_directory, "directory"),
                self.fetch_timeout_s,
                "directory",
                url,
            )
        except DirectoryError as exc:
            now = self._elapsed()
            if stale is not None:
                log.warning("keeping the cached directory %s: refresh failed (%s)", url, exc.reason)
                stale.expires_at = now + self.negative_ttl_s
                return stale.directory
            log.info("directory %s unavailable: %s: %s", url, exc.reason, exc.detail)
            self._negative.put(url, _Failure(exc.reason, now + self.negative_ttl_s), URL_ENTRY_COST)
            raise DirectoryError(exc.reason, f"{url} is unavailable") from None
        directory = only_proven(directory, result, url, self.clock(), self.skew_s)
        now = self._elapsed()
        ttl = ttl_from_cache_control(result.cache_control, self.floor_s, self.ceiling_s)
        current = self._cache.peek(url)  # the entry may have been evicted while we fetched
        extra = current.extra if current is not None else 0
        size = len(result.body) * PARSED_COST_FACTOR
        self._negative.pop(url)
        if self._dropped_if_too_large(url, size + extra):  # used for the request in hand only
            return directory
        self._cache.put(url, _Entry(directory, now + ttl, now, size, extra), size + extra)
        return directory

    def _dropped_if_too_large(self, url: str, size: int) -> bool:
        """Drop the entry at ``url`` when ``size`` is more than the whole cache holds: the cache's
        own eviction would first push out every other directory, then it."""
        if size <= self.max_bytes:
            return False
        self._cache.pop(url)
        return True

    def _evicted(self, url: str, _entry: _Entry) -> None:
        for listener in self.listeners:
            listener(url)


def _current_cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
