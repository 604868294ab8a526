"""The counter store on Redis, for several gateway replicas behind one load balancer.

Each operation is one atomic server-side step, never a read-modify-write from here: ``take_all`` is
a Lua script (read every count, refuse at the first limit reached, else ``INCR`` each and set a
window's expiry on its first access), ``first_seen`` is ``SET key 1 NX PX ttl``. Keys carry the
prefix ``sp:gw:`` and expire with their window, so Redis holds only live state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from redis import asyncio as aioredis

from ..core.gateway_ingest import QuotaCounter
from .counters import Taken

__all__ = ["KEY_PREFIX", "RedisCounterStore"]

KEY_PREFIX = "sp:gw:"  # our namespace in a Redis database another service may share
_TAKE_ALL = """
local n = #KEYS
for i = 1, n do
  local count = tonumber(redis.call('GET', KEYS[i]) or '0')
  if count >= tonumber(ARGV[2 * i - 1]) then
    return {0, i, count, redis.call('PTTL', KEYS[i])}
  end
end
local best, left, best_count, best_ttl = 1, nil, 0, -1
for i = 1, n do
  local count = redis.call('INCR', KEYS[i])
  if count == 1 and tonumber(ARGV[2 * i]) > 0 then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
  end
  local rest = tonumber(ARGV[2 * i - 1]) - count
  if left == nil or rest < left then
    best, left, best_count, best_ttl = i, rest, count, redis.call('PTTL', KEYS[i])
  end
end
return {1, best, best_count, best_ttl}
"""


class RedisCounterStore:
    """``CounterStore`` on one Redis database (``redis://host:6379/0``, ``unix:///path?db=0``)."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self._take_all: Any = client.register_script(_TAKE_ALL)

    @classmethod
    def from_url(cls, url: str) -> RedisCounterStore:
        return cls(aioredis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5))

    async def take_all(self, counters: Sequence[QuotaCounter], now: float) -> tuple[int, Taken]:
        args: list[int] = []
        for counter in counters:
            window_s = counter.window_s
            args += [counter.limit, max(1, math.ceil(window_s * 1000)) if window_s is not None else 0]
        keys = [KEY_PREFIX + "q:" + c.key for c in counters]
        allowed, index, count, pttl = await self._take_all(keys=keys, args=args)
        reset_at = now + int(pttl) / 1000 if int(pttl) >= 0 else None  # -1: no expiry (lifetime)
        return int(index) - 1, Taken(bool(allowed), int(count), reset_at)

    async def first_seen(self, key: str, ttl_s: float, now: float) -> bool:
        ttl_ms = max(1, math.ceil(ttl_s * 1000))
        return bool(await self.client.set(KEY_PREFIX + "r:" + key, b"1", nx=True, px=ttl_ms))

    async def close(self) -> None:
        await self.client.aclose()
