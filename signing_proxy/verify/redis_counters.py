"""The counter store on Redis, for several gateway replicas behind one load balancer.

Each operation is one atomic server-side step, never a read-modify-write from here: ``take`` is a
Lua script (read the count, refuse at the limit, else ``INCR`` and set the window's expiry on the
first access), ``first_seen`` is ``SET key 1 NX PX ttl``. Keys carry the prefix ``sp:gw:`` and
expire with their window, so Redis holds only live state.
"""

from __future__ import annotations

import math
from typing import Any

from redis import asyncio as aioredis

from .counters import Taken

__all__ = ["KEY_PREFIX", "RedisCounterStore"]

KEY_PREFIX = "sp:gw:"  # our namespace in a Redis database another service may share
_TAKE = """
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
if count >= tonumber(ARGV[1]) then
  return {0, count, redis.call('PTTL', KEYS[1])}
end
count = redis.call('INCR', KEYS[1])
if count == 1 and tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return {1, count, redis.call('PTTL', KEYS[1])}
"""


class RedisCounterStore:
    """``CounterStore`` on one Redis database (``redis://host:6379/0``, ``unix:///path?db=0``)."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self._take: Any = client.register_script(_TAKE)

    @classmethod
    def from_url(cls, url: str) -> RedisCounterStore:
        return cls(aioredis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5))

    async def take(self, key: str, limit: int, window_s: float | None, now: float) -> Taken:
        window_ms = max(1, math.ceil(window_s * 1000)) if window_s is not None else 0
        allowed, count, pttl = await self._take(keys=[KEY_PREFIX + "q:" + key], args=[limit, window_ms])
        reset_at = now + int(pttl) / 1000 if int(pttl) >= 0 else None  # -1: no expiry (lifetime)
        return Taken(bool(allowed), int(count), reset_at)

    async def first_seen(self, key: str, ttl_s: float, now: float) -> bool:
        ttl_ms = max(1, math.ceil(ttl_s * 1000))
        return bool(await self.client.set(KEY_PREFIX + "r:" + key, b"1", nx=True, px=ttl_ms))

    async def close(self) -> None:
        await self.client.aclose()
