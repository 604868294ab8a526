"""A configured broker directory that is down costs a stranger's stacked request nothing: it is not
looked at before the agent's key is found (without it the first label refuses whatever the broker
publishes), and its "unavailable" line is written once a minute, not once per request."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from signing_proxy.core.errors import VerificationError
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import Directory, DirectoryKey, render_directory
from signing_proxy.verify import (
    DirectoryResolver,
    FetchResult,
    RequestVerifier,
    RevocationPoller,
    VerifierPolicy,
    directory_url,
)
from tests.verify.fakes import NOW, Clock, FakeFetch
from tests.verify.strangers import BODY, TARGET
from tests.verify.test_broker_key_own_directory import AGENT, AGENT_DIR, BROKER_DIR, relayed

STRANGER = SigningKey.from_seed(bytes(range(2, 34)))
HOP = SigningKey.from_seed(bytes(range(1, 33)))


@pytest.fixture
def fetch() -> FakeFetch:
    made = FakeFetch()
    doc = render_directory(Directory((DirectoryKey(AGENT.public, NOW - 60, NOW + 3600),)))
    made.answers[directory_url(AGENT_DIR)] = FetchResult(200, doc, "max-age=300")
    made.answers[directory_url(BROKER_DIR)] = FetchResult(503, b"", None)  # the broker's directory: down
    return made


@pytest.fixture
async def verifier(fetch: FakeFetch) -> AsyncIterator[RequestVerifier]:
    clock = Clock()
    made = RequestVerifier(
        DirectoryResolver(fetch, clock=clock),
        VerifierPolicy(broker_directories=(BROKER_DIR,)),
        revocations=RevocationPoller(fetch, clock=clock),
        clock=clock,
    )
    yield made
    await made.close()


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_stranger_without_a_known_key_never_has_the_broker_directory_looked_at(
    verifier: RequestVerifier, fetch: FakeFetch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="signing_proxy")
    for _ in range(50):  # an empty Signature-Agent, no pinned key: the first label's key is unknown
        with pytest.raises(VerificationError) as caught:
            await verifier.verify("POST", TARGET, relayed(HOP, "", STRANGER), BODY)
        assert (caught.value.reason, caught.value.label) == ("unknown-keyid", "agent")
    assert directory_url(BROKER_DIR) not in fetch.calls
    assert warnings(caplog) == []


async def test_the_broker_directory_being_down_is_logged_once_a_minute(
    verifier: RequestVerifier, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="signing_proxy")
    for _ in range(50):  # the agent's key is known: the broker's label needs the broker's directory
        with pytest.raises(VerificationError) as caught:
            await verifier.verify("POST", TARGET, relayed(HOP), BODY)
        assert (caught.value.reason, caught.value.label) == ("unknown-keyid", "broker")
    said = warnings(caplog)
    assert len(said) == 1, said
    assert BROKER_DIR in said[0]
