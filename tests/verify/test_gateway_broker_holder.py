"""Spec "Multi-hop forwarding" rule 5 at the gateway: the broker is the terminal holder only if the
agent delegated to the broker's key by a child JWT. A chain whose last link binds the broker's key
directly (the principal's grant to the broker, no link from the agent) is refused, however validly
the broker signed its label. The positive case through real processes: tests/proxy/test_gateway_e2e.py.
"""

from __future__ import annotations

import pytest

from signing_proxy.core.delegation import extend_chain
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import Directory, DirectoryKey, render_directory
from signing_proxy.core.signatures import Message, attach_signature, hop_components, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.verify import FetchResult, VerifierPolicy, directory_url
from signing_proxy.verify.gateway import DELEGATION_INVALID, GatewayRefusal, GatewayVerdict
from tests.verify.fakes import NOW
from tests.verify.strangers import signed
from tests.verify.test_gateway import AGENT, EXCHANGE, World, world  # noqa: F401 (the fixture)

BROKER_DIR = "https://broker.example"


def with_broker(w: World) -> SigningKey:
    """A broker whose directory the gateway knows (``broker_directories``); its key."""
    broker = SigningKey.generate()
    body = render_directory(Directory((DirectoryKey(broker.public, NOW - 60, NOW + 3600),)))
    w.fetch.answers[directory_url(BROKER_DIR)] = FetchResult(200, body, "max-age=300")
    w.gateway.verifier.policy = VerifierPolicy(broker_directories=(BROKER_DIR,))
    return broker


async def relayed(w: World, broker: SigningKey, body: bytes) -> GatewayVerdict:
    """The agent's request, with the broker's label stacked over the agent's signature."""
    now = int(w.clock.now)
    fields: Fields = signed(AGENT, w.agent, now=now, url=EXCHANGE, body=body)
    message = Message("POST", parse_absolute_uri(EXCHANGE), fields)
    hop = sign_message(
        message, broker, created=now, expires=now + 60, label="broker", components=hop_components("agent")
    )
    attach_signature(fields, hop)
    return await w.gateway.check("POST", EXCHANGE, fields, body)


async def test_a_chain_bound_to_the_broker_without_the_agents_child_jwt_is_refused(
    world: World,  # noqa: F811
) -> None:
    broker = with_broker(world)
    # the control: the agent delegates to the broker's key by a child JWT, the broker is the holder
    delegated = extend_chain(
        world.chain(), world.agent, holder_jkt=broker.thumbprint, now=NOW, scope=["dist:US:CA"], exp=NOW + 900
    )
    verdict = await relayed(world, broker, world.body(delegated, expires_at=NOW + 900))
    assert dict(verdict.headers())["X-Verified-Holder"] == "broker"
    # the principal grants the broker's key directly: the agent delegated nothing to the broker
    world.clock.now = NOW + 1  # a new created: not a replay
    direct = world.chain(holder=broker.thumbprint)
    with pytest.raises(GatewayRefusal) as caught:
        await relayed(world, broker, world.body(direct))
    assert (caught.value.status, caught.value.reason) == (403, DELEGATION_INVALID)
    assert caught.value.detail.startswith("holder-mismatch"), caught.value.detail
