"""The fetches a stranger's requests may cause are budgeted (``verify.fetches_per_s``, ``fetch_burst``).

Each request naming a directory not in cache, or a keyid its cached directory lacks, would make the
verifier fetch from a host the request names: at the rate strangers choose, the verifier would be a
reflector, and its event loop theirs. A request that finds no token is refused ``verifier-busy``
(503, ``Retry-After: 1``) with no fetch made; cached directories, their refreshes and configured
broker directories need no token (fake fetcher and clock).
"""

from __future__ import annotations

import time

import pytest

from signing_proxy.config import ConfigError, parse_config
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.signatures import Message, attach_signature, hop_components, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.verify import (
    DirectoryError,
    DirectoryResolver,
    EgressPolicy,
    FetchResult,
    RequestVerifier,
    RevocationPoller,
    VerificationError,
    VerifierPolicy,
    build_verifier,
    directory_url,
)
from signing_proxy.verify.cache import TokenBucket
from signing_proxy.verify.directory import VERIFIER_BUSY
from signing_proxy.verify.issuers import IssuerAnchor, IssuerKeys
from signing_proxy.verify.verifier import SIGNATURE_CHALLENGE, refusal_answer
from tests.verify.fakes import NOW, Clock
from tests.verify.strangers import BODY, TARGET, CountingFetch, directory_doc, signed

KEY = SigningKey.from_seed(bytes(range(32)))
ROTATED = SigningKey.from_seed(bytes(range(1, 33)))
BROKER = SigningKey.from_seed(bytes(range(2, 34)))


def agents(n: int) -> list[str]:
    return [f"https://agent{i}.example" for i in range(n)]


def world(fetch: CountingFetch, *bases: str, key: SigningKey = KEY) -> None:
    for base in bases:
        fetch.answers[directory_url(base)] = FetchResult(200, directory_doc(key, now=NOW), "max-age=300")


def test_the_bucket_starts_full_spends_and_refills_at_its_rate_up_to_its_burst() -> None:
    clock = Clock()
    bucket = TokenBucket(2.0, 3, clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    clock.now += 0.5  # one token
    assert [bucket.take(), bucket.take()] == [True, False]
    clock.now += 60  # refills to the burst, not beyond
    assert sum(bucket.take() for _ in range(10)) == 3
    clock.now -= 30  # a clock stepping back refills nothing
    assert not bucket.take()


async def test_new_directories_past_the_budget_are_refused_busy_without_a_fetch() -> None:
    clock, fetch = Clock(), CountingFetch()
    first, second, third = agents(3)
    world(fetch, first, second, third)
    resolver = DirectoryResolver(fetch, clock=clock, fetch_budget=TokenBucket(1.0, 2, clock))
    await resolver.get(first)
    await resolver.get(second)
    with pytest.raises(DirectoryError) as err:
        await resolver.get(third)
    assert err.value.reason == VERIFIER_BUSY
    assert fetch.calls == [directory_url(first), directory_url(second)]  # the third host never asked
    for _ in range(5):  # cached directories need no budget
        await resolver.get(first)
    clock.now += 1  # one token a second
    await resolver.get(third)
    assert fetch.calls[-1] == directory_url(third)


async def test_refreshes_and_configured_brokers_need_no_budget() -> None:
    clock, fetch = Clock(), CountingFetch()
    agent, broker = agents(2)
    world(fetch, agent, broker)
    resolver = DirectoryResolver(fetch, clock=clock, fetch_budget=TokenBucket(0.001, 1, clock))
    await resolver.get(agent)  # the only token
    await resolver.get(broker, budgeted=False)
    clock.now += 301  # past max-age: a refresh of a cached directory
    await resolver.get(agent)
    assert fetch.calls == [directory_url(agent), directory_url(broker), directory_url(agent)]


async def test_a_busy_verifier_refuses_with_its_own_reason_and_still_serves_cached_agents() -> None:
    clock, fetch = Clock(), CountingFetch()
    known, stranger = agents(2)
    world(fetch, known, stranger)
    resolver = DirectoryResolver(fetch, clock=clock, fetch_budget=TokenBucket(0.001, 1, clock))
    verifier = RequestVerifier(resolver, clock=clock)
    await verifier.verify("POST", TARGET, signed(f'"{known}"', KEY, now=NOW), BODY)
    with pytest.raises(VerificationError) as err:
        await verifier.verify("POST", TARGET, signed(f'"{stranger}"', KEY, now=NOW), BODY)
    assert err.value.reason == VERIFIER_BUSY
    assert refusal_answer(err.value) == (503, (("Retry-After", "1"),))
    stack = await verifier.verify("POST", TARGET, signed(f'"{known}"', KEY, now=NOW), BODY)
    assert stack.agent.keyid == KEY.thumbprint
    assert directory_url(stranger) not in fetch.calls
    await verifier.close()


async def test_a_keyid_refetch_spends_budget_and_is_tried_again_once_there_is_some() -> None:
    clock, fetch = Clock(), CountingFetch()
    (agent,) = agents(1)
    world(fetch, agent)
    budget = TokenBucket(1.0, 1, clock)
    verifier = RequestVerifier(DirectoryResolver(fetch, clock=clock, fetch_budget=budget), clock=clock)
    await verifier.verify("POST", TARGET, signed(f'"{agent}"', KEY, now=NOW), BODY)  # the token
    world(fetch, agent, key=ROTATED)  # a key rotated in since
    clock.now += 30  # the keyid re-fetch interval has passed; the bucket refilled, then is drained
    assert budget.take()
    with pytest.raises(VerificationError) as err:
        await verifier.verify("POST", TARGET, signed(f'"{agent}"', ROTATED, now=NOW + 30), BODY)
    assert err.value.reason == VERIFIER_BUSY  # not "unknown-keyid": the key may well be there
    clock.now += 1
    stack = await verifier.verify("POST", TARGET, signed(f'"{agent}"', ROTATED, now=NOW + 31), BODY)
    assert stack.agent.keyid == ROTATED.thumbprint  # the refused attempt did not use up the interval
    await verifier.close()


async def test_the_budget_comes_from_the_configuration_and_zero_means_unbounded() -> None:
    clock = Clock()
    config = parse_config({"verify": {"fetches_per_s": 0.5, "fetch_burst": 2}})
    verifier = build_verifier(VerifierPolicy(), limits=config.verify, clock=clock)
    budget = verifier.resolver.fetch_budget
    assert budget is not None
    assert (budget.rate, budget.burst) == (0.5, 2)
    await verifier.close()
    unbounded = build_verifier(limits=parse_config({"verify": {"fetches_per_s": 0}}).verify, clock=clock)
    assert unbounded.resolver.fetch_budget is None
    await unbounded.close()
    default = parse_config({}).verify
    assert (default.fetches_per_s, default.fetch_burst) == (20, 100)
    for bad in ({"fetches_per_s": -1}, {"fetches_per_s": "many"}, {"fetch_burst": 0}):
        with pytest.raises(ConfigError, match=r"verify\.fetch"):
            parse_config({"verify": bad})


def test_other_refusals_keep_401_and_the_signature_challenge() -> None:
    assert refusal_answer(VerificationError("bad-signature")) == (401, (SIGNATURE_CHALLENGE,))


async def test_a_configured_issuer_spends_no_budget_and_a_token_named_one_does() -> None:
    clock, fetch = Clock(), CountingFetch()
    configured, named = agents(2)
    world(fetch, configured, named)
    budget = TokenBucket(0.001, 1, clock)
    assert budget.take()  # none left
    resolver = DirectoryResolver(fetch, clock=clock, fetch_budget=budget)
    issuers = IssuerKeys(
        resolver,
        RevocationPoller(fetch, clock=clock),
        EgressPolicy(),
        trusted={"https://owner.example": IssuerAnchor(directory=configured)},
    )
    assert await issuers.keys_for("https://owner.example", lambda: NOW) == (KEY.public,)
    with pytest.raises(DirectoryError) as err:  # a stranger's issuer: no fetch without budget
        await issuers.keys_for(named, lambda: NOW)
    assert err.value.reason == VERIFIER_BUSY
    assert fetch.calls == [directory_url(configured)]


async def test_an_agent_that_verified_comes_back_without_budget_after_strangers_evicted_it() -> None:
    # strangers' directories can push a known agent's out of the byte-bounded cache; having
    # verified a signature lately, it is fetched again without a token, and a new one is still refused
    clock, fetch = Clock(), CountingFetch()
    known, first, second, new = agents(4)
    world(fetch, known, first, second, new)
    resolver = DirectoryResolver(fetch, clock=clock, max_entries=2, fetch_budget=TokenBucket(0.001, 3, clock))
    verifier = RequestVerifier(resolver, clock=clock)
    await verifier.verify("POST", TARGET, signed(f'"{known}"', KEY, now=NOW), BODY)
    for stranger in (first, second):  # the last two tokens; the known agent's entry is evicted
        await resolver.get(stranger)
    assert not resolver.holds(directory_url(known))
    stack = await verifier.verify("POST", TARGET, signed(f'"{known}"', KEY, now=NOW), BODY)
    assert stack.agent.keyid == KEY.thumbprint
    assert fetch.calls.count(directory_url(known)) == 2
    with pytest.raises(VerificationError) as err:
        await verifier.verify("POST", TARGET, signed(f'"{new}"', KEY, now=NOW), BODY)
    assert err.value.reason == VERIFIER_BUSY
    await verifier.close()


async def test_a_configured_directorys_keyid_refetch_spends_no_budget() -> None:
    clock, fetch = Clock(), CountingFetch()
    (broker,) = agents(1)
    world(fetch, broker)
    budget = TokenBucket(0.001, 1, clock)
    resolver = DirectoryResolver(fetch, clock=clock, fetch_budget=budget)
    await resolver.get(broker, budgeted=False)
    assert budget.take()  # none left
    clock.now += 30
    with pytest.raises(DirectoryError):
        await resolver.refetch_for_keyid(broker)  # as for a stranger's: refused
    assert await resolver.refetch_for_keyid(broker, budgeted=False) is not None
    assert fetch.calls == [directory_url(broker)] * 2


async def test_the_budget_runs_on_a_monotonic_clock() -> None:
    verifier = build_verifier(limits=parse_config({}).verify)
    budget = verifier.resolver.fetch_budget
    assert budget is not None
    assert budget.clock is time.monotonic  # a wall clock stepped back would stop the refill
    await verifier.close()


def relayed(agent: str, key: SigningKey, broker: SigningKey, *, now: int) -> Fields:
    """A request signed by ``key`` for ``agent``, then relayed: a ``broker`` label over the agent's."""
    fields = signed(f'"{agent}"', key, now=now)
    message = Message("POST", parse_absolute_uri(TARGET), fields)
    hop = sign_message(
        message, broker, created=now, expires=now + 60, label="broker", components=hop_components("agent")
    )
    attach_signature(fields, hop)
    return fields


async def test_a_configured_brokers_keyid_refetch_spends_no_budget_in_the_verifier() -> None:
    """A relay label whose keyid a configured broker rotated in re-fetches its directory without a token."""
    clock, fetch = Clock(), CountingFetch()
    agent, broker = agents(2)
    world(fetch, agent)
    world(fetch, broker, key=BROKER)
    budget = TokenBucket(0.001, 1, clock)
    resolver = DirectoryResolver(fetch, clock=clock, fetch_budget=budget)
    verifier = RequestVerifier(resolver, VerifierPolicy(broker_directories=(broker,)), clock=clock)
    await verifier.verify("POST", TARGET, relayed(agent, KEY, BROKER, now=NOW), BODY)  # the token
    world(fetch, broker, key=ROTATED)  # the broker rotated: its label now carries a keyid not cached
    clock.now += 30  # past the keyid re-fetch interval; 0.03 token refilled: the budget is empty
    stack = await verifier.verify("POST", TARGET, relayed(agent, KEY, ROTATED, now=NOW + 30), BODY)
    assert [s.key_source for s in stack.signatures] == [agent, broker]
    assert fetch.calls == [directory_url(agent), directory_url(broker), directory_url(broker)]
    assert not budget.take()  # still empty: the re-fetch took nothing
    await verifier.close()


async def test_a_recently_failed_directory_is_refused_from_the_negative_cache_without_a_token() -> None:
    """A request naming a directory that just failed is refused before a token is spent."""
    clock, fetch = Clock(), CountingFetch()
    failing, good = agents(2)
    world(fetch, good)  # the failing host answers 404
    budget = TokenBucket(0.001, 2, clock)
    verifier = RequestVerifier(DirectoryResolver(fetch, clock=clock, fetch_budget=budget), clock=clock)
    for _ in range(5):  # one fetch (one token), then the negative cache answers
        with pytest.raises(VerificationError) as err:
            await verifier.verify("POST", TARGET, signed(f'"{failing}"', KEY, now=NOW), BODY)
        assert err.value.reason == "directory-unavailable"  # never verifier-busy
    assert fetch.calls == [directory_url(failing)]
    stack = await verifier.verify("POST", TARGET, signed(f'"{good}"', KEY, now=NOW), BODY)
    assert stack.agent.keyid == KEY.thumbprint  # the second token was still there
    assert not budget.take()  # and it was the last one: the repeats took none
    await verifier.close()
