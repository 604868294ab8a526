"""Revocation per directory with a fake fetcher, clock, sleep and random source (spec "Key
publication, rotation and revocation" 3: every 300 s +/-10 %, replace the set; "a revoked thumbprint
stays revoked" within the directory; a list never fetched fails closed; a failed poll keeps the set)."""

from __future__ import annotations

import asyncio
import base64
import gc
import hashlib
import time

import pytest

from signing_proxy.core.errors import KeyFormatError
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import (
    MAX_DIRECTORY_BYTES,
    MAX_REVOKED_THUMBPRINTS,
    Directory,
    DirectoryKey,
    RevocationList,
    render_directory,
    render_revocation_list,
)
from signing_proxy.core.signatures import Message, attach_signature, hop_components, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.net.egress import MAX_URL_CHARS
from signing_proxy.verify import (
    DeliveryPolicy,
    DeliveryVerifier,
    DirectoryError,
    DirectoryResolver,
    FetchResult,
    HttpClient,
    RequestVerifier,
    RevocationPoller,
    VerificationError,
    build_verifier,
    directory_url,
)
from signing_proxy.verify.directory import CACHE_BYTES, PARSED_COST_FACTOR
from signing_proxy.verify.issuers import IssuerAnchor, IssuerKeys
from signing_proxy.verify.revocation import (
    DIRECTORY_SHARE,
    MAX_REVOCATION_LIST_BYTES,
    MAX_REVOKED_PER_DIRECTORY,
    RETIRED_BYTES,
    RETIRED_DIRECTORIES,
    RETIRED_SET_COST,
    REVOKED_ENTRY_COST,
    _State,
    parse_bounded_list,
)
from signing_proxy.verify.verifier import VerifierPolicy
from tests.memory import held_after
from tests.verify.fakes import NOW, Clock, FakeFetch, Ticks
from tests.verify.strangers import BODY, LOOPBACK, TARGET, directory_doc, host, signed

KEY = SigningKey.from_seed(bytes(32))
OTHER = SigningKey.from_seed(bytes(range(32)))
DIR_URL = "https://agent.example/.well-known/http-message-signatures-directory"
REV_URL = "https://agent.example/revocations.json"


async def never_wakes(_seconds: float) -> None:
    """An injected sleep that never returns: the periodic poller waits in it until cancelled."""
    await asyncio.Event().wait()


def live_states() -> int:
    """Revocation states still in memory (GC-tracked objects, reachable or cyclic garbage)."""
    return sum(isinstance(o, _State) for o in gc.get_objects())


def listing(*thumbprints: str, as_of: int = NOW) -> FetchResult:
    return FetchResult(200, render_revocation_list(RevocationList(as_of, frozenset(thumbprints))), None)


async def test_polls_every_300s_with_10_percent_jitter_while_tracked_and_stops_when_forgotten() -> None:
    clock, fetch = Clock(), FakeFetch()
    fetch.answers[REV_URL] = listing()
    ticks = Ticks(clock)
    randoms = iter([0.0, 0.5, 0.999999, 0.25])
    poller = RevocationPoller(fetch, clock=clock, sleep=ticks.sleep, rand=lambda: next(randoms))
    assert await poller.ensure(DIR_URL, REV_URL) == frozenset()  # polled at once, then on a schedule
    for _ in range(3):
        await ticks.tick()
    assert len(fetch.calls) == 4
    assert ticks.delays[:3] == [pytest.approx(270), pytest.approx(300), pytest.approx(330, abs=0.01)]
    assert all(270 <= d <= 330 for d in ticks.delays)
    assert poller.pollers() == 1
    poller.forget(DIR_URL)  # the directory left the cache
    await asyncio.sleep(0)
    assert (poller.pollers(), len(poller)) == (0, 0)
    await poller.close()


async def test_each_poll_replaces_the_set_but_a_listed_thumbprint_stays_revoked_for_its_directory() -> None:
    clock, fetch = Clock(), FakeFetch()
    poller = RevocationPoller(fetch, clock=clock, sleep=never_wakes)
    fetch.answers[REV_URL] = listing(KEY.thumbprint)
    assert await poller.poll_once(DIR_URL, REV_URL)
    assert poller.revoked(DIR_URL) == {KEY.thumbprint}
    fetch.answers[REV_URL] = listing(OTHER.thumbprint, as_of=NOW + 300)  # KEY dropped, OTHER added
    assert await poller.poll_once(DIR_URL, REV_URL)
    assert poller.revoked(DIR_URL) == {KEY.thumbprint, OTHER.thumbprint}  # our choice: sticky
    assert poller.revoked("https://elsewhere.example/d") == frozenset()  # nobody else's business
    await poller.close()


async def test_a_failed_poll_keeps_the_last_set_and_its_age_shows_it() -> None:
    clock, fetch = Clock(), FakeFetch()
    fetch.answers[REV_URL] = listing(KEY.thumbprint)
    poller = RevocationPoller(fetch, clock=clock)
    assert await poller.poll_once(DIR_URL, REV_URL)
    assert poller.age_s(DIR_URL) == 0
    clock.now += 300
    for broken in (FetchResult(503, b"", None), FetchResult(200, b"not json", None), TypeError("bug")):
        fetch.answers[REV_URL] = broken
        assert not await poller.poll_once(DIR_URL, REV_URL)
        assert poller.revoked(DIR_URL) == {KEY.thumbprint}
    assert poller.age_s(DIR_URL) == 300
    assert list(poller.ages()) == [300]
    await poller.close()


async def test_a_list_never_fetched_fails_closed_and_is_retried_after_retry_s() -> None:
    clock, fetch = Clock(), FakeFetch()
    fetch.answers[REV_URL] = FetchResult(503, b"", None)
    poller = RevocationPoller(fetch, clock=clock, sleep=never_wakes, retry_s=30)
    for _ in range(3):
        with pytest.raises(DirectoryError) as err:
            await poller.ensure(DIR_URL, REV_URL)
        assert err.value.reason == "revocation-unavailable"
    assert len(fetch.calls) == 1  # not a fetch per request
    assert list(poller.ages()) == [None]
    clock.now += 30
    fetch.answers[REV_URL] = listing()
    assert await poller.ensure(DIR_URL, REV_URL) == frozenset()
    assert len(fetch.calls) == 2
    await poller.close()


async def test_a_set_is_charged_to_its_directory_and_leaves_with_it() -> None:
    clock, fetch = Clock(), FakeFetch()
    body = render_directory(Directory((DirectoryKey(KEY.public, NOW - 10, NOW + 3600),), REV_URL))
    fetch.answers[DIR_URL] = FetchResult(200, body, None)
    fetch.answers[REV_URL] = listing(OTHER.thumbprint)
    resolver = DirectoryResolver(fetch, clock=clock, max_entries=1)
    poller = RevocationPoller(fetch, clock=clock, sleep=never_wakes)
    poller.attach(resolver)
    await resolver.get("https://agent.example")
    await poller.ensure(DIR_URL, REV_URL)
    assert resolver.cached_bytes == len(body) * PARSED_COST_FACTOR + REVOKED_ENTRY_COST  # in-memory costs
    fetch.answers[directory_url("https://b.example")] = FetchResult(
        200, render_directory(Directory(())), None
    )
    await resolver.get("https://b.example")  # evicts the first directory (one entry at most)
    await asyncio.sleep(0)
    assert (len(poller), poller.pollers()) == (0, 0)
    await poller.close()


async def test_lists_up_to_the_per_directory_bound_are_read_and_longer_or_larger_ones_fail_closed() -> None:
    now = int(time.time())
    many = thumbprints(MAX_REVOKED_PER_DIRECTORY + 1, "many")
    full = render_revocation_list(RevocationList(now, frozenset(many[:-1])))
    over = render_revocation_list(RevocationList(now, frozenset(many)))  # one thumbprint too many
    padded = full[:-1] + b" " * (MAX_REVOCATION_LIST_BYTES - len(full) + 1) + b"}"  # one byte too many
    key = SigningKey.from_seed(bytes(range(32)))
    async with host() as found, HttpClient.standalone() as client:
        found.directory(directory_doc(key, now=now, revocation_url=f"{found.base}/r.json"))
        fields = signed(f'"{found.base}"', key, now=now)
        for body, verdict in (
            (full, "accepted"),
            (over, "revocation-unavailable"),
            (padded, "revocation-unavailable"),
        ):
            found.serve("/r.json", body)
            verifier = build_verifier(client=client, egress=LOOPBACK)
            try:
                assert (await verifier.verify("POST", TARGET, fields, BODY)).agent.keyid == key.thumbprint
                got = "accepted"
            except VerificationError as exc:
                got = exc.reason
            await verifier.close()
            assert got == verdict


def test_one_directory_holds_at_most_a_quarter_of_either_shared_store() -> None:
    """A list of 91,180 thumbprints (what 4 MiB holds) was charged 14.6 MB: more than the directory
    cache (8 MiB) and the sets kept aside (4 MiB then), so one stranger's list emptied both. Every
    list our own key store can publish still passes."""
    assert MAX_REVOKED_PER_DIRECTORY >= MAX_REVOKED_THUMBPRINTS
    most = MAX_REVOKED_PER_DIRECTORY * REVOKED_ENTRY_COST
    assert DIRECTORY_SHARE * (most + RETIRED_SET_COST + MAX_URL_CHARS) <= RETIRED_BYTES
    assert DIRECTORY_SHARE * (most + MAX_DIRECTORY_BYTES * PARSED_COST_FACTOR) <= CACHE_BYTES
    listed = thumbprints(MAX_REVOKED_PER_DIRECTORY + 1, "x")
    full = frozenset(listed[1:])
    assert parse_bounded_list(render_revocation_list(RevocationList(NOW, full))).revoked == full
    with pytest.raises(KeyFormatError) as err:
        parse_bounded_list(render_revocation_list(RevocationList(NOW, frozenset(listed))))
    assert err.value.reason == "revocation-list-too-large"


async def test_a_forgotten_directory_frees_its_set_without_waiting_for_the_cycle_collector(
    no_cycle_collector: None,
) -> None:
    """The poller's task, once cancelled, holds its frame and the frame the state: had the state kept
    the task, every evicted set would wait for a full collection (a hostile run grew by ~40 MiB)."""
    clock, fetch = Clock(), FakeFetch()
    fetch.answers[REV_URL] = listing(OTHER.thumbprint)
    poller = RevocationPoller(fetch, clock=clock, sleep=never_wakes)
    await poller.ensure(DIR_URL, REV_URL)
    await asyncio.sleep(0)  # the periodic poller is waiting in its sleep
    gc.collect()
    before = live_states()  # ours, and any other test's still in memory
    poller.forget(DIR_URL)
    for _ in range(3):
        await asyncio.sleep(0)  # the cancellation runs
    assert live_states() == before - 1, "the forgotten state is only freed by the cycle collector"
    await poller.close()


def revoked_agent_with_a_one_entry_cache() -> tuple[
    FakeFetch, DirectoryResolver, RevocationPoller, RequestVerifier, Fields
]:
    """The agent's directory lists KEY as revoked; one cached directory at most, so fetching
    ``https://b.example`` (an empty directory) pushes the agent's out. A request signed by KEY."""
    clock, fetch = Clock(), FakeFetch()
    body = render_directory(Directory((DirectoryKey(KEY.public, NOW - 10, NOW + 3600),), REV_URL))
    fetch.answers[DIR_URL] = FetchResult(200, body, None)
    fetch.answers[REV_URL] = listing(KEY.thumbprint)
    fetch.answers[directory_url("https://b.example")] = FetchResult(
        200, render_directory(Directory(())), None
    )
    resolver = DirectoryResolver(fetch, clock=clock, max_entries=1)
    poller = RevocationPoller(fetch, clock=clock, sleep=never_wakes)
    verifier = RequestVerifier(resolver, revocations=poller, clock=clock)
    return fetch, resolver, poller, verifier, signed('"https://agent.example"', KEY, now=NOW)


async def test_a_revoked_thumbprint_stays_revoked_after_its_directory_left_the_cache_and_came_back() -> None:
    # spec "States and transitions": "A revoked thumbprint stays revoked". Strangers' directories can
    # push a directory out of the cache; its later list omitting the key must not bring the key back
    fetch, resolver, poller, verifier, request = revoked_agent_with_a_one_entry_cache()
    for _ in range(2):
        with pytest.raises(VerificationError) as err:
            await verifier.verify("POST", TARGET, request, BODY)
        assert err.value.reason == "key-revoked"
        fetch.answers[REV_URL] = listing(as_of=NOW + 300)  # the directory's later list omits the key
        await resolver.get("https://b.example")  # and strangers push the directory out of the cache
        await asyncio.sleep(0)
        assert poller.revoked(DIR_URL) == {KEY.thumbprint}  # kept aside while out of the cache
    assert fetch.calls.count(REV_URL) == 2  # each time back: its list fetched before its keys count
    await verifier.close()


async def test_sets_kept_aside_are_bounded() -> None:
    poller = RevocationPoller(FakeFetch())
    for n in range(RETIRED_DIRECTORIES + 10):
        url = f"https://d{n}.example/.well-known/http-message-signatures-directory"
        poller._states[url] = _State(REV_URL, current=RevocationList(NOW, frozenset({KEY.thumbprint})))
        poller.forget(url)
    assert len(poller._retired) == RETIRED_DIRECTORIES  # the oldest went first
    assert "https://d0.example/.well-known/http-message-signatures-directory" not in poller._retired
    poller._states[DIR_URL] = _State(REV_URL, current=RevocationList(NOW, frozenset()))
    poller.forget(DIR_URL)  # an empty set: nothing to keep
    assert DIR_URL not in poller._retired
    await poller.close()


def thumbprints(n: int, tag: str) -> list[str]:
    """``n`` distinct canonical thumbprints (base64url SHA-256 values) derived from ``tag``."""
    return [
        base64.urlsafe_b64encode(hashlib.sha256(f"{tag}/{i}".encode()).digest()).rstrip(b"=").decode()
        for i in range(n)
    ]


async def test_what_sets_kept_aside_hold_stays_near_their_bound_whatever_the_urls() -> None:
    """Each set kept aside was charged for its thumbprints only: 4,096 one-thumbprint sets of
    directories with 2,000-character URLs were charged 640 KiB and held 10.4 MiB."""
    poller = RevocationPoller(FakeFetch())
    with held_after() as held:
        for n in range(RETIRED_DIRECTORIES):
            url = f"https://d{n}.example/.well-known/http-message-signatures-directory?{'q' * 2000}"
            one = frozenset(thumbprints(1, str(n)))
            poller._states[url] = _State(REV_URL, current=RevocationList(NOW, one))
            poller.forget(url)
    assert poller._retired.bytes <= RETIRED_BYTES
    assert held.bytes < 1.5 * RETIRED_BYTES  # 10.4 MiB when only thumbprints were charged
    await poller.close()


async def test_sets_kept_aside_are_charged_per_thumbprint_and_large_ones_push_the_oldest_out() -> None:
    """A set kept aside is charged REVOKED_ENTRY_COST per thumbprint against RETIRED_BYTES."""
    clock, fetch = Clock(), FakeFetch()
    resolver = DirectoryResolver(fetch, clock=clock, max_entries=1)
    poller = RevocationPoller(fetch, clock=clock, sleep=never_wakes)
    poller.attach(resolver)
    per_set = MAX_REVOKED_PER_DIRECTORY  # the largest one directory holds: DIRECTORY_SHARE fit, one more not
    charged = per_set * REVOKED_ENTRY_COST + RETIRED_SET_COST
    bases = [f"https://d{n:02}.example" for n in range(DIRECTORY_SHARE + 3)]
    url_chars = len(directory_url(bases[0]))
    assert DIRECTORY_SHARE * (charged + url_chars) <= RETIRED_BYTES < (DIRECTORY_SHARE + 1) * charged
    for base in bases:
        revocations = f"{base}/revoked.json"
        fetch.answers[directory_url(base)] = FetchResult(
            200, render_directory(Directory((), revocations)), None
        )
        fetch.answers[revocations] = listing(*thumbprints(per_set, base))
        await resolver.get(base)  # evicts the previous directory (one entry at most): its set goes aside
        assert len(await poller.ensure(directory_url(base), revocations)) == per_set
    kept = bases[-1 - DIRECTORY_SHARE : -1]  # the last one is still cached; the oldest went
    assert list(poller._retired) == [directory_url(base) for base in kept]
    assert poller._retired.bytes == DIRECTORY_SHARE * (charged + url_chars)
    await poller.close()


async def test_a_returning_directory_takes_its_kept_set_out_of_the_aside_store_as_its_current_set() -> None:
    """A directory back in the cache pops its kept set and holds it before its fresh list arrives."""
    fetch, resolver, poller, verifier, request = revoked_agent_with_a_one_entry_cache()
    with pytest.raises(VerificationError) as err:
        await verifier.verify("POST", TARGET, request, BODY)
    assert err.value.reason == "key-revoked"
    await resolver.get("https://b.example")  # strangers push the directory out of the cache
    assert DIR_URL in poller._retired
    await resolver.get("https://agent.example")  # it comes back
    fetch.answers[REV_URL] = listing(as_of=NOW + 300)  # and its later list omits the key
    fetch.gate = asyncio.Event()  # that list is slow to arrive
    pending = asyncio.create_task(verifier.verify("POST", TARGET, request, BODY))
    for _ in range(100):
        if fetch.calls.count(REV_URL) == 2:
            break
        await asyncio.sleep(0)
    assert fetch.calls.count(REV_URL) == 2, "the list of the returning directory is not being fetched"
    assert poller.revoked(DIR_URL) == frozenset({KEY.thumbprint})  # the kept set is its current one
    assert DIR_URL not in poller._retired  # popped: held once, not also kept aside
    assert poller._retired.bytes == 0
    fetch.gate.set()
    with pytest.raises(VerificationError) as err:
        await asyncio.wait_for(pending, 5)
    assert err.value.reason == "key-revoked"
    await verifier.close()


async def test_a_revoked_thumbprint_stays_revoked_when_its_directory_stops_naming_a_list() -> None:
    """The spec lets a directory drop ``revocation_url`` (rotation and not_after then rule); a key
    its list once revoked must not come back with the same directory, listed and unrevoked."""
    fetch, resolver, _, verifier, request = revoked_agent_with_a_one_entry_cache()
    with pytest.raises(VerificationError) as first:
        await verifier.verify("POST", TARGET, request, BODY)
    assert first.value.reason == "key-revoked"
    plain = render_directory(Directory((DirectoryKey(KEY.public, NOW - 10, NOW + 3600),)))
    fetch.answers[DIR_URL] = FetchResult(200, plain, None)  # the same key, and no list named
    assert isinstance(resolver.clock, Clock)
    resolver.clock.now += 400  # the cached directory expires: the new one is fetched
    with pytest.raises(VerificationError) as again:
        await verifier.verify("POST", TARGET, signed('"https://agent.example"', KEY, now=NOW + 400), BODY)
    assert again.value.reason == "key-revoked"
    await verifier.close()


@pytest.mark.parametrize(
    "spelling",
    [
        '"https://agent.example:443"',
        "https://AGENT.Example/",
        "https://agent.example:443/",
        "https://agent.example/%7e/..",  # refused: no '..' segment in a base
    ],
)
async def test_a_revoked_thumbprint_stays_revoked_whatever_the_spelling_of_its_directory(
    spelling: str,
) -> None:
    """Each spelling of one directory was a directory of its own, with a fresh revocation state: once
    the list stopped naming KEY (which the directory still listed), KEY was refused as
    ``https://agent.example`` and accepted, as that directory, when spelled with ``:443``."""
    fetch, _, poller, verifier, request = revoked_agent_with_a_one_entry_cache()
    with pytest.raises(VerificationError) as first:
        await verifier.verify("POST", TARGET, request, BODY)
    assert first.value.reason == "key-revoked"
    fetch.answers[REV_URL] = listing(as_of=NOW + 300)  # the list's next snapshot omits KEY
    assert await poller.poll_once(DIR_URL, REV_URL)
    with pytest.raises(VerificationError) as other:
        await verifier.verify("POST", TARGET, signed(spelling, KEY, now=NOW), BODY)
    assert other.value.reason == ("malformed-signature-agent" if ".." in spelling else "key-revoked")
    assert fetch.calls.count(DIR_URL) == 1  # one directory, fetched once, whatever its spelling
    await verifier.close()


async def test_every_spelling_of_a_directory_verifies_as_its_one_identity() -> None:
    clock, fetch = Clock(), FakeFetch()
    body = render_directory(Directory((DirectoryKey(KEY.public, NOW - 10, NOW + 3600),)))
    fetch.answers[DIR_URL] = FetchResult(200, body, None)
    verifier = RequestVerifier(DirectoryResolver(fetch, clock=clock), clock=clock)
    for spelling in ('"https://agent.example:443/"', "https://Agent.EXAMPLE", "https://agent.example/"):
        stack = await verifier.verify("POST", TARGET, signed(spelling, KEY, now=NOW), BODY)
        assert stack.directory == "https://agent.example"
        assert stack.signature_agent == spelling  # the header as signed
    assert fetch.calls == [DIR_URL]
    await verifier.close()


BROKER = SigningKey.from_seed(bytes([7]) * 32)
BROKER_A, BROKER_B = "https://broker-a.example", "https://broker-b.example"


@pytest.mark.parametrize("order", [(BROKER_B, BROKER_A), (BROKER_A, BROKER_B)])
async def test_a_broker_key_two_directories_list_is_refused_whatever_their_order(
    order: tuple[str, str],
) -> None:
    """Broker B revoked its key; broker A's directory lists the same key, with no list. Taken from the
    first directory that listed it, the verdict hung on the configuration's order: A's directory
    hid B's revocation and took the credit for B's signature."""
    clock, fetch = Clock(), FakeFetch()
    window = (NOW - 10, NOW + 3600)
    fetch.answers[DIR_URL] = FetchResult(
        200, render_directory(Directory((DirectoryKey(KEY.public, *window),))), None
    )
    revoking = Directory((DirectoryKey(BROKER.public, *window),), BROKER_B + "/revoked.json")
    fetch.answers[directory_url(BROKER_B)] = FetchResult(200, render_directory(revoking), None)
    fetch.answers[BROKER_B + "/revoked.json"] = listing(BROKER.thumbprint)
    listing_too = Directory((DirectoryKey(BROKER.public, *window),))
    fetch.answers[directory_url(BROKER_A)] = FetchResult(200, render_directory(listing_too), None)
    resolver = DirectoryResolver(fetch, clock=clock)
    verifier = RequestVerifier(resolver, VerifierPolicy(broker_directories=order), clock=clock)
    fields = signed('"https://agent.example"', KEY, now=NOW)
    message = Message("POST", parse_absolute_uri(TARGET), fields)
    hop = sign_message(
        message, BROKER, created=NOW, expires=NOW + 60, label="broker", components=hop_components("agent")
    )
    attach_signature(fields, hop)
    with pytest.raises(VerificationError) as caught:
        await verifier.verify("POST", TARGET, fields, BODY)
    assert (caught.value.reason, caught.value.label) == ("ambiguous-key", "broker")
    await verifier.close()


async def test_the_window_is_checked_again_after_the_keys_were_fetched() -> None:
    """The directory took 4 s: the signature (expires in 1 s) ended while its key was fetched."""
    clock, fetch = Clock(), FakeFetch()
    body = render_directory(Directory((DirectoryKey(KEY.public, NOW - 10, NOW + 3600),)))
    fetch.answers[DIR_URL] = FetchResult(200, body, None)

    async def slow(url: str) -> FetchResult:
        clock.now += 4.0
        return await fetch(url)

    verifier = RequestVerifier(DirectoryResolver(slow, clock=clock), clock=clock)
    request = signed('"https://agent.example"', KEY, now=NOW, created=NOW - 2, expires=NOW + 1)
    with pytest.raises(VerificationError) as caught:
        await verifier.verify("POST", TARGET, request, BODY)
    assert caught.value.reason == "signature-expired"
    await verifier.close()


async def test_strangers_lists_never_push_out_what_a_configured_directorys_list_revoked() -> None:
    """The sets kept aside share one bounded store: a few strangers' long lists push the others out
    (five of a quarter each). A configured directory's set went with them, so after its list stopped
    naming a key it had revoked, strangers could bring that key back. It is now kept apart; a
    stranger's directory (here ``agent.example``'s twin, not configured) still shares the store."""
    clock, fetch = Clock(), FakeFetch()
    poller = RevocationPoller(fetch, clock=clock, sleep=never_wakes)
    poller.configure([DIR_URL])  # as the verifiers do for brokers, issuers and exchanges
    twin, twin_list = "https://twin.example/d", "https://twin.example/revoked.json"
    fetch.answers[REV_URL] = listing(KEY.thumbprint)
    fetch.answers[twin_list] = listing(KEY.thumbprint)
    for url, revocations in ((DIR_URL, REV_URL), (twin, twin_list)):
        assert await poller.poll_once(url, revocations)
        poller.forget(url)  # both left the cache: their sets are kept aside
    for n in range(DIRECTORY_SHARE + 2):  # strangers' directories with lists as long as allowed
        url, revocations = f"https://s{n}.example/d", f"https://s{n}.example/revoked.json"
        fetch.answers[revocations] = listing(*thumbprints(MAX_REVOKED_PER_DIRECTORY, f"s{n}"))
        assert await poller.poll_once(url, revocations)
        poller.forget(url)
    assert poller.revoked(twin) == frozenset()  # a stranger's set: pushed out of the bounded store
    assert poller.revoked(DIR_URL) == {KEY.thumbprint}  # the configured directory's: kept
    fetch.answers[REV_URL] = listing(as_of=NOW + 300)  # back, and its list no longer names KEY
    assert await poller.poll_once(DIR_URL, REV_URL)
    assert poller.revoked(DIR_URL) == {KEY.thumbprint}  # still revoked
    await poller.close()


def test_the_verifiers_configure_the_directories_their_operator_named() -> None:
    """Brokers (relay, gateway), trusted issuers (gateway) and exchanges (delivery)."""
    resolver = DirectoryResolver(FakeFetch())
    verifier = RequestVerifier(resolver, VerifierPolicy(broker_directories=("https://broker.example",)))
    poller = verifier.revocations
    assert poller is not None
    IssuerKeys(
        resolver, poller, LOOPBACK, trusted={"urn:owner": IssuerAnchor(directory="https://issuer.example")}
    )
    DeliveryVerifier(verifier, DeliveryPolicy(exchange_directories=("https://exchange.example",)))
    named = ("https://broker.example", "https://issuer.example", "https://exchange.example")
    assert poller.configured == {directory_url(base) for base in named}
