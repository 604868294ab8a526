"""The delivery-side check of a bound retrieval fetch (``verify.delivery``, spec "Bound retrieval
URLs" 3): the URL's signature by the exchange (pinned or from its directory), the presented key,
thumbprint(presented key) == agent_id, and the fetcher's RFC 9421 signature; never the fetcher's
directory. Each refusal names its stable reason."""

from __future__ import annotations

import ssl
from collections.abc import Sequence

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from signing_proxy.core.digest import content_digest
from signing_proxy.core.errors import VerificationError
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import PublicKey, SigningKey
from signing_proxy.core.keys import (
    Directory,
    DirectoryKey,
    RevocationList,
    render_directory,
    render_revocation_list,
)
from signing_proxy.core.retrieval import sign_retrieval_url
from signing_proxy.core.signature_key import RETRIEVAL_COMPONENTS, signature_key_member
from signing_proxy.core.signatures import (
    SPEC_COMPONENTS,
    Component,
    Message,
    attach_signature,
    hop_components,
    sign_message,
)
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.verify import (
    DeliveryPolicy,
    DeliveryVerifier,
    DirectoryResolver,
    FetchResult,
    RequestVerifier,
    verify_delivery_request,
)
from signing_proxy.verify.cache import TokenBucket
from signing_proxy.verify.directory import directory_url
from tests.oracle import oracle_verify
from tests.verify.fakes import NOW, Clock, FakeFetch

EXCHANGE = SigningKey.from_seed(b"\x41" * 32)
AGENT = SigningKey.from_seed(b"\x42" * 32)
OTHER = SigningKey.from_seed(b"\x43" * 32)
ROTATED = SigningKey.from_seed(b"\x44" * 32)
EXCHANGE_BASE = "https://exchange.example"
REVOCATIONS = "https://exchange.example/revoked.json"


def bound_url(agent: SigningKey = AGENT, *, expires: int = NOW + 600, key: SigningKey = EXCHANGE) -> str:
    return sign_retrieval_url(
        "https://cdn.example/objects/42", key, agent_id=agent.thumbprint, expires=expires
    )


def fetch(
    url: str,
    signer: SigningKey = AGENT,
    *,
    presented: PublicKey | None = None,
    components: Sequence[Component] = RETRIEVAL_COMPONENTS,
    relay: SigningKey | None = None,
) -> Fields:
    """A GET of ``url`` as the proxy sends it: signed by ``signer``, presenting ``presented``."""
    fields = Fields([("Content-Digest", content_digest(b"")), ("Authorization", ""), ("Signature-Agent", "")])
    fields.add("Signature-Key", signature_key_member("agent", presented or signer.public))
    message = Message("GET", parse_absolute_uri(url), fields)
    attach_signature(
        fields, sign_message(message, signer, created=NOW, expires=NOW + 300, components=components)
    )
    if relay is not None:  # a relay hop after the fetcher: provenance only at the delivery endpoint
        member = sign_message(
            message, relay, created=NOW, expires=NOW + 300, label="relay", components=hop_components("agent")
        )
        attach_signature(fields, member)
    return fields


def delivery(
    *,
    pinned: tuple[PublicKey, ...] = (EXCHANGE.public,),
    directories: tuple[str, ...] = (),
    fake: FakeFetch | None = None,
    clock: Clock | None = None,
    budget: TokenBucket | None = None,
) -> DeliveryVerifier:
    clock = clock or Clock()
    resolver = DirectoryResolver(fake or FakeFetch(), clock=clock, fetch_budget=budget)
    policy = DeliveryPolicy(exchange_directories=directories, pinned_exchange_keys=pinned)
    return DeliveryVerifier(RequestVerifier(resolver, clock=clock), policy)


def serve_directory(fake: FakeFetch, *keys: SigningKey, revoked: frozenset[str] = frozenset()) -> None:
    directory = Directory(tuple(DirectoryKey(k.public, NOW - 60, NOW + 3600) for k in keys), REVOCATIONS)
    fake.answers[directory_url(EXCHANGE_BASE)] = FetchResult(200, render_directory(directory), "max-age=300")
    fake.answers[REVOCATIONS] = FetchResult(200, render_revocation_list(RevocationList(NOW, revoked)), None)


async def refused(verifier: DeliveryVerifier, url: str, fields: Fields) -> str:
    with pytest.raises(VerificationError) as info:
        await verifier.verify("GET", url, fields, b"")
    return info.value.reason


# --- accepted -----------------------------------------------------------------------------------


async def test_the_transactions_key_presenting_itself_is_accepted_with_a_pinned_exchange_key() -> None:
    url = bound_url()
    fields = fetch(url)
    verified = await delivery().verify("GET", url, fields, b"")
    assert (verified.agent_id, verified.exchange_keyid, verified.exchange_source) == (
        AGENT.thumbprint,
        EXCHANGE.thumbprint,
        "pinned",
    )
    assert verified.signature.keyid == AGENT.thumbprint
    assert '"signature-key"' in verified.signature.components
    # an independent RFC 9421 implementation agrees (six components, the fifth and sixth headers included)
    assert oracle_verify(
        "GET", url, list(fields), b"", {AGENT.thumbprint: AGENT.public.key}, check_time=False
    ) == ["agent"]


async def test_the_exchange_key_comes_from_its_directory_and_the_fetchers_is_never_fetched() -> None:
    fake = FakeFetch()
    serve_directory(fake, EXCHANGE)
    verifier = delivery(pinned=(), directories=(EXCHANGE_BASE,), fake=fake)
    url = bound_url()
    verified = await verifier.verify("GET", url, fetch(url), b"")
    assert verified.exchange_source == EXCHANGE_BASE
    assert fake.calls == [directory_url(EXCHANGE_BASE), REVOCATIONS]  # the exchange's only
    await verifier.close()


async def test_a_relay_label_after_the_fetchers_is_not_what_is_checked() -> None:
    url = bound_url()
    verified = await delivery().verify("GET", url, fetch(url, relay=OTHER), b"")
    assert verified.signature.label == "agent"


# --- refused ------------------------------------------------------------------------------------


async def test_a_fetch_presenting_another_key_is_refused_before_any_io() -> None:
    fake = FakeFetch()
    verifier = delivery(pinned=(), directories=(EXCHANGE_BASE,), fake=fake)
    url = bound_url()
    assert await refused(verifier, url, fetch(url, OTHER)) == "presented-key-mismatch"
    assert fake.calls == []


async def test_presenting_the_bound_key_while_signing_with_another_is_refused() -> None:
    url = bound_url()
    assert await refused(delivery(), url, fetch(url, OTHER, presented=AGENT.public)) == "unknown-keyid"


async def test_a_presented_key_the_signature_does_not_cover_is_refused() -> None:
    url = bound_url()
    assert (
        await refused(delivery(), url, fetch(url, components=SPEC_COMPONENTS)) == "missing-covered-component"
    )


async def test_a_presented_key_swapped_after_signing_is_refused() -> None:
    url = bound_url(OTHER)
    fields = fetch(url, AGENT)  # AGENT signs, presenting itself ...
    fields.set("Signature-Key", signature_key_member("agent", OTHER.public))  # ... then OTHER is swapped in
    forged = fields.combined("Signature-Input") or ""
    fields.set("Signature-Input", forged.replace(AGENT.thumbprint, OTHER.thumbprint))
    assert await refused(delivery(), url, fields) == "bad-signature"


async def test_a_fetch_without_signature_key_is_refused() -> None:
    url = bound_url()
    fields = fetch(url)
    fields.remove("signature-key")
    assert await refused(delivery(), url, fields) == "signature-key-missing"


async def test_an_expired_url_is_refused() -> None:
    clock = Clock()
    url = bound_url(expires=NOW + 10)
    clock.now = NOW + 10
    assert await refused(delivery(clock=clock), url, fetch(url)) == "retrieval-url-expired"


async def test_a_url_rebound_to_another_key_is_refused() -> None:
    url = bound_url().replace(AGENT.thumbprint, OTHER.thumbprint)
    assert await refused(delivery(), url, fetch(url, OTHER)) == "retrieval-url-bad-signature"


async def test_an_unbound_url_is_refused() -> None:
    url = "https://cdn.example/objects/42?sig=" + "A" * 86
    assert await refused(delivery(), url, fetch(url)) == "malformed-retrieval-url"


async def test_a_url_signed_by_an_unknown_exchange_is_refused() -> None:
    url = bound_url(key=OTHER)
    assert await refused(delivery(), url, fetch(url)) == "retrieval-url-unknown-key"


async def test_an_unreachable_exchange_directory_is_reported_as_such() -> None:
    fake = FakeFetch()
    fake.answers[directory_url(EXCHANGE_BASE)] = FetchResult(503, b"", None)
    verifier = delivery(pinned=(), directories=(EXCHANGE_BASE,), fake=fake)
    url = bound_url()
    assert await refused(verifier, url, fetch(url)) == "directory-unavailable"
    await verifier.close()


async def test_a_url_signed_by_a_revoked_exchange_key_is_refused() -> None:
    fake = FakeFetch()
    serve_directory(fake, EXCHANGE, revoked=frozenset({EXCHANGE.thumbprint}))
    verifier = delivery(pinned=(), directories=(EXCHANGE_BASE,), fake=fake)
    url = bound_url()
    assert await refused(verifier, url, fetch(url)) == "retrieval-url-key-revoked"
    await verifier.close()


async def test_a_revoked_exchange_key_stays_revoked_when_the_directory_stops_naming_a_list() -> None:
    """spec "A revoked thumbprint stays revoked": the delivery verifier asked the list only while
    the directory named one, so a directory re-served without ``revocation_url`` brought K back."""
    clock, fake = Clock(), FakeFetch()
    serve_directory(fake, EXCHANGE, revoked=frozenset({EXCHANGE.thumbprint}))
    listed = fake.answers[directory_url(EXCHANGE_BASE)]
    assert isinstance(listed, FetchResult)
    fake.answers[directory_url(EXCHANGE_BASE)] = FetchResult(200, listed.body, "max-age=60")
    verifier = delivery(pinned=(), directories=(EXCHANGE_BASE,), fake=fake, clock=clock)
    url = bound_url()
    assert await refused(verifier, url, fetch(url)) == "retrieval-url-key-revoked"
    unlisted = Directory((DirectoryKey(EXCHANGE.public, NOW - 60, NOW + 3600),))  # K, and no list named
    fake.answers[directory_url(EXCHANGE_BASE)] = FetchResult(200, render_directory(unlisted), "max-age=60")
    clock.now += 100  # the cached directory expires (the signature does not): the new one is fetched
    assert await refused(verifier, url, fetch(url)) == "retrieval-url-key-revoked"
    assert fake.calls.count(directory_url(EXCHANGE_BASE)) == 2
    await verifier.close()


async def test_a_web_bot_auth_signature_covering_only_the_authority_is_refused() -> None:
    """A bound fetch is the spec's profile: a web-bot-auth label would not bind the URL or the body."""
    url = bound_url()
    fields = Fields([("Signature-Agent", "")])
    fields.add("Signature-Key", signature_key_member("agent", AGENT.public))
    message = Message("GET", parse_absolute_uri(url), fields)
    member = sign_message(
        message,
        AGENT,
        created=NOW,
        expires=NOW + 300,
        components=(Component("@authority"),),
        extra_params=(("tag", "web-bot-auth"),),
    )
    attach_signature(fields, member)
    fields.remove("signature-agent")
    assert await refused(delivery(), url, fields) == "unsupported-tag"


# --- the fetch budget ---------------------------------------------------------------------------


async def test_a_configured_exchanges_directory_is_fetched_without_budget() -> None:
    """A configured exchange's directory is fetched without a token of the fetch budget."""
    clock, fake = Clock(), FakeFetch()
    serve_directory(fake, EXCHANGE)
    budget = TokenBucket(0.001, 1, clock)
    assert budget.take()  # none left
    verifier = delivery(pinned=(), directories=(EXCHANGE_BASE,), fake=fake, clock=clock, budget=budget)
    url = bound_url()
    verified = await verifier.verify("GET", url, fetch(url), b"")
    assert verified.exchange_source == EXCHANGE_BASE
    assert fake.calls == [directory_url(EXCHANGE_BASE), REVOCATIONS]
    await verifier.close()


async def test_a_configured_exchanges_keyid_refetch_spends_no_budget() -> None:
    """A URL signed by a key a configured exchange rotated in re-fetches its directory without a token."""
    clock, fake = Clock(), FakeFetch()
    serve_directory(fake, EXCHANGE)
    budget = TokenBucket(0.001, 1, clock)
    verifier = delivery(pinned=(), directories=(EXCHANGE_BASE,), fake=fake, clock=clock, budget=budget)
    url = bound_url()
    await verifier.verify("GET", url, fetch(url), b"")
    assert budget.take()  # none left
    serve_directory(fake, EXCHANGE, ROTATED)  # the exchange rotated a key in
    clock.now += 30  # past the keyid re-fetch interval; 0.03 token refilled: the budget is empty
    url = bound_url(key=ROTATED)
    verified = await verifier.verify("GET", url, fetch(url), b"")
    assert (verified.exchange_keyid, verified.exchange_source) == (ROTATED.thumbprint, EXCHANGE_BASE)
    assert fake.calls.count(directory_url(EXCHANGE_BASE)) == 2
    await verifier.close()


# --- several exchange directories ---------------------------------------------------------------

EXCHANGE_A, EXCHANGE_B = "https://a-exchange.example", "https://b-exchange.example"


def serve_exchange(fake: FakeFetch, base: str, *, revoked: frozenset[str] = frozenset()) -> None:
    """``base``'s directory lists EXCHANGE's key; its own list revokes ``revoked``."""
    revocations = f"{base}/revoked.json"
    directory = Directory((DirectoryKey(EXCHANGE.public, NOW - 60, NOW + 3600),), revocations)
    fake.answers[directory_url(base)] = FetchResult(200, render_directory(directory), "max-age=300")
    fake.answers[revocations] = FetchResult(200, render_revocation_list(RevocationList(NOW, revoked)), None)


@pytest.mark.parametrize("order", [(EXCHANGE_A, EXCHANGE_B), (EXCHANGE_B, EXCHANGE_A)])
@pytest.mark.parametrize("b_revokes", [True, False], ids=["b-revoked-it", "none-revoked-it"])
async def test_a_key_two_exchange_directories_list_is_refused_whatever_their_order(
    order: tuple[str, str], b_revokes: bool
) -> None:
    """Exchange B revoked its key; exchange A's directory lists the same key and revokes nothing.
    The key was taken from the first configured directory that listed it: with A first, A hid B's
    revocation and the URL was accepted as A's. As for brokers, a key that two list is no one's."""
    fake = FakeFetch()
    serve_exchange(fake, EXCHANGE_B, revoked=frozenset({EXCHANGE.thumbprint}) if b_revokes else frozenset())
    serve_exchange(fake, EXCHANGE_A)
    verifier = delivery(pinned=(), directories=order, fake=fake)
    url = bound_url()
    assert await refused(verifier, url, fetch(url)) == "ambiguous-key"
    await verifier.close()


async def test_one_exchange_directory_configured_in_two_spellings_is_one_directory() -> None:
    fake = FakeFetch()
    serve_exchange(fake, EXCHANGE_A)
    verifier = delivery(pinned=(), directories=(EXCHANGE_A, EXCHANGE_A.upper() + ":443/"), fake=fake)
    url = bound_url()
    assert (await verifier.verify("GET", url, fetch(url), b"")).exchange_source == EXCHANGE_A
    await verifier.close()


async def test_a_key_one_of_two_exchange_directories_lists_is_that_exchanges() -> None:
    fake = FakeFetch()
    serve_exchange(fake, EXCHANGE_B, revoked=frozenset({EXCHANGE.thumbprint}))
    fake.answers[directory_url(EXCHANGE_A)] = FetchResult(200, render_directory(Directory(())), None)
    verifier = delivery(pinned=(), directories=(EXCHANGE_A, EXCHANGE_B), fake=fake)
    url = bound_url()
    assert await refused(verifier, url, fetch(url)) == "retrieval-url-key-revoked"
    await verifier.close()


def as_sent(url: str, fields: Fields, host: str) -> web.Request:
    """The GET of ``url`` as an aiohttp delivery endpoint behind TLS receives it, with ``Host``."""
    target = parse_absolute_uri(url)
    lines = [("Host", host), *((n, v) for n, v in fields if n.lower() != "host")]
    return make_mocked_request(
        "GET", target.path_query, headers=CIMultiDict(lines), sslcontext=ssl.create_default_context()
    )


async def test_a_delivery_endpoint_answers_only_for_its_names() -> None:
    """A retrieval signed for another origin does not pass: the endpoint builds its origin from
    Host only for the names it answers for (loopback unless told: ``hosts``)."""
    url = bound_url()
    verifier = delivery()
    with pytest.raises(VerificationError) as refused:
        await verify_delivery_request(verifier, as_sent(url, fetch(url), "cdn.example"))
    assert refused.value.reason == "misdirected-request"
    verified = await verify_delivery_request(
        verifier, as_sent(url, fetch(url), "cdn.example"), hosts=["cdn.example"]
    )
    assert verified.agent_id == AGENT.thumbprint
