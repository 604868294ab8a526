"""Is this exchange still authorized by its providers? (spec "What the service does" rule 7)

An exchange re-fetches each provider's manifest (``{domain}/.well-known/svc.json``) periodically;
when its domain leaves a provider's ``exchanges``, the tenant is revoked. ``ManifestWatcher``
re-fetches each manifest on its cache lifetime (``Cache-Control`` max-age clamped to
``[min_refresh_s, max_refresh_s]``; a failure retries after ``min_refresh_s``), through the fetcher
it is given (``http_fetcher`` under an ``EgressPolicy``), and reports: a state per provider
(``pending``, ``authorized``, ``removed``, ``unavailable``) for an admin endpoint, counts for a
metric, a log line on every change and ``on_change(old, new)`` for embedders. A manifest that
cannot be fetched leaves the last verdict standing (``authorized`` stays known as such in
``last_authorized``): one failed fetch does not revoke a tenant.

A provider given as a bare domain is fetched over https and its manifest's ``domain`` must be that
domain; one given as a URL (``http://127.0.0.1:8443``) is fetched there, the operator having
pinned the address.

The schedule runs on ``monotonic`` (``duration_clock``): on the wall clock, one stepped back by NTP
put every re-check off by the step, and a removal went unnoticed meanwhile. ``checked_at`` and
``next_check_at`` stay wall-clock times, for the admin endpoint to show.

One provider never stops the others: a check that fails in any way (a provider entry the manifest
code cannot use as a host, an unexpected error) marks that provider ``unavailable`` and schedules
its next check like a failed fetch, and the providers after it are checked as usual.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

from ..core.errors import ManifestError
from ..core.manifest import MANIFEST_PATH, parse_manifest
from ..errors import DirectoryError
from .directory import Fetcher, duration_clock, ttl_from_cache_control

__all__ = ["MAX_REFRESH_S", "MIN_REFRESH_S", "ManifestWatcher", "ProviderState"]

log = logging.getLogger("signing_proxy.manifests")

MIN_REFRESH_S = 60  # our choice: never more often than once a minute per provider
MAX_REFRESH_S = 86_400  # our choice: at least daily (spec: "may be cached for minutes to hours")


@dataclass(frozen=True)
class ProviderState:
    """What the last fetch of one provider's manifest said about this exchange."""

    provider: str
    url: str
    state: str = "pending"  # pending, authorized, removed, unavailable
    last_authorized: bool | None = None  # the last verdict of a manifest that was read
    relationship: str | None = None
    reason: str | None = None  # why the last fetch failed
    checked_at: float | None = None  # wall clock, as next_check_at: shown, never compared
    next_check_at: float = 0.0

    def as_json(self) -> dict[str, object]:
        return {
            "provider": self.provider,
            "url": self.url,
            "state": self.state,
            "last_authorized": self.last_authorized,
            "relationship": self.relationship,
            "reason": self.reason,
            "checked_at": self.checked_at,
            "next_check_at": self.next_check_at,
        }


def _manifest_url(provider: str) -> tuple[str, str | None]:
    if "://" in provider:
        return provider.rstrip("/") + MANIFEST_PATH, None
    return f"https://{provider}{MANIFEST_PATH}", provider


@dataclass
class ManifestWatcher:
    """Re-fetches each provider's manifest on its cache lifetime and reports this exchange's standing."""

    providers: Sequence[str]
    exchange_domain: str
    fetch: Fetcher
    on_change: Callable[[ProviderState, ProviderState], None] | None = None
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    min_refresh_s: float = MIN_REFRESH_S
    max_refresh_s: float = MAX_REFRESH_S
    monotonic: Callable[[], float] | None = None  # None: ``duration_clock(clock, None)``
    _states: dict[str, ProviderState] = field(init=False, default_factory=dict)
    _due: dict[str, float] = field(init=False, default_factory=dict)  # provider -> when, on monotonic
    _elapsed: Callable[[], float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._elapsed = duration_clock(self.clock, self.monotonic)
        for provider in self.providers:
            url, _host = _manifest_url(provider)
            self._states[provider] = ProviderState(provider, url)
            self._due[provider] = float("-inf")  # at the first check_due

    def states(self) -> list[ProviderState]:
        return list(self._states.values())

    def counts(self) -> dict[str, int]:
        """Providers per state (for a metric: no provider name becomes a label)."""
        out = dict.fromkeys(("pending", "authorized", "removed", "unavailable"), 0)
        for state in self._states.values():
            out[state.state] += 1
        return out

    async def check(self, provider: str) -> ProviderState:
        """Fetch one provider's manifest now and record the verdict."""
        old = self._states[provider]
        url, served_host = _manifest_url(provider)
        now, started = self.clock(), self._elapsed()
        ttl = self.min_refresh_s  # a failure's
        try:
            answer = await self.fetch(url)
            if answer.status != 200:
                raise DirectoryError("manifest-unavailable", f"{url} answered {answer.status}")
            manifest = parse_manifest(answer.body, served_host=served_host)
        except (DirectoryError, ManifestError) as exc:
            new = self._failed(old, exc.reason, now)
        except ValueError:  # an entry parse_manifest cannot take as a host (GatewayConfig refuses it)
            new = self._failed(old, "provider-malformed", now)
        else:
            entry = manifest.authorizes(self.exchange_domain)
            ttl = ttl_from_cache_control(answer.cache_control, self.min_refresh_s, self.max_refresh_s)
            new = replace(
                old,
                state="authorized" if entry is not None else "removed",
                last_authorized=entry is not None,
                relationship=entry.relationship.json_value if entry is not None else None,
                reason=None,
                checked_at=now,
                next_check_at=now + ttl,
            )
        self._due[provider] = started + ttl
        self._states[provider] = new
        self._report(old, new)
        return new

    def _failed(self, old: ProviderState, reason: str, now: float) -> ProviderState:
        """No verdict this time: the last one stands (``removed`` stays so), retried after the minimum."""
        return replace(
            old,
            state="removed" if old.last_authorized is False else "unavailable",
            reason=reason,
            checked_at=now,
            next_check_at=now + self.min_refresh_s,
        )

    def _report(self, old: ProviderState, new: ProviderState) -> None:
        if old.state == new.state:
            return
        if new.state == "removed":
            log.warning(
                "provider %s no longer lists exchange %s in its manifest: stop serving its offers",
                new.provider,
                self.exchange_domain,
            )
        elif new.state == "unavailable":
            log.warning("provider %s: manifest unavailable (%s)", new.provider, new.reason)
        else:
            log.info("provider %s: %s", new.provider, new.state)
        if self.on_change is not None:
            try:
                self.on_change(old, new)
            except Exception:  # an embedder's callback must not stop the watcher
                log.exception("manifest watcher callback failed")

    async def check_due(self) -> float:
        """Check every provider whose time has come; the seconds until the next one is due."""
        for state in list(self._states.values()):
            if self._due[state.provider] <= self._elapsed():
                try:
                    await self.check(state.provider)
                except Exception:  # a bug: this provider later, the next ones now
                    log.exception("manifest check of provider %s failed", state.provider)
                    old = self._states[state.provider]
                    new = self._failed(old, "manifest-check-failed", self.clock())
                    self._due[state.provider] = self._elapsed() + self.min_refresh_s
                    self._states[state.provider] = new
                    self._report(old, new)
        if not self._due:
            return self.max_refresh_s
        return max(0.0, min(self._due.values()) - self._elapsed())

    async def run(self) -> None:
        """Check forever (cancel to stop)."""
        while True:
            try:
                wait = await self.check_due()
            except Exception:  # a bug: keep watching, later
                log.exception("manifest watcher failed")
                wait = self.min_refresh_s
            await self.sleep(wait)
