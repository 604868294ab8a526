"""Revocation lists of other participants' directories, polled on a jittered schedule.

``RevocationPoller`` polls every directory's ``revocation_url`` every 300 s +/-10 % (spec "Key
publication, rotation and revocation" 3) with an injected clock, sleep and random source, through
the same ``Fetcher`` as the directories. A failed poll keeps the last set: a list that cannot be
fetched withdraws nothing it did not withdraw before.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..core.keys import RevocationList, merge_revocation_lists, next_poll_delay, parse_revocation_list
from ..errors import DirectoryError
from .directory import Fetcher, fetch_parsed

__all__ = ["RevocationPoller"]

log = logging.getLogger("signing_proxy.directory")


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
