"""Bounds on what a stranger can make a verifier keep or do.

``LruCache``: a least-recently-used map bounded by entries and by bytes. Every insertion may evict
the least recently used entries until both bounds hold again; the ``on_evict`` callback hears of
each removal (eviction or ``pop``) so that what hangs on an entry (a revocation poller) leaves with
it (DESIGN section 7: every cache has a bound). ``TokenBucket``: a rate with a burst, for the
fetches strangers' requests may cause.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["LruCache", "TokenBucket"]

K = TypeVar("K")
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """``max_entries`` entries and ``max_bytes`` bytes at most (sizes as the caller counts them).

    ``key_size``: what a key costs beside its value, added to every size given (a URL a stranger
    names, for one: its length)."""

    def __init__(
        self,
        max_entries: int,
        max_bytes: int | None = None,
        *,
        on_evict: Callable[[K, V], None] | None = None,
        key_size: Callable[[K], int] | None = None,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.on_evict = on_evict
        self.key_size = key_size
        self.bytes = 0
        self.evictions = 0
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._items))

    def get(self, key: K) -> V | None:
        """The value, now the most recently used; None when absent."""
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def peek(self, key: K) -> V | None:
        """The value without touching its recency."""
        item = self._items.get(key)
        return None if item is None else item[0]

    def values(self) -> list[V]:
        return [value for value, _size in self._items.values()]

    def put(self, key: K, value: V, size: int = 0) -> None:
        """Insert or replace (no ``on_evict`` for a replaced value), then evict down to the bounds."""
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        if self.key_size is not None:
            size += self.key_size(key)
        self._items[key] = (value, size)
        self.bytes += size
        self._shrink()

    def resize(self, key: K, size: int) -> None:
        """Change the size counted for ``key`` (absent: nothing), then evict down to the bounds."""
        item = self._items.get(key)
        if item is None:
            return
        if self.key_size is not None:
            size += self.key_size(key)
        self.bytes += size - item[1]
        self._items[key] = (item[0], size)
        self._shrink()

    def pop(self, key: K) -> V | None:
        """Remove ``key`` (``on_evict`` hears of it); its value, or None when absent."""
        item = self._items.pop(key, None)
        if item is None:
            return None
        self.bytes -= item[1]
        if self.on_evict is not None:
            self.on_evict(key, item[0])
        return item[0]

    def clear(self) -> None:
        for key in list(self._items):
            self.pop(key)

    def _shrink(self) -> None:
        while self._items and (
            len(self._items) > self.max_entries
            or (self.max_bytes is not None and self.bytes > self.max_bytes)
        ):
            key = next(iter(self._items))
            self.evictions += 1
            self.pop(key)


class TokenBucket:
    """``rate`` tokens per second, held up to ``burst``; ``take()`` spends one if there is one.

    Starts full. A clock that steps back refills nothing (and takes nothing away).
    """

    __slots__ = ("_stamp", "_tokens", "burst", "clock", "rate")

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._tokens = float(burst)
        self._stamp = clock()

    def take(self) -> bool:
        now = self.clock()
        if now > self._stamp:
            self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = max(self._stamp, now)
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True
