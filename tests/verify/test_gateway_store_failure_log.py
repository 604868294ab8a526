"""A failing counter store is logged once a minute, not once per request: while it fails, every
request that needs it (a stranger's too) is refused 503, and a line each would let anyone fill the
log. Each refusal still answers 503 with its stable reason."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from signing_proxy.core.gateway_ingest import QuotaCounter
from signing_proxy.verify.counters import Taken
from signing_proxy.verify.gateway import GatewayPolicy
from tests.verify.test_gateway import World, world  # noqa: F401 (the fixture)


class BrokenStore:
    """A ``CounterStore`` whose every operation fails as a client that lost its server does."""

    async def take_all(
        self, counters: Sequence[QuotaCounter], now: float, max_stranger_rows: int | None = None
    ) -> tuple[int, Taken]:
        raise ConnectionError("store down")

    async def first_seen(
        self, key: str, ttl_s: float, now: float, max_stranger_rows: int | None = None
    ) -> bool:
        raise ConnectionError("store down")

    async def ping(self) -> None:
        raise ConnectionError("store down")

    async def close(self) -> None:
        return None


def failure_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("counter store failed")]


@pytest.mark.parametrize("step", ["replay", "quota"])
async def test_a_failing_store_is_logged_once_a_minute(
    world: World,  # noqa: F811 (the fixture)
    caplog: pytest.LogCaptureFixture,
    step: str,
) -> None:
    store, world.gateway.store = world.gateway.store, BrokenStore()
    reason = f"{step}-store-unavailable"
    if step == "quota":
        world.gateway.policy = GatewayPolicy()  # no replay protection: the quota step is reached
    caplog.set_level(logging.WARNING, logger="signing_proxy.gateway")
    try:
        for _ in range(20):
            body = world.body(world.chain(max_accesses=5)) if step == "quota" else world.body()
            refusal = await world.refused(body)
            assert (refusal.status, refusal.reason) == (503, reason)
        lines = failure_lines(caplog)
        assert len(lines) == 1, f"{len(lines)} lines for 20 refusals"
        assert "ConnectionError" in lines[0]  # the error's type; never its text (it may name the store)
        world.clock.now += 60  # a minute on: the next failure is logged again
        body = world.body(world.chain(max_accesses=5)) if step == "quota" else world.body()
        refusal = await world.refused(body)
        assert refusal.reason == reason
        assert len(failure_lines(caplog)) == 2
    finally:
        world.gateway.store = store
