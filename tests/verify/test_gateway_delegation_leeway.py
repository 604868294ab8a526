"""``gateway.delegation_leeway_s`` forgives a clock difference on a chain's ``exp``, and so on its
mirrored ``delegation.expires_at`` too: that mirror is required and no later than the chain's
``exp``, so judged without the leeway it refused every chain the leeway let pass. It is never more
lenient than the chain: a mirror earlier than ``exp`` ends, leeway included, earlier."""

from __future__ import annotations

import dataclasses

import pytest

from signing_proxy.verify.gateway import DELEGATION_INVALID
from tests.verify.fakes import NOW
from tests.verify.test_gateway import World, world  # noqa: F401 (the fixture)


@pytest.fixture
def lenient(world: World) -> World:  # noqa: F811 (the fixture)
    """The world's gateway forgiving 60 s on ``exp``/``nbf``."""
    world.gateway.policy = dataclasses.replace(world.gateway.policy, leeway_s=60)
    return world


async def test_a_chain_past_its_exp_but_within_the_leeway_is_accepted(lenient: World) -> None:
    body = lenient.body(lenient.chain(exp=NOW + 10), expires_at=NOW + 10)
    lenient.clock.now = NOW + 20  # 10 s past exp and expires_at, well inside 60 s
    verdict = await lenient.check(body)
    assert verdict.delegation is not None
    assert verdict.delegation.expires_at == NOW + 10


@pytest.mark.parametrize("late", [70, 71])  # exp + leeway is already too late (exclusive)
async def test_a_chain_past_its_exp_and_the_leeway_is_refused_expired(lenient: World, late: int) -> None:
    body = lenient.body(lenient.chain(exp=NOW + 10), expires_at=NOW + 10)
    lenient.clock.now = NOW + late
    refusal = await lenient.refused(body)
    assert (refusal.status, refusal.reason) == (403, DELEGATION_INVALID)
    assert refusal.detail.startswith("expired")


async def test_a_mirror_earlier_than_exp_ends_earlier_leeway_included(lenient: World) -> None:
    body = lenient.body(lenient.chain(exp=NOW + 10), expires_at=NOW + 5)
    lenient.clock.now = NOW + 66  # the chain still passes (exp + 60 = +70); its mirror ended at +65
    refusal = await lenient.refused(body)
    assert (refusal.status, refusal.reason) == (403, DELEGATION_INVALID)
    assert refusal.detail == "expired: delegation.expires_at has passed"


async def test_without_leeway_an_expires_at_that_has_passed_is_refused(world: World) -> None:  # noqa: F811
    body = world.body(world.chain(exp=NOW + 10), expires_at=NOW + 5)
    world.clock.now = NOW + 6
    refusal = await world.refused(body)
    assert refusal.detail == "expired: delegation.expires_at has passed"
