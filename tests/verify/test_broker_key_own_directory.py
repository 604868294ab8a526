"""Spec "Multi-hop forwarding" rule 2: a broker's key is found "in the broker's own directory". The
agent's directory names the agent's keys only: a later label signed by a key it lists (the agent
stacking a "broker" label itself) is a key no broker published, and is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from signing_proxy.core.errors import VerificationError
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import Directory, DirectoryKey, render_directory
from signing_proxy.core.signatures import Message, attach_signature, hop_components, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.verify import (
    DirectoryResolver,
    FetchResult,
    RequestVerifier,
    RevocationPoller,
    VerifierPolicy,
    directory_url,
)
from tests.verify.fakes import NOW, Clock, FakeFetch
from tests.verify.strangers import TARGET, signed

AGENT_DIR = "https://agent.example"
BROKER_DIR = "https://broker.example"
AGENT = SigningKey.from_seed(bytes(range(32)))
BROKER = SigningKey.from_seed(bytes(range(1, 33)))
BODY = b'{"ver":"1.0"}'


def _directory(key: SigningKey) -> FetchResult:
    body = render_directory(Directory((DirectoryKey(key.public, NOW - 60, NOW + 3600),)))
    return FetchResult(200, body, "max-age=300")


@pytest.fixture
async def verifier() -> AsyncIterator[RequestVerifier]:
    clock, fetch = Clock(), FakeFetch()
    fetch.answers[directory_url(AGENT_DIR)] = _directory(AGENT)
    fetch.answers[directory_url(BROKER_DIR)] = _directory(BROKER)
    made = RequestVerifier(
        DirectoryResolver(fetch, clock=clock),
        VerifierPolicy(broker_directories=(BROKER_DIR,)),
        revocations=RevocationPoller(fetch, clock=clock),
        clock=clock,
    )
    yield made
    await made.close()


def relayed(hop_key: SigningKey, agent: str = f'"{AGENT_DIR}"', agent_key: SigningKey = AGENT) -> Fields:
    """A request signed by ``agent_key`` with ``Signature-Agent: agent`` (the agent's, by default),
    and a "broker" label signed by ``hop_key`` over its signature."""
    fields = signed(agent, agent_key, now=NOW, body=BODY)
    hop = sign_message(
        Message("POST", parse_absolute_uri(TARGET), fields),
        hop_key,
        created=NOW,
        expires=NOW + 60,
        label="broker",
        components=hop_components("agent"),
    )
    attach_signature(fields, hop)
    return fields


async def test_a_later_label_signed_with_a_key_only_the_agents_directory_lists_is_refused(
    verifier: RequestVerifier,
) -> None:
    # the control: the broker's key, from the broker's directory
    stack = await verifier.verify("POST", TARGET, relayed(BROKER), BODY)
    assert [s.key_source for s in stack.signatures] == [AGENT_DIR, BROKER_DIR]
    # the agent's own key under the broker's label: listed by the agent's directory, by no broker's
    with pytest.raises(VerificationError) as caught:
        await verifier.verify("POST", TARGET, relayed(AGENT), BODY)
    assert (caught.value.reason, caught.value.label) == ("unknown-keyid", "broker")


@pytest.mark.parametrize("other", [BROKER_DIR + "/", "HTTPS://Broker.example"], ids=["slash", "case"])
async def test_one_broker_directory_under_two_spellings_is_one_directory(other: str) -> None:
    """Configured as ``https://broker.example`` and ``https://broker.example/`` (``config check`` takes
    both), it was two sources: the broker's own key read as listed twice, refused ambiguous-key."""
    clock, fetch = Clock(), FakeFetch()
    fetch.answers[directory_url(AGENT_DIR)] = _directory(AGENT)
    fetch.answers[directory_url(BROKER_DIR)] = _directory(BROKER)
    made = RequestVerifier(
        DirectoryResolver(fetch, clock=clock),
        VerifierPolicy(broker_directories=(BROKER_DIR, other)),
        revocations=RevocationPoller(fetch, clock=clock),
        clock=clock,
    )
    try:
        stack = await made.verify("POST", TARGET, relayed(BROKER), BODY)
    finally:
        await made.close()
    assert [s.key_source for s in stack.signatures] == [AGENT_DIR, BROKER_DIR]
