"""The gateway's five steps in process: each refusal's status and stable reason, and what passes.

Keys come from directories answered by a fake fetcher (agent and issuer), the clock is injected,
the counter store is the embedded SQLite one in a temp dir. Real processes: tests/proxy/test_gateway_e2e.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.core.delegation import extend_chain, issue_authority
from signing_proxy.core.fields import Fields
from signing_proxy.core.gateway_ingest import QuotaCounter
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.jws import sign_jwt
from signing_proxy.core.keys import Directory, DirectoryKey, render_directory
from signing_proxy.core.requester import DelegationDoc, RequesterDoc
from signing_proxy.verify import DirectoryResolver, FetchResult, RequestVerifier, RevocationPoller
from signing_proxy.verify.cache import TokenBucket
from signing_proxy.verify.counters import CounterStore, SqliteCounterStore, Taken
from signing_proxy.verify.gateway import (
    DELEGATION_INVALID,
    QUOTA_EXCEEDED,
    GatewayPolicy,
    GatewayRefusal,
    GatewayVerdict,
    GatewayVerifier,
)
from signing_proxy.verify.issuers import IssuerKeys
from signing_proxy.verify.redis_counters import RedisCounterStore
from tests.redis_server import RedisServer
from tests.verify.fakes import NOW, Clock, FakeFetch
from tests.verify.strangers import signed

AGENT = "https://agent.example"
OWNER = "https://owner.example"
EXCHANGE = "https://exchange.example/v1/svc.v1.ExchangeService/DiscoverResources"


def _directory(*keys: DirectoryKey) -> FetchResult:
    return FetchResult(200, render_directory(Directory(keys)), "max-age=300")


@dataclass
class World:
    gateway: GatewayVerifier
    fetch: FakeFetch
    clock: Clock
    agent: SigningKey
    owner: SigningKey
    principal: SigningKey

    def authority(self, owner: SigningKey | None = None, **claims: Any) -> str:
        claims.setdefault("exp", NOW + 3600)
        claims.setdefault("scope", ["dist:US:*"])
        return issue_authority(
            owner or self.owner, iss=OWNER, holder_jkt=self.principal.thumbprint, now=NOW, **claims
        )

    def chain(self, holder: str | None = None, **claims: Any) -> str:
        caps = {
            k: claims.pop(k) for k in ("max_accesses", "quota_period_s", "max_spend_cents") if k in claims
        }
        authority = self.authority(claims.pop("owner", None), **caps)
        return extend_chain(
            authority,
            self.principal,
            holder_jkt=holder or self.agent.thumbprint,
            now=NOW,
            scope=claims.pop("scope", ["dist:US:CA"]),
            exp=claims.pop("exp", NOW + 1800),
            **caps,
        )

    def child(self, authority: str, agent: SigningKey, max_accesses: int) -> str:
        """A child of ``authority`` from the principal to ``agent``, capping its own accesses."""
        return extend_chain(
            authority,
            self.principal,
            holder_jkt=agent.thumbprint,
            now=NOW,
            scope=["dist:US:CA"],
            exp=NOW + 1800,
            max_accesses=max_accesses,
        )

    def sign_as(self, agent: SigningKey) -> None:
        """Sign from now on with ``agent``'s key, now the one the agent directory lists."""
        self.agent = agent
        self.fetch.answers[AGENT + "/.well-known/http-message-signatures-directory"] = _directory(
            DirectoryKey(agent.public, NOW - 60, NOW + 3600)
        )
        self.gateway.verifier.resolver._cache.clear()  # the next agent's key, from its directory

    def body(self, chain: str | None = None, **requester: Any) -> bytes:
        delegation = None
        if chain is not None:
            delegation = DelegationDoc(
                principal_domain="corp.example",
                principal_id="alice",
                expires_at=requester.pop("expires_at", NOW + 1800),
                token=chain,
                scopes=tuple(requester.pop("delegation_scopes", ("dist:US:CA",))),
            )
        doc = RequesterDoc(
            id="agent-7",
            domain="agent.example",
            type="REQUESTER_TYPE_AGENT" if delegation is None else "REQUESTER_TYPE_DELEGATED",
            delegation=delegation,
        ).proto_json()
        doc.update(requester)
        return json.dumps({"ver": "1.0", "uris": [], "requester": doc}).encode()

    async def check(self, body: bytes, url: str = EXCHANGE) -> GatewayVerdict:
        fields = signed(AGENT, self.agent, now=int(self.clock.now), url=url, body=body)
        return await self.gateway.check("POST", url, fields, body)

    async def refused(self, body: bytes) -> GatewayRefusal:
        with pytest.raises(GatewayRefusal) as caught:
            await self.check(body)
        return caught.value


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    clock, fetch = Clock(), FakeFetch()
    agent, owner, principal = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    fetch.answers[AGENT + "/.well-known/http-message-signatures-directory"] = _directory(
        DirectoryKey(agent.public, NOW - 60, NOW + 3600)
    )
    resolver = DirectoryResolver(fetch, clock=clock)
    revocations = RevocationPoller(fetch, clock=clock)
    verifier = RequestVerifier(resolver, revocations=revocations, clock=clock)
    store = SqliteCounterStore(tmp_path / "counters.sqlite3")
    issuers = IssuerKeys(resolver, revocations, verifier.egress, grace_s=3600)
    policy = GatewayPolicy(understood_extensions=frozenset({"acme:billing"}), replay_protection=True)
    gateway = GatewayVerifier(verifier, issuers, store, policy, clock=clock)
    w = World(gateway, fetch, clock, agent, owner, principal)
    w.fetch.answers[OWNER + "/.well-known/http-message-signatures-directory"] = _directory(
        DirectoryKey(owner.public, NOW - 60, NOW + 3600)
    )
    yield w
    await verifier.close()
    await store.close()


@contextlib.asynccontextmanager
async def on_store(world: World, kind: str, tmp: Path) -> AsyncIterator[World]:
    """``world`` counting in its SQLite store (``kind`` "sqlite") or in a Redis of its own ("redis")."""
    if kind == "sqlite":
        yield world
        return
    with RedisServer(tmp) as server:
        store, world.gateway.store = world.gateway.store, RedisCounterStore.from_url(server.url)
        try:
            yield world
        finally:
            assert world.gateway.store is not None
            await world.gateway.store.close()
            world.gateway.store = store


async def test_a_plain_request_passes_with_its_hop_headers(world: World) -> None:
    verdict = await world.check(b"{}", url="https://exchange.example/feed")
    headers = dict(verdict.headers())
    assert headers["X-Verified-Hops"] == "1"
    assert headers["X-Verified-Keyid"] == world.agent.thumbprint
    assert headers["X-Verified-Directory"] == AGENT
    assert "X-Verified-Requester-Id" not in headers


async def test_a_request_signed_by_a_key_its_directory_does_not_hold_is_refused_401(world: World) -> None:
    stranger = signed(AGENT, SigningKey.generate(), now=NOW, url=EXCHANGE, body=b"x")
    with pytest.raises(GatewayRefusal) as caught:
        await world.gateway.check("POST", EXCHANGE, stranger, b"x")
    assert (caught.value.status, caught.value.reason) == (401, "unknown-keyid")


async def test_an_unsigned_request_is_refused_401(world: World) -> None:
    with pytest.raises(GatewayRefusal) as caught:
        await world.gateway.check("POST", EXCHANGE, Fields([("Content-Type", "application/json")]), b"x")
    assert (caught.value.status, caught.value.reason) == (401, "missing-signature")
    assert caught.value.headers == (("WWW-Authenticate", 'Signature realm="signing-proxy"'),)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"ver":"1.0"}', "requester-missing"),
        (b"[1]", "malformed-body"),
        (b'{"requester":{"id":"a","domain":"d","type":"REQUESTER_TYPE_AGENT"}}', "envelope-version-missing"),
        (b'{"ver":"2.0","requester":{}}', "envelope-version-unsupported"),
        (b'{"ver":"1.0","requester":{"id":"a","domain":"d"}}', "requester-field-missing"),
        (
            b'{"ver":"1.0","requester":{"id":"a","domain":"d","type":"REQUESTER_TYPE_UNSPECIFIED"}}',
            "requester-type-unspecified",
        ),
        (b'{"ver":"1.0","requester":{"id":"a","domain":"d","type":0}}', "requester-type-unspecified"),
        (b'{"ver":"1.0","requester":{"id":"a","domain":"d","type":"0"}}', "requester-type-unspecified"),
        (b'{"ver":"1.0","requester":{"id":"a","domain":"d","type":9}}', "requester-type-unknown"),
        (b'{"ver":"1.0","requester":{"id":"a","domain":"d","type":true}}', "requester-type-unknown"),
        # an object or an array is never looked up (unhashable: it escaped as a 500)
        (b'{"ver":"1.0","requester":{"id":"a","domain":"d","type":{"x":1}}}', "requester-type-unknown"),
        (b'{"ver":"1.0","requester":{"id":"a","domain":"d","type":[1]}}', "requester-type-unknown"),
        (b'{"ver":"1.0","requester":{"id":"a","domain":"d","type":null}}', "requester-field-missing"),
        (
            b'{"ver":"1.0","requester":{"id":"a","domain":"d","type":"REQUESTER_TYPE_ROBOT"}}',
            "requester-type-unknown",
        ),
        (
            b'{"ver":"1.0","requester":{"id":"a","domain":"d","type":1,"ext":{"x:y":1},"ext_critical":["x:y"]}}',
            "unknown-critical-extension",
        ),
    ],
)
async def test_ingest_refusals_are_400(world: World, body: bytes, reason: str) -> None:
    refusal = await world.refused(body)
    assert (refusal.status, refusal.reason) == (400, reason)


async def test_understood_critical_extension_passes(world: World) -> None:
    body = world.body(ext={"acme:billing": "x"}, ext_critical=["acme:billing"])
    verdict = await world.check(body)
    assert verdict.requester is not None
    assert verdict.requester.id == "agent-7"


async def test_a_good_chain_passes_with_the_narrowest_scopes(world: World) -> None:
    verdict = await world.check(world.body(world.chain()))
    headers = dict(verdict.headers())
    assert headers["X-Verified-Delegation-Issuer"] == OWNER
    assert headers["X-Verified-Principal-Key"] == world.principal.thumbprint
    assert headers["X-Verified-Scopes"] == "dist:US:CA"
    assert headers["X-Verified-Holder"] == "agent"
    assert headers["X-Verified-Requester-Id"] == "agent-7"


@pytest.mark.parametrize("case", ["wrong-holder", "expired-link", "mirror-wider", "untrusted-owner"])
async def test_delegation_refusals_are_403_delegation_invalid(world: World, case: str) -> None:
    if case == "wrong-holder":
        body = world.body(world.chain(holder=SigningKey.generate().thumbprint))
    elif case == "expired-link":
        body = world.body(world.chain(exp=NOW + 30), expires_at=NOW + 30)
        world.clock.now = NOW + 60
    elif case == "mirror-wider":
        body = world.body(world.chain(), delegation_scopes=("dist:US:*",))
    else:
        body = world.body(world.chain(owner=SigningKey.generate()))
    refusal = await world.refused(body)
    assert (refusal.status, refusal.reason) == (403, DELEGATION_INVALID)


async def test_a_widened_child_scope_is_403(world: World) -> None:
    authority = world.authority()
    child = sign_jwt(
        {"iss": "p", "cnf": {"jkt": world.agent.thumbprint}, "scope": "dist:EU", "exp": NOW + 60},
        world.principal,
        {"jwk": world.principal.public.jwk()},
    )
    refusal = await world.refused(world.body(authority + "~" + child, delegation_scopes=()))
    assert (refusal.status, refusal.reason) == (403, DELEGATION_INVALID)
    assert "scope-widened" in refusal.detail


@pytest.mark.parametrize(("ended_ago", "accepted"), [(60, True), (7200, False)])
async def test_rotated_issuer_key_within_and_after_grace(
    world: World, ended_ago: int, accepted: bool
) -> None:
    old = SigningKey.generate()
    world.fetch.answers[OWNER + "/.well-known/http-message-signatures-directory"] = _directory(
        DirectoryKey(old.public, NOW - 86_400, NOW - ended_ago),
        DirectoryKey(world.owner.public, NOW - 60, NOW + 3600),
    )
    body = world.body(world.chain(owner=old))
    if accepted:
        assert (await world.check(body)).delegation is not None
    else:
        refusal = await world.refused(body)
        assert (refusal.status, refusal.reason) == (403, DELEGATION_INVALID)


async def test_quota_counts_per_chain_and_refuses_with_retry_after(world: World) -> None:
    chain = world.chain(max_accesses=2, quota_period_s=60)
    remaining = []
    for t in range(2):
        world.clock.now = NOW + t  # a new created: not a replay
        body = world.body(chain)
        remaining.append((await world.check(body)).remaining_accesses)
    assert remaining == [1, 0]
    world.clock.now = NOW + 2
    refusal = await world.refused(world.body(chain))
    assert (refusal.status, refusal.reason) == (429, QUOTA_EXCEEDED)
    assert dict(refusal.headers)["Retry-After"] == "58"


async def test_retry_after_counts_from_the_refusal_not_from_the_request(world: World) -> None:
    """A take that waits (another worker holds the store's lock and opens the window meanwhile) must
    not announce more than the window's remaining time: the wait is counted from the refusal."""
    store = world.gateway.store
    assert store is not None
    inner: CounterStore = store  # the narrowed type, kept inside the methods below

    class WaitingStore:
        async def take_all(
            self, counters: Sequence[QuotaCounter], now: float, max_stranger_rows: int | None = None
        ) -> tuple[int, Taken]:
            world.clock.now += 0.5  # the lock was held this long; the window opens at the later time
            return await inner.take_all(counters, world.clock.now, max_stranger_rows)

        async def first_seen(
            self, key: str, ttl_s: float, now: float, max_stranger_rows: int | None = None
        ) -> bool:
            return await inner.first_seen(key, ttl_s, now, max_stranger_rows)

        async def ping(self) -> None:
            await inner.ping()

        async def close(self) -> None:  # a whole CounterStore (the world fixture closes the inner one)
            await inner.close()

    world.gateway.store = WaitingStore()
    chain = world.chain(max_accesses=1, quota_period_s=60)
    await world.check(world.body(chain))  # the window: NOW + 0.5 .. NOW + 60.5
    world.clock.now = NOW + 2
    refusal = await world.refused(world.body(chain))  # refused at NOW + 2.5: 58 s remain
    assert dict(refusal.headers)["Retry-After"] == "58"


async def test_replayed_signature_is_refused(world: World) -> None:
    body = world.body()
    await world.check(body)
    refusal = await world.refused(body)
    assert (refusal.status, refusal.reason) == (401, "signature-replayed")
    assert refusal.headers == (("WWW-Authenticate", 'Signature realm="signing-proxy"'),)


async def test_without_a_store_a_capped_chain_is_refused_not_waved_through(world: World) -> None:
    store, world.gateway.store = world.gateway.store, None
    try:
        refusal = await world.refused(world.body(world.chain(max_accesses=5)))
        assert (refusal.status, refusal.reason) == (503, "replay-store-unavailable")
        world.gateway.policy = GatewayPolicy()  # no replay protection: the quota step is reached
        refusal = await world.refused(world.body(world.chain(max_accesses=5)))
        assert (refusal.status, refusal.reason) == (503, "quota-store-unavailable")
    finally:
        world.gateway.store = store


async def test_declared_values_cannot_inject_header_lines(world: World) -> None:
    body = world.body(id="x\r\nX-Verified-Holder: broker", domain="d\u00e9.example")
    headers = dict((await world.check(body)).headers())
    assert headers["X-Verified-Requester-Id"] == "x%0D%0AX-Verified-Holder: broker"
    assert headers["X-Verified-Requester-Domain"] == "d%C3%A9.example"
    assert all(v.isascii() and "\r" not in v and "\n" not in v for v in headers.values())


async def test_a_replay_spends_no_access(world: World) -> None:
    chain = world.chain(max_accesses=2, quota_period_s=60)
    body = world.body(chain)
    assert (await world.check(body)).remaining_accesses == 1
    replayed = await world.refused(body)
    assert (replayed.status, replayed.reason) == (401, "signature-replayed")
    world.clock.now += 1
    assert (await world.check(world.body(chain))).remaining_accesses == 0  # the replay was not counted


async def test_an_unreachable_redis_store_fails_closed(world: World) -> None:
    store, world.gateway.store = world.gateway.store, RedisCounterStore.from_url("redis://127.0.0.1:1/0")
    try:
        refusal = await world.refused(world.body())
        assert (refusal.status, refusal.reason) == (503, "replay-store-unavailable")
        world.gateway.policy = GatewayPolicy()
        refusal = await world.refused(world.body(world.chain(max_accesses=5)))
        assert (refusal.status, refusal.reason) == (503, "quota-store-unavailable")
    finally:
        assert world.gateway.store is not None
        await world.gateway.store.close()
        world.gateway.store = store


async def test_an_issuer_directory_past_the_fetch_budget_is_503_not_a_refused_token(world: World) -> None:
    # the issuer's directory is named only by the token: it needs a token of the budget, and with
    # none left the answer is "retry", not DELEGATION_INVALID
    resolver = world.gateway.verifier.resolver
    budget = TokenBucket(0.001, 2, world.clock)
    resolver.fetch_budget = budget
    await world.check(b"{}", url="https://exchange.example/feed")  # the agent's directory: a token
    assert budget.take()  # the last one
    refusal = await world.refused(world.body(world.chain()))
    assert (refusal.status, refusal.reason) == (503, "verifier-busy")
    assert dict(refusal.headers)["Retry-After"] == "1"
    world.clock.now += 1000  # a token again
    assert (await world.check(world.body(world.chain()))).delegation is not None


async def test_a_percent_encoded_method_name_is_still_an_exchange_call(world: World) -> None:
    # a backend routes the decoded path: Discover%52esources is DiscoverResources, and must not
    # skip ingest, delegation and quota
    body = b'{"ver":"1.0","requester":{"id":"a","domain":"d","type":"REQUESTER_TYPE_UNSPECIFIED"}}'
    for url in (
        "https://exchange.example/v1/svc.v1.ExchangeService/Discover%52esources",
        "https://exchange.example/v1/svc.v1.ExchangeService%2FDiscoverResources",
    ):
        with pytest.raises(GatewayRefusal) as caught:
            await world.check(body, url=url)
        assert (caught.value.status, caught.value.reason) == (400, "requester-type-unspecified")


@pytest.mark.parametrize(
    "delegation",
    [
        '"x"',
        '{"token":"x","ext":{"x:y":1},"ext_critical":["x:y"]}',
    ],
)
async def test_an_unusable_delegation_member_is_403_delegation_invalid(world: World, delegation: str) -> None:
    # spec Errors: "Delegation token missing, unverifiable ..." -> DENIAL_REASON_DELEGATION_INVALID
    requester = '{"id":"a","domain":"d","type":"REQUESTER_TYPE_DELEGATED","delegation":' + delegation + "}"
    refusal = await world.refused(b'{"ver":"1.0","requester":' + requester.encode() + b"}")
    assert (refusal.status, refusal.reason) == (403, DELEGATION_INVALID)


async def test_the_chains_spend_cap_is_forwarded_to_the_backend(world: World) -> None:
    # the gateway cannot price a call: the narrowest spend cap of the chain goes to the backend as
    # a verified header, never silently dropped (spec: a claim the verifier cannot evaluate binds)
    verdict = await world.check(world.body(world.chain(max_spend_cents=500)))
    assert dict(verdict.headers())["X-Verified-Max-Spend-Cents"] == "500"
    plain = await world.check(world.body(world.chain()))
    assert "X-Verified-Max-Spend-Cents" not in dict(plain.headers())


async def test_siblings_share_the_cap_of_the_grant_they_came_from(world: World) -> None:
    # the authority caps accesses at 2; the principal delegates to three agents, each restating the
    # cap: the three together get 2, not 6 (spec: the exchange tracks the count of the cap)
    authority = world.authority(max_accesses=2)
    outcomes: list[object] = []
    for n, agent in enumerate([world.agent, SigningKey.generate(), SigningKey.generate()]):
        chain = world.child(authority, agent, max_accesses=2)
        world.sign_as(agent)
        for t in range(2):
            world.clock.now = NOW + 10 * n + t  # a new created: never a replay
            try:
                await world.check(world.body(chain))
                outcomes.append(200)
            except GatewayRefusal as refusal:
                outcomes.append((refusal.status, refusal.reason))
    assert outcomes == [200, 200] + [(429, QUOTA_EXCEEDED)] * 4


async def test_a_childs_own_cap_counts_apart_from_its_parents(world: World) -> None:
    # the authority allows 3; the child for this agent allows 1: the child's cap decides first
    narrow = world.child(world.authority(max_accesses=3), world.agent, max_accesses=1)
    verdict = await world.check(world.body(narrow))
    assert verdict.remaining_accesses == 0  # the child's count is the binding one
    world.clock.now = NOW + 1
    refusal = await world.refused(world.body(narrow))
    assert (refusal.status, refusal.reason) == (429, QUOTA_EXCEEDED)


async def test_siblings_have_their_own_caps_under_the_shared_one(world: World) -> None:
    # the authority allows 3 in all; each child allows 1: the first child's second call is refused
    # by its own cap while its sibling still gets one (a single shared counter would refuse it)
    authority = world.authority(max_accesses=3)
    outcomes: list[object] = []
    for n, agent in enumerate([world.agent, SigningKey.generate()]):
        chain = world.child(authority, agent, max_accesses=1)
        world.sign_as(agent)
        for t in range(2):
            world.clock.now = NOW + 10 * n + t
            try:
                outcomes.append((await world.check(world.body(chain))).remaining_accesses)
            except GatewayRefusal as refusal:
                outcomes.append((refusal.status, refusal.reason))
    assert outcomes == [0, (429, QUOTA_EXCEEDED), 0, (429, QUOTA_EXCEEDED)]


async def test_a_lifetime_cap_is_not_reset_by_the_holder_issuing_new_children(world: World) -> None:
    """The owner caps the principal at 2 accesses for the grant's lifetime (no exp, no quota_period:
    "absent means lifetime"). The root's window came from the chain's earliest exp, the principal's
    own child: when the child expired, so did the owner's count, and each new child had 2 more."""
    authority = world.authority(max_accesses=2, exp=None)
    outcomes: list[object] = []
    for start, child_exp in [(NOW, NOW + 100), (NOW + 200, NOW + 300), (NOW + 400, NOW + 500)]:
        world.clock.now = start
        chain = extend_chain(
            authority,
            world.principal,
            holder_jkt=world.agent.thumbprint,
            now=start,
            scope=["dist:US:CA"],
            exp=child_exp,
            max_accesses=2,  # each child restates the cap, and counts its own 2
        )
        for t in range(2):
            world.clock.now = start + 1 + t
            try:
                await world.check(world.body(chain, expires_at=child_exp))
                outcomes.append(200)
            except GatewayRefusal as refusal:
                outcomes.append((refusal.status, refusal.reason))
    assert outcomes == [200, 200] + [(429, QUOTA_EXCEEDED)] * 4


async def test_a_lone_surrogate_in_the_requester_is_a_400_not_a_500(world: World) -> None:
    """A correctly signed body whose requester.id is the escape ``\\ud800`` alone: the backend's
    header could not be encoded, and the gateway answered 500 with a traceback in its log."""
    body = world.body().replace(b'"agent-7"', b'"\\ud800"', 1)
    assert b"\\ud800" in body
    refusal = await world.refused(body)
    assert (refusal.status, refusal.reason) == (400, "malformed-body")


async def test_an_agent_acting_for_a_user_without_its_delegation_is_refused(world: World) -> None:
    """Spec Errors: "Delegation token missing" is DENIAL_REASON_DELEGATION_INVALID. A requester of
    type REQUESTER_TYPE_DELEGATED ("Agent acting on behalf of a user") with no delegation member
    was admitted as if it were any agent, with X-Verified-Requester-Type saying DELEGATED."""
    refusal = await world.refused(world.body(type="REQUESTER_TYPE_DELEGATED"))
    assert (refusal.status, refusal.reason) == (403, DELEGATION_INVALID)
    assert "delegation-missing" in refusal.detail
    world.clock.now = NOW + 1
    by_number = await world.refused(world.body(type=4))  # the number names the same type
    assert (by_number.status, by_number.reason) == (403, DELEGATION_INVALID)
    world.clock.now = NOW + 2
    verdict = await world.check(world.body(type="REQUESTER_TYPE_AGENT"))  # no delegation to miss
    assert ("X-Verified-Requester-Type", "REQUESTER_TYPE_AGENT") in verdict.headers()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/svc.v1.ExchangeService/DiscoverResources/"),
        ("POST", "/v1/svc.v1.ExchangeService/DiscoverResources;v=1"),
        ("POST", "/v1/svc.v1.ExchangeService/./DiscoverResources"),
        ("POST", "/v1/svc.v1.ExchangeService//DiscoverResources"),
        ("POST", "/v1/svc.v1.ExchangeService/DiscoverResources/x/.."),
        ("POST", "/v1/svc.v1.exchangeservice/DiscoverResources"),
        ("POST", "/v1/svc.v1.ExchangeService;x/DiscoverResources"),
        ("PUT", "/v1/svc.v1.ExchangeService/DiscoverResources"),
        ("POST", "/v1/svc.v1.ExchangeServ%C4%B1ce/DiscoverResources"),  # dotless i: upper() is "I"
        ("POST", "/v1/svc.v1.%EF%BC%A5xchangeService/DiscoverResources"),  # a fullwidth E
    ],
)
async def test_another_spelling_of_an_exchange_call_is_refused_not_waved_through(
    world: World, method: str, path: str
) -> None:
    """A backend may route these to the DiscoverResources handler; read as no exchange call, they
    skipped ingest, delegation, quota (a capped chain had unlimited accesses) and reached it."""
    url = f"https://exchange.example{path}"
    body = world.body(world.chain(max_accesses=1))
    fields = signed(AGENT, world.agent, now=int(world.clock.now), url=url, body=body, method=method)
    with pytest.raises(GatewayRefusal) as caught:
        await world.gateway.check(method, url, fields, body)
    assert (caught.value.status, caught.value.reason) == (400, "malformed-exchange-call")


async def test_a_path_that_only_mentions_the_service_elsewhere_is_still_refused(world: World) -> None:
    """Fail closed: the service's name anywhere in the path is an exchange call or a refusal."""
    with pytest.raises(GatewayRefusal) as caught:
        await world.check(b"{}", url="https://exchange.example/docs/svc.v1.ExchangeService/")
    assert (caught.value.status, caught.value.reason) == (400, "malformed-exchange-call")
    ordinary = await world.check(b"{}", url="https://exchange.example/v1/other/Discover")
    assert ordinary.requester is None
