"""Fakes for the resolver and the poller: a settable clock, a fetcher answering from a dict, and a
sleep that returns only when the test says so."""

from __future__ import annotations

import asyncio

from signing_proxy.verify import FetchResult

NOW = 1_700_000_000


class Clock:
    def __init__(self) -> None:
        self.now = float(NOW)

    def __call__(self) -> float:
        return self.now


class FakeFetch:
    """Answers from a dict of url -> FetchResult (or exception); counts calls."""

    def __init__(self) -> None:
        self.answers: dict[str, FetchResult | Exception] = {}
        self.calls: list[str] = []
        self.gate: asyncio.Event | None = None

    async def __call__(self, url: str) -> FetchResult:
        self.calls.append(url)
        if self.gate is not None:
            await self.gate.wait()
        answer = self.answers[url]
        if isinstance(answer, Exception):
            raise answer
        return answer


class Ticks:
    """An injected sleep for revocation pollers: records each delay and returns only on ``tick``."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock
        self.delays: list[float] = []
        self.sleeping: list[asyncio.Future[None]] = []
        self.asleep = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sleeping.append(wake)
        self.asleep.set()
        await wake

    async def tick(self, limit_s: float = 5.0) -> None:
        """Wake the sleeping poller (its delay passes on the clock); return once it sleeps again."""
        await asyncio.wait_for(self.asleep.wait(), limit_s)
        self.asleep.clear()
        if self.clock is not None:
            self.clock.now += self.delays[-1]
        for wake in self.sleeping:
            wake.set_result(None)
        self.sleeping.clear()
        await asyncio.wait_for(self.asleep.wait(), limit_s)
