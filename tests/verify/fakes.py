"""Fakes for the resolver and the poller: a settable clock and a fetcher answering from a dict."""

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
