"""Configured broker directories are asked at once, and a request waits for one still fetching only
where its answer can change the verdict (``verify.verifier.ConfiguredDirectories``). One after the
other, a broker directory that hung held every request relayed by another broker for the whole fetch
timeout, again each time its failure memory (30 s) or its copy ran out. The ``ambiguous-key`` rule
still waits for a directory that never answered, or whose last answer listed the key.

Directories are served over loopback (127.0.0.1, port 0); the fetch timeout is 30 s and no request
is given more than 5 s, so an answer within it never came from a timeout."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from signing_proxy.core.errors import VerificationError
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import DIRECTORY_PATH
from signing_proxy.core.signatures import Message, attach_signature, hop_components, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.verify import (
    DirectoryResolver,
    FetchResult,
    HttpClient,
    RequestVerifier,
    RevocationPoller,
    VerifierPolicy,
    http_fetcher,
)
from signing_proxy.verify.directory import NEGATIVE_TTL_S
from tests.verify.fakes import NOW, Clock
from tests.verify.strangers import BODY, LOOPBACK, TARGET, directory_doc, signed

AGENT = SigningKey.from_seed(bytes([11]) * 32)
B1_KEY = SigningKey.from_seed(bytes([12]) * 32)
B2_KEY = SigningKey.from_seed(bytes([13]) * 32)
FETCH_TIMEOUT_S = 30.0
WAIT_S = 5.0  # every wait of the test: far under the fetch timeout


@dataclass
class Served:
    """What one directory path answers: a document (with its max-age), a status, or nothing until
    ``release`` (``entered`` is set when such a request arrives; ``meet``: first wait for that)."""

    body: bytes = b""
    status: int = 200
    max_age: int = 3600
    hang: bool = False
    meet: asyncio.Event | None = None
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    hits: int = 0


@dataclass
class Hosts:
    """Directories at ``/<name>`` + the well-known path on one loopback server."""

    base: str = ""
    served: dict[str, Served] = field(default_factory=dict)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def url(self, name: str) -> str:
        return f"{self.base}/{name}"

    async def handle(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        served = self.served[name]
        served.hits += 1
        served.entered.set()
        if served.meet is not None:
            await asyncio.wait_for(served.meet.wait(), WAIT_S)
        if served.hang:
            await self.release.wait()  # set only when the test ends
        headers = {"Cache-Control": f"max-age={served.max_age}"}
        return web.Response(status=served.status, body=served.body, headers=headers)


@dataclass
class Setup:
    hosts: Hosts
    verifier: RequestVerifier
    monotonic: Clock  # the resolver's: failure memory and cache lifetimes
    cancelled: list[str]  # fetches stopped before they answered (by ``close``)


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    hosts = Hosts()
    app = web.Application()
    app.router.add_get("/{name}" + DIRECTORY_PATH, hosts.handle)
    async with TestServer(app, host="127.0.0.1") as server, HttpClient.standalone() as client:
        hosts.base = f"http://127.0.0.1:{server.port}"
        hosts.served["agent"] = Served(directory_doc(AGENT, now=NOW))
        inner = http_fetcher(client, egress=LOOPBACK, timeout_s=FETCH_TIMEOUT_S)
        cancelled: list[str] = []

        async def fetch(url: str) -> FetchResult:
            try:
                return await inner(url)
            except asyncio.CancelledError:
                cancelled.append(url)
                raise

        wall, monotonic = Clock(), Clock()
        resolver = DirectoryResolver(fetch, clock=wall, monotonic=monotonic, fetch_timeout_s=FETCH_TIMEOUT_S)
        verifier = RequestVerifier(
            resolver,
            VerifierPolicy(broker_directories=(hosts.url("b1"), hosts.url("b2"))),
            revocations=RevocationPoller(fetch, clock=wall, monotonic=monotonic),
            clock=wall,
            egress=LOOPBACK,
        )
        try:
            yield Setup(hosts, verifier, monotonic, cancelled)
        finally:
            await asyncio.wait_for(verifier.close(), WAIT_S)
            hosts.release.set()


def hang(served: Served) -> None:
    """From now on ``served`` never answers; ``entered`` tells when the next request arrived."""
    served.hang = True
    served.entered.clear()


def relayed(setup: Setup, broker: SigningKey) -> Fields:
    """A request signed by the agent (its directory at ``/agent``), relayed by ``broker``."""
    fields = signed(f'"{setup.hosts.url("agent")}"', AGENT, now=NOW)
    hop = sign_message(
        Message("POST", parse_absolute_uri(TARGET), fields),
        broker,
        created=NOW,
        expires=NOW + 60,
        label="broker",
        components=hop_components("agent"),
    )
    attach_signature(fields, hop)
    return fields


async def verify(setup: Setup, broker: SigningKey) -> list[str | None]:
    async with asyncio.timeout(WAIT_S):
        stack = await setup.verifier.verify("POST", TARGET, relayed(setup, broker), BODY)
    return [s.key_source for s in stack.signatures]


async def refused(setup: Setup, broker: SigningKey) -> str:
    with pytest.raises(VerificationError) as caught:
        async with asyncio.timeout(WAIT_S):
            await setup.verifier.verify("POST", TARGET, relayed(setup, broker), BODY)
    return caught.value.reason


def waiters_left() -> int:
    """Tasks asking a configured directory still running: none outlives its request."""
    waiting = ("ConfiguredDirectories._ask", "RequestVerifier._refetched")
    return sum(getattr(t.get_coro(), "__qualname__", "") in waiting for t in asyncio.all_tasks())


async def test_a_request_relayed_by_one_broker_does_not_wait_for_another_brokers_hanging_directory(
    setup: Setup,
) -> None:
    hosts = setup.hosts
    hosts.served["b1"] = Served(directory_doc(B1_KEY, now=NOW))
    hosts.served["b2"] = Served(status=503)  # B2's host answers, then dies
    agent, b1 = hosts.url("agent"), hosts.url("b1")
    assert await verify(setup, B1_KEY) == [agent, b1]  # B2's last answer: a failure
    hang(hosts.served["b2"])
    setup.monotonic.now += NEGATIVE_TTL_S + 1  # B2's failure memory ran out; B1's copy is fresh
    # one after the other, this waited for B2's retry the whole fetch timeout (30 s)
    assert await verify(setup, B1_KEY) == [agent, b1]
    await asyncio.wait_for(hosts.served["b2"].entered.wait(), WAIT_S)
    assert hosts.served["b2"].hits == 2  # B2 was asked again: its fetch goes on in the resolver
    assert await verify(setup, B1_KEY) == [agent, b1]  # and does not hold the next request either
    assert hosts.served["b2"].hits == 2  # one fetch in flight, shared
    assert waiters_left() == 0
    assert setup.cancelled == []
    await asyncio.wait_for(setup.verifier.close(), WAIT_S)  # the hanging fetch is stopped, not left
    assert setup.cancelled == [hosts.url("b2") + DIRECTORY_PATH]


async def test_an_expired_copy_without_the_key_does_not_wait_for_its_hanging_refresh(
    setup: Setup,
) -> None:
    hosts = setup.hosts
    hosts.served["b1"] = Served(directory_doc(B1_KEY, now=NOW))
    hosts.served["b2"] = Served(directory_doc(B2_KEY, now=NOW), max_age=60)  # B2 lists its own key only
    agent, b1 = hosts.url("agent"), hosts.url("b1")
    assert await verify(setup, B1_KEY) == [agent, b1]
    hang(hosts.served["b2"])
    setup.monotonic.now += 61  # B2's copy expired (B1's lives an hour): its refresh hangs
    assert await verify(setup, B1_KEY) == [agent, b1]  # waited 30 s for the refresh before
    await asyncio.wait_for(hosts.served["b2"].entered.wait(), WAIT_S)
    assert hosts.served["b2"].hits == 2
    assert waiters_left() == 0


async def test_directories_never_fetched_are_fetched_at_once(setup: Setup) -> None:
    hosts = setup.hosts
    # each directory answers only once the other was asked: one after the other, neither would
    b1, b2 = Served(directory_doc(B1_KEY, now=NOW)), Served(directory_doc(B2_KEY, now=NOW))
    b1.meet, b2.meet = b2.entered, b1.entered
    hosts.served.update(b1=b1, b2=b2)
    assert await verify(setup, B1_KEY) == [hosts.url("agent"), hosts.url("b1")]
    assert await verify(setup, B2_KEY) == [hosts.url("agent"), hosts.url("b2")]


async def test_a_key_two_directories_list_is_still_refused_while_one_of_them_is_fetched(
    setup: Setup,
) -> None:
    hosts = setup.hosts
    hosts.served["b1"] = Served(directory_doc(B1_KEY, now=NOW))
    # B2 lists B1's key too: its answer is waited for when it never answered, and when its last
    # answer listed the key (its refresh decides whether it still does)
    hosts.served["b2"] = Served(directory_doc(B1_KEY, B2_KEY, now=NOW), max_age=60)
    assert await refused(setup, B1_KEY) == "ambiguous-key"
    setup.monotonic.now += 61  # B2's copy expired: B1's answers at once, B2's refresh takes a fetch
    assert await refused(setup, B1_KEY) == "ambiguous-key"
    assert hosts.served["b2"].hits == 2


async def test_a_key_no_directory_that_answered_lists_waits_for_those_still_fetching(setup: Setup) -> None:
    hosts = setup.hosts
    hosts.served["b1"] = Served(directory_doc(B1_KEY, now=NOW))
    hosts.served["b2"] = Served(status=503)
    assert await verify(setup, B1_KEY) == [hosts.url("agent"), hosts.url("b1")]
    hosts.served["b2"] = Served(directory_doc(B2_KEY, now=NOW))  # B2 is back
    setup.monotonic.now += NEGATIVE_TTL_S + 1
    # B2's last answer was a failure, but only its answer can hold B2's key: it is waited for
    assert await verify(setup, B2_KEY) == [hosts.url("agent"), hosts.url("b2")]


async def test_a_key_rotated_into_one_directory_does_not_wait_for_anothers_hanging_refetch(
    setup: Setup,
) -> None:
    """A keyid no cached copy lists has every configured directory fetched again, at once: the first
    fresh copy listing it is taken, one still fetching (its cached copy did not list it) is not
    waited for. One after the other, B1's rotated key waited for B2's hanging re-fetch."""
    hosts = setup.hosts
    rotated = SigningKey.from_seed(bytes([14]) * 32)
    hosts.served["b2"] = Served(directory_doc(B2_KEY, now=NOW))  # asked first: listed first
    hosts.served["b1"] = Served(directory_doc(B1_KEY, now=NOW))
    setup.verifier.policy = replace(
        setup.verifier.policy, broker_directories=(hosts.url("b2"), hosts.url("b1"))
    )
    assert await verify(setup, B1_KEY) == [hosts.url("agent"), hosts.url("b1")]  # both cached
    hang(hosts.served["b2"])
    hosts.served["b1"] = Served(directory_doc(B1_KEY, rotated, now=NOW))  # B1 rotates a key in
    setup.monotonic.now += 31  # past verify.keyid_refetch_s; both copies live an hour
    assert await verify(setup, rotated) == [hosts.url("agent"), hosts.url("b1")]
    await asyncio.wait_for(hosts.served["b2"].entered.wait(), WAIT_S)  # B2 was asked again too
    assert hosts.served["b1"].hits == 1
    assert waiters_left() == 0
