"""The counter store on Redis, for several gateway replicas behind one load balancer.

Each operation is one atomic server-side step, never a read-modify-write from here: ``take_all`` is
a Lua script (read every count, refuse at the first limit reached, else ``INCR`` each and set a
window's expiry on its first access), ``first_seen`` is a script around ``SET key 1 PX ttl`` (when
the key is not there).
Keys carry the prefix ``sp:gw:`` and expire with their window, so Redis holds only live state.
The counters created for untrusted issuers' chains are also members of the sorted set
``sp:gw:strangers``, scored by their expiry on the gateways' clock (``now``): the same script counts
the live members (and drops a batch of the expired) and refuses a take that would add one past
``max_stranger_rows`` (``verify.counters``). A gateway clock ahead of Redis's drops a member up to
that much early. Strangers' replay keys are likewise members of ``sp:gw:replay-strangers``, scored
by when they expire: ``first_seen``'s script counts the live ones (and drops a batch of the
expired), and refuses to set a new stranger's key while ``max_stranger_rows`` are live.

Lost state fails closed (a cap nobody counts is not a cap). A Redis that restarts without its data,
or is flushed, would otherwise start every count and the replay memory again from zero, and a
lifetime quota's window is the grant's remaining life (up to ``ENDLESS_QUOTA_WINDOW_S``), so
"at most one period" is no bound. Hence the epoch sentinel ``sp:gw:epoch`` (no expiry):

* A store's first operation adopts the epoch; on an empty Redis (a fresh deployment) it creates
  one, ``gw:<random>``, so a first start needs no manual step.
* Every operation's script first compares the epoch with the one this store adopted, atomically
  with the count or the replay check. Missing, or replaced by another replica's ``gw:`` value (a
  replica that started after the loss and created one), means the data was lost: the script writes
  the tombstone ``lost:<epoch>`` and the store raises ``CounterStateLost``, which the gateway
  answers 503 like any store error (``quota-store-unavailable``, ``replay-store-unavailable``).
  A store that has adopted no epoch yet refuses a tombstone too, so replicas started later refuse.
* No bounded wait makes the caps right again (the counts are gone), so it stays refused until an
  operator accepts the loss: ``redis-cli SET sp:gw:epoch ack-<anything>``. Any value that starts
  with neither ``gw:`` nor ``lost:`` is an operator's; every store adopts it on its next operation.

Remaining gap: a loss is seen only by a store that adopted the epoch before it. If every replica
restarts with Redis (one replica, or all on the failed node), or a replica that starts after the
loss creates an epoch and admits before any older replica's next operation or readiness probe (once
a second) writes the tombstone, those admissions start from zero. A failover to a Redis replica that
lags keeps the epoch and loses the last counts unseen. Persistence (deploy/kubernetes/gateway.yaml)
is the first defence.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from collections.abc import Sequence
from typing import Any

from redis import asyncio as aioredis
from redis.exceptions import RedisError

from ..core.errors import Error
from ..core.gateway_ingest import QuotaCounter
from .counters import ReplayRowsFull, StrangerRowsFull, Taken

__all__ = [
    "EPOCH_KEY",
    "KEY_PREFIX",
    "REDIS_MAX_CONNECTIONS",
    "REDIS_TIMEOUT_S",
    "REPLAY_STRANGERS_KEY",
    "STRANGERS_KEY",
    "CounterStateLost",
    "RedisCounterStore",
]

log = logging.getLogger("signing_proxy.counters")

KEY_PREFIX = "sp:gw:"  # our namespace in a Redis database another service may share
EPOCH_KEY = KEY_PREFIX + "epoch"
STRANGERS_KEY = KEY_PREFIX + "strangers"  # the counters of untrusted issuers' chains, by expiry (ms)
STRANGERS_PURGE_BATCH = 256  # our choice: expired members removed per script, at most
REPLAY_STRANGERS_KEY = KEY_PREFIX + "replay-strangers"  # untrusted requests' replay keys, by expiry (ms)
# our choice: connections per gateway process; more concurrent operations wait for one (below)
REDIS_MAX_CONNECTIONS = 64
REDIS_TIMEOUT_S = 5.0  # connect, each reply, and the wait for a free connection of the pool
_REPLICA, _LOST = b"gw:", b"lost:"  # an epoch a store created; the tombstone of a lost one
_ADOPT = """
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  epoch = ARGV[1]
  redis.call('SET', KEYS[1], epoch)
end
return epoch
"""
# KEYS[1] is the epoch and ARGV[1] the adopted one; a mismatch answers {-1, the epoch now}
_CHECK_EPOCH = """
local epoch = redis.call('GET', KEYS[1])
if epoch ~= ARGV[1] then
  if not epoch or string.sub(epoch, 1, 3) == 'gw:' then
    epoch = 'lost:' .. ARGV[1]
    redis.call('SET', KEYS[1], epoch)
  end
  return {-1, epoch}
end
"""
# The live members of a strangers' set (scored by expiry, ms): counted (ZCOUNT, O(log n)), and a batch
# of the expired removed. A script holds Redis for every client: removing a million expired members at
# once held it 0.6 s (10 million: past REDIS_TIMEOUT_S); in batches, each call takes some.
_LIVE = f"""
local function _live(set, now)
  local expired = redis.call('ZRANGEBYSCORE', set, '-inf', now, 'LIMIT', 0, {STRANGERS_PURGE_BATCH})
  if #expired > 0 then
    redis.call('ZREM', set, unpack(expired))
  end
  return redis.call('ZCOUNT', set, string.format('(%.0f', now), '+inf')
end
"""
# KEYS: the epoch, the strangers' set, the counters. ARGV: the epoch, max_stranger_rows (-1: the
# chain's issuer is trusted), now in ms, then each counter's limit and window in ms (0: no expiry).
# The strangers' set holds the counters created for untrusted issuers' chains, scored by when they
# expire: the expired are removed before it is counted (in this script, so that replicas racing
# cannot overshoot), and a take that would add one past the bound answers {2} and counts nothing.
_TAKE_ALL = (
    _CHECK_EPOCH
    + _LIVE
    + """
local bound, now = tonumber(ARGV[2]), tonumber(ARGV[3])
local n = #KEYS - 2
local fresh, created = {}, false
for i = 1, n do
  local count = tonumber(redis.call('GET', KEYS[i + 2]) or '0')
  if count >= tonumber(ARGV[2 * i + 2]) then
    return {0, i, count, redis.call('PTTL', KEYS[i + 2])}
  end
  fresh[i] = count == 0
  created = created or fresh[i]
end
if bound >= 0 and created then
  local live = _live(KEYS[2], now)
  local adds = 0
  for i = 1, n do
    local score = redis.call('ZSCORE', KEYS[2], KEYS[i + 2])
    if fresh[i] and not (score and tonumber(score) > now) then
      adds = adds + 1
    end
  end
  if adds > 0 and live + adds > bound then
    return {2}
  end
end
local best, left, best_count, best_ttl = 1, nil, 0, -1
for i = 1, n do
  local count = redis.call('INCR', KEYS[i + 2])
  local window = tonumber(ARGV[2 * i + 3])
  if count == 1 then
    if window > 0 then
      redis.call('PEXPIRE', KEYS[i + 2], window)
    end
    if bound >= 0 then
      redis.call('ZADD', KEYS[2], window > 0 and string.format('%.0f', now + window) or '+inf', KEYS[i + 2])
    else
      redis.call('ZREM', KEYS[2], KEYS[i + 2])
    end
  end
  local rest = tonumber(ARGV[2 * i + 2]) - count
  if left == nil or rest < left then
    best, left, best_count, best_ttl = i, rest, count, redis.call('PTTL', KEYS[i + 2])
  end
end
return {1, best, best_count, best_ttl}
"""
)
_PING = _CHECK_EPOCH + "return {1}\n"
# KEYS: the epoch, the replay key, the strangers' replay set. ARGV: the epoch, the ttl in ms,
# max_stranger_rows (-1: a trusted issuer vouches for the request), now in ms. A key seen before is
# {0} whatever the bound; a stranger's new key past the bound is {2}, nothing set.
_FIRST_SEEN = (
    _CHECK_EPOCH
    + _LIVE
    + """
local ttl, bound, now = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {0}
end
if bound >= 0 then
  if _live(KEYS[3], now) >= bound then
    return {2}
  end
  redis.call('ZADD', KEYS[3], string.format('%.0f', now + ttl), KEYS[2])
else
  redis.call('ZREM', KEYS[3], KEYS[2])
end
redis.call('SET', KEYS[2], '1', 'PX', ttl)
return {1}
"""
)


def _lost(epoch: bytes | None) -> bool:
    """Whether the epoch found in place of the adopted one means the counts are gone: none, another
    replica's, or a tombstone (an operator's acknowledgement is not a loss)."""
    return epoch is None or epoch.startswith((_REPLICA, _LOST))


class CounterStateLost(Error, RedisError):
    """Redis lost the counts and replay memory this store relied on: refuse until an operator acks.
    A ``RedisError`` too, as every failure of this store is (the gateway answers each with 503)."""

    def __init__(self, detail: str) -> None:
        super().__init__("counter-state-lost", detail)


class _WaitingPool(aioredis.BlockingConnectionPool):
    """redis-py's waiting pool, a wake-up never lost: on Python 3.11 a waiter cancelled in the loop
    turn it was notified (a client gone, the readiness probe's own timeout) took the notification
    with it (CPython gh-112202), and a released connection sat idle while the others waited out the
    timeout, then answered 503. A cancelled waiter passes a wake-up on; a spare one is harmless."""

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        except asyncio.CancelledError:
            async with self._condition:
                self._condition.notify()
            raise


class RedisCounterStore:
    """``CounterStore`` on one Redis database (``redis://host:6379/0``, ``unix:///path?db=0``)."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.epoch: bytes | None = None  # adopted on the first operation
        self._adopt: Any = client.register_script(_ADOPT)
        self._take_all: Any = client.register_script(_TAKE_ALL)
        self._first_seen: Any = client.register_script(_FIRST_SEEN)
        self._ping: Any = client.register_script(_PING)

    @classmethod
    def from_url(
        cls, url: str, *, max_connections: int = REDIS_MAX_CONNECTIONS, timeout_s: float = REDIS_TIMEOUT_S
    ) -> RedisCounterStore:
        """A store on a pool that waits: redis-py's default pool refuses at once when its connections
        are all in use (the 101st concurrent request was a 503 while Redis was healthy), so a request
        past ``max_connections`` waits for one, at most ``timeout_s`` (then ``ConnectionError``, a
        ``RedisError``: 503 as any store failure). The readiness probe shares the pool."""
        pool = _WaitingPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            socket_timeout=timeout_s,
        )
        return cls(aioredis.Redis.from_pool(pool))  # the client owns the pool: close() closes both

    async def _run(self, script: Any, keys: list[str], args: list[Any]) -> list[Any]:
        """``script`` behind the epoch check; an operator's new epoch is adopted once, then retried."""
        for _attempt in range(2):
            if self.epoch is None:
                epoch = bytes(
                    await self._adopt(keys=[EPOCH_KEY], args=[_REPLICA + secrets.token_hex(16).encode()])
                )
                if epoch.startswith(_LOST):
                    raise CounterStateLost(f"Redis lost the counters ({EPOCH_KEY} is {epoch!r})")
                self.epoch = epoch
            result: list[Any] = await script(keys=[EPOCH_KEY, *keys], args=[self.epoch, *args])
            if int(result[0]) != -1:
                return result
            now = bytes(result[1])
            if _lost(now):
                log.error(
                    "Redis lost the counters and replay memory (%s was %r, is %r): refusing until "
                    "an operator accepts the loss with: redis-cli SET %s ack-<anything>",
                    EPOCH_KEY,
                    self.epoch,
                    now,
                    EPOCH_KEY,
                )
                raise CounterStateLost(f"Redis lost the counters ({EPOCH_KEY} is {now!r})")
            log.warning("operator accepted the counters' loss: %s is now %r", EPOCH_KEY, now)
            self.epoch = now
        raise CounterStateLost(f"{EPOCH_KEY} keeps changing")

    async def take_all(
        self, counters: Sequence[QuotaCounter], now: float, max_stranger_rows: int | None = None
    ) -> tuple[int, Taken]:
        args: list[Any] = [-1 if max_stranger_rows is None else max_stranger_rows, math.floor(now * 1000)]
        for counter in counters:
            window_s = counter.window_s
            args += [counter.limit, max(1, math.ceil(window_s * 1000)) if window_s is not None else 0]
        keys = [STRANGERS_KEY] + [KEY_PREFIX + "q:" + c.key for c in counters]
        result = await self._run(self._take_all, keys, args)
        if int(result[0]) == 2:
            assert max_stranger_rows is not None  # the script answers {2} only with a bound
            raise StrangerRowsFull(max_stranger_rows)
        allowed, index, count, pttl = result
        reset_at = now + int(pttl) / 1000 if int(pttl) >= 0 else None  # -1: no expiry (lifetime)
        return int(index) - 1, Taken(bool(allowed), int(count), reset_at)

    async def first_seen(
        self, key: str, ttl_s: float, now: float, max_stranger_rows: int | None = None
    ) -> bool:
        ttl_ms = max(1, math.ceil(ttl_s * 1000))
        bound = -1 if max_stranger_rows is None else max_stranger_rows
        keys = [KEY_PREFIX + "r:" + key, REPLAY_STRANGERS_KEY]
        (fresh,) = await self._run(self._first_seen, keys, [ttl_ms, bound, math.floor(now * 1000)])
        if int(fresh) == 2:
            assert max_stranger_rows is not None  # the script answers {2} only with a bound
            raise ReplayRowsFull(max_stranger_rows)
        return bool(fresh)

    async def ping(self) -> None:
        """``/readyz``'s probe: the epoch check every operation makes, alone (``CounterStateLost`` when
        the data is lost; an operator's acknowledgement adopted). It writes the tombstone as they do,
        so a loss the probe sees first is refused by replicas started after it too."""
        await self._run(self._ping, [], [])

    async def close(self) -> None:
        await self.client.aclose()
