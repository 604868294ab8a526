"""Spec "Delegation": ``token_format`` ``jwt`` is the sole supported format. A Delegation naming
another format is refused (DENIAL_REASON_DELEGATION_INVALID, cause ``unsupported-token-format``),
even when its token is a good JWT chain: the format named is not one the gateway reads."""

from __future__ import annotations

import json

from signing_proxy.verify.gateway import DELEGATION_INVALID
from tests.verify.fakes import NOW
from tests.verify.test_gateway import World, world  # noqa: F401 (the fixture)


def with_token_format(body: bytes, token_format: str) -> bytes:
    doc = json.loads(body)
    doc["requester"]["delegation"]["token_format"] = token_format
    return json.dumps(doc).encode()


async def test_a_delegation_in_another_token_format_is_refused(
    world: World,  # noqa: F811
) -> None:
    chain = world.chain()
    # the control: the same chain, its format named jwt
    verdict = await world.check(with_token_format(world.body(chain), "jwt"))
    assert verdict.delegation is not None
    world.clock.now = NOW + 1  # a new created: not a replay
    refusal = await world.refused(with_token_format(world.body(chain), "cwt"))
    assert (refusal.status, refusal.reason) == (403, DELEGATION_INVALID)
    assert refusal.detail.startswith("unsupported-token-format"), refusal.detail
