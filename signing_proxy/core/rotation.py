"""Our own keys over time: windows, activation, the choice of the signing key and each key's state.

Spec "Key publication, rotation and revocation" 1: publish the new key beside the old (both valid),
begin signing with the new key, remove the old one after a grace period. Verifiers cache our
directory for its max-age (spec "Limits": "minutes to hours"), so a new key is published at once
(its window ``[not_before, not_after)`` opens) but signs only from its *activation*, chosen late
enough that no cached copy of the directory lacks it. A key therefore moves through::

    published -> signing -> retiring -> expired      (or revoked, at any time)

Pure functions of the records and ``now`` (unix seconds): nothing here reads a clock or a file.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "CLOCK_MARGIN_S",
    "KEY_STATES",
    "ROTATION_MARGIN_S",
    "KeyRecord",
    "KeyState",
    "activation_delay",
    "cache_wait",
    "choose_signing_key",
    "key_state",
    "next_change",
    "publishable",
]

# our choice (spec silent): on top of the directory's max-age before a new key signs; covers the
# running proxy noticing the store (1 s), a verifier's fetch in flight (5 s bound here) and slack.
ROTATION_MARGIN_S: Final = 30
# our choice (spec silent): how far behind ours a verifier's clock may be. A new key's window opens
# this long before the key is made, since a key that signs at once (the first, `keys rotate` with no
# delay) would otherwise be refused as outside its window ("Verifiers MUST reject signatures whose key
# is outside its window") by every verifier a second behind; a directory proof's created is as far back.
CLOCK_MARGIN_S: Final = 5

KeyState = Literal["published", "signing", "retiring", "expired", "revoked"]
KEY_STATES: Final[tuple[KeyState, ...]] = ("published", "signing", "retiring", "expired", "revoked")


@dataclass(frozen=True)
class KeyRecord:
    """What a key store knows about one of our keys (all times unix seconds).

    ``activates_at``: when the key may start signing (None: when its window opens); the window
    itself is what the directory publishes and what verifiers check.
    """

    thumbprint: str
    not_before: int
    not_after: int
    created_at: int
    revoked: bool = False
    activates_at: int | None = None

    @property
    def activation(self) -> int:
        """When the key may sign: ``activates_at``, never before the window opens."""
        return self.not_before if self.activates_at is None else max(self.not_before, self.activates_at)

    def valid_at(self, now: float) -> bool:
        """Half-open window: valid from ``not_before`` inclusive, not at or after ``not_after``."""
        return self.not_before <= now < self.not_after

    def usable_at(self, now: float) -> bool:
        """Valid at ``now`` and not revoked: a verifier holding a fresh directory accepts it."""
        return not self.revoked and self.valid_at(now)


def _order(record: KeyRecord) -> tuple[int, int, str]:
    return (record.activation, record.created_at, record.thumbprint)


def choose_signing_key(records: Iterable[KeyRecord], now: float) -> KeyRecord | None:
    """The key that signs at ``now``: the newest (by activation, then creation) usable key whose
    activation has come. When no such key exists, the usable key due to activate first signs early
    rather than no key at all (it is published and valid; only stale caches lack it)."""
    usable = [r for r in records if r.usable_at(now)]
    active = [r for r in usable if r.activation <= now]
    if active:
        return max(active, key=_order)
    return min(usable, key=_order, default=None)


def key_state(record: KeyRecord, records: Iterable[KeyRecord], now: float) -> KeyState:
    """``revoked``, ``expired``, ``signing`` (the chosen key), ``published`` (not yet activated, or
    its window not yet open) or ``retiring`` (activated, still published, superseded)."""
    if record.revoked:
        return "revoked"
    if now >= record.not_after:
        return "expired"
    chosen = choose_signing_key(records, now)
    if chosen is not None and chosen.thumbprint == record.thumbprint:
        return "signing"
    if now < record.activation:
        return "published"
    return "retiring"


def next_change(record: KeyRecord, records: Collection[KeyRecord], now: float) -> tuple[int, KeyState] | None:
    """When ``record``'s state next changes if the store is left alone, and to what; None if never.

    States only change at a key's ``not_before``, activation or ``not_after``, so those instants
    (of every key: one key's activation retires another) are the only candidates.
    """
    current = key_state(record, records, now)
    if current in ("revoked", "expired"):
        return None
    instants = sorted(
        {t for r in records if not r.revoked for t in (r.not_before, r.activation, r.not_after) if t > now}
    )
    for instant in instants:
        state = key_state(record, records, instant)
        if state != current:
            return instant, state
    return None  # pragma: no cover - a key expires at its not_after at the latest


def publishable(records: Iterable[KeyRecord], now: float) -> tuple[KeyRecord, ...]:
    """Keys to serve in our directory: not revoked and not expired (signing, retiring and published
    ones), ordered by ``not_before``, ``created_at``, thumbprint so the served bytes are stable."""
    keep = [r for r in records if not r.revoked and now < r.not_after]
    return tuple(sorted(keep, key=lambda r: (r.not_before, r.created_at, r.thumbprint)))


def cache_wait(max_age_s: int, now: float, cached_until: int | None = None) -> int:
    """Seconds from ``now`` until no cached copy of the directory lacks a key published now: a copy
    fetched now is held ``max_age_s``; one served earlier, perhaps with a higher max-age (the
    listener's, not the configuration's), until ``cached_until`` (None: no such record)."""
    if isinstance(max_age_s, bool) or not isinstance(max_age_s, int) or max_age_s < 0:
        raise ValueError("max-age must be zero or a positive number of seconds")
    if cached_until is None:
        return max_age_s
    return max(max_age_s, cached_until - math.ceil(now))


def activation_delay(
    records: Iterable[KeyRecord], now: float, max_age_s: int, *, cached_until: int | None = None
) -> int:
    """Seconds from ``now`` until a key added now should sign (the default of ``keys rotate``).

    ``cache_wait`` (the directory's max-age, or longer while a copy served earlier may be cached until
    ``cached_until``) + ``ROTATION_MARGIN_S``, so every cached copy of the directory holds the new key
    before it signs; 0 when no key signs now (nothing to wait for); never later than the end of the
    window of the key signing now (no early switch).
    """
    wait = cache_wait(max_age_s, now, cached_until)
    chosen = choose_signing_key(records, now)
    if chosen is None or chosen.activation > now:
        return 0
    return max(0, min(wait + ROTATION_MARGIN_S, chosen.not_after - math.ceil(now)))
