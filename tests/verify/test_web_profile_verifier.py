"""The request verifier with web-bot-auth stacks: the key found through the directory the covered
Signature-Agent member names, a directory whose possession proofs fail for a key leaving that key
out, and a stack mixing profiles refused before any fetch."""

from __future__ import annotations

import json
import time

import pytest

from signing_proxy.core.digest import content_digest
from signing_proxy.core.directory_proof import sign_directory_response
from signing_proxy.core.errors import VerificationError
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import Directory, DirectoryKey, parse_directory, render_directory
from signing_proxy.core.profiles import (
    WEB_BOT_AUTH,
    profile_components,
    profile_params,
    signature_agent_field,
)
from signing_proxy.core.signatures import Component, Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.verify import (
    DirectoryResolver,
    FetchResult,
    RequestVerifier,
    VerifierPolicy,
    directory_url,
    stack_summary,
)
from signing_proxy.verify.directory import only_proven
from tests.conftest import VECTORS
from tests.verify.fakes import FakeFetch

AGENT = SigningKey.generate()
AGENT_DIR = "https://agent.example"
URL = "https://shop.example/cart?x=1"


def _request(
    key: SigningKey = AGENT, agent_member: str | None = None, *, method: str = "GET", url: str = URL
) -> Fields:
    """A web-bot-auth request signed by ``key``; ``agent_member``: the covered Signature-Agent
    member as sent (default: the one our signer writes for AGENT_DIR)."""
    now = int(time.time())
    fields = Fields(())
    value, agent = signature_agent_field(WEB_BOT_AUTH, "agent", AGENT_DIR)
    assert value is not None
    fields.add("Signature-Agent", value if agent_member is None else f"agent={agent_member}")
    member = sign_message(
        Message(method, parse_absolute_uri(url), fields),
        key,
        created=now,
        expires=now + 300,
        components=profile_components(WEB_BOT_AUTH, previous=None, agent=agent),
        extra_params=profile_params(WEB_BOT_AUTH, bytes(64)),
    )
    attach_signature(fields, member)
    return fields


def _verifier(proofs: tuple[tuple[str, str], ...] | None = None) -> tuple[RequestVerifier, FakeFetch]:
    now = int(time.time())
    body = render_directory(Directory((DirectoryKey(AGENT.public, now - 60, now + 3600),)))
    fetch = FakeFetch()
    fetch.answers[directory_url(AGENT_DIR)] = FetchResult(200, body, "max-age=300", proofs or ())
    return RequestVerifier(DirectoryResolver(fetch)), fetch


async def test_a_web_bot_auth_request_verifies_through_its_directory() -> None:
    verifier, fetch = _verifier()
    stack = await verifier.verify("GET", URL, _request(), b"")
    assert stack.profile == "web-bot-auth"
    assert stack.directory == AGENT_DIR
    assert stack.agent.key_source == AGENT_DIR
    assert fetch.calls == [directory_url(AGENT_DIR)]
    await verifier.close()


async def test_a_member_the_agent_does_not_cover_is_in_no_verdict() -> None:
    """``stack_summary`` (the test origin's answer) and the middleware's ``request[SIGNATURE]`` both
    show ``signature_agent``: a member appended on the path showed there as if verified."""
    verifier, fetch = _verifier()
    appended = '"https://agent.example", evil="https://evil.example"'
    stack = await verifier.verify("GET", URL, _request(agent_member=appended), b"")
    summary = stack_summary(stack)
    assert summary["signature_agent"] == 'agent="https://agent.example"'
    assert summary["directory"] == AGENT_DIR
    assert "evil" not in json.dumps(summary)
    assert fetch.calls == [directory_url(AGENT_DIR)]
    await verifier.close()


async def test_a_key_whose_directory_proof_fails_is_not_used() -> None:
    now = int(time.time())
    body = render_directory(Directory((DirectoryKey(AGENT.public, now - 60, now + 3600),)))
    good = tuple(sign_directory_response(body, "agent.example", [AGENT], created=now, expires=now + 300))
    verifier, _ = _verifier(good)
    assert (await verifier.verify("GET", URL, _request(), b"")).profile == "web-bot-auth"
    await verifier.close()
    foreign = tuple(
        sign_directory_response(body, "elsewhere.example", [AGENT], created=now, expires=now + 300)
    )
    verifier, _ = _verifier(foreign)
    with pytest.raises(VerificationError) as err:
        await verifier.verify("GET", URL, _request(), b"")
    assert err.value.reason == "unknown-keyid"
    await verifier.close()


async def test_a_mixed_stack_is_refused_before_any_fetch() -> None:
    verifier, fetch = _verifier()
    fields = _request()
    now = int(time.time())
    member = sign_message(
        Message("GET", parse_absolute_uri(URL), fields),
        SigningKey.generate(),
        created=now,
        expires=now + 60,
        label="broker",
        components=(Component("@authority"), Component("signature", key="agent")),
    )
    attach_signature(fields, member)
    with pytest.raises(VerificationError) as err:
        await verifier.verify("GET", URL, fields, b"")
    assert err.value.reason == "profile-mix"
    assert fetch.calls == []
    await verifier.close()


async def test_a_verifier_may_accept_the_spec_profile_only() -> None:
    fetch = FakeFetch()
    verifier = RequestVerifier(DirectoryResolver(fetch), VerifierPolicy(web_bot_auth=False))
    with pytest.raises(VerificationError) as err:
        await verifier.verify("GET", URL, _request(), b"")
    assert err.value.reason == "unsupported-tag"
    assert fetch.calls == []
    await verifier.close()


@pytest.mark.parametrize(
    "member",
    [
        f'"{AGENT_DIR}";type=jwks_uri',  # "MUST ignore that member, and MUST NOT infer the mechanism"
        f'"{AGENT_DIR}";type=cimd',
        f'"{AGENT_DIR}/agents/alice"',  # a directory member "MUST be ... an origin"
    ],
)
async def test_a_member_the_drafts_have_a_verifier_ignore_names_no_directory(member: str) -> None:
    """protocol-02 5.2.1 and 5.5: such a member was fetched as a directory anyway (``type`` dropped;
    the path kept), and the request attributed to that URL. Ignored, it names no directory: only a
    pinned key can verify it, and no fetch is made."""
    verifier, fetch = _verifier()
    with pytest.raises(VerificationError) as err:
        await verifier.verify("GET", URL, _request(agent_member=member), b"")
    assert err.value.reason == "unknown-keyid"
    assert fetch.calls == []
    await verifier.close()
    pinned = RequestVerifier(
        DirectoryResolver(FakeFetch()), VerifierPolicy(pinned_agent_keys=(AGENT.public,))
    )
    stack = await pinned.verify("GET", URL, _request(agent_member=member), b"")
    assert (stack.directory, stack.agent.key_source) == (None, "pinned")
    await pinned.close()


async def test_a_directory_member_with_a_slash_or_the_type_token_is_an_origin() -> None:
    verifier, fetch = _verifier()
    for member in (f'"{AGENT_DIR}/"', f'"{AGENT_DIR}";type=directory'):
        assert (await verifier.verify("GET", URL, _request(agent_member=member), b"")).directory == AGENT_DIR
    assert fetch.calls == [directory_url(AGENT_DIR)]
    await verifier.close()


def _drafts_directory(**window: int) -> bytes:
    """A directory in the drafts' form: a JWKS whose key (AGENT's) carries ``kid`` and no spec window
    (``window``: its ``nbf``/``exp``), as the drafts' signed-directory vector serves it."""
    jwk = {
        "kty": "OKP",
        "crv": "Ed25519",
        "kid": AGENT.thumbprint,
        "x": AGENT.public.jwk()["x"],
        "use": "sig",
    }
    return json.dumps({"keys": [{**jwk, **window}]}).encode()


def _drafts_verifier(body: bytes) -> tuple[RequestVerifier, FakeFetch]:
    fetch = FakeFetch()
    fetch.answers[directory_url(AGENT_DIR)] = FetchResult(200, body, "max-age=300")
    return RequestVerifier(DirectoryResolver(fetch)), fetch


async def test_a_web_bot_auth_label_verifies_with_a_directory_in_the_drafts_form() -> None:
    """The drafts' directory has no spec window (``kid``, ``nbf``/``exp`` at most): the whole
    document was refused ``missing-key-window``, so no bot publishing one could be verified."""
    now = int(time.time())
    for window in ({}, {"nbf": now - 60, "exp": now + 3600}):
        verifier, _ = _drafts_verifier(_drafts_directory(**window))
        stack = await verifier.verify("GET", URL, _request(), b"")
        assert (stack.profile, stack.agent.key_source) == ("web-bot-auth", AGENT_DIR)
        await verifier.close()


async def test_a_drafts_key_outside_its_nbf_exp_is_refused() -> None:
    now = int(time.time())
    verifier, _ = _drafts_verifier(_drafts_directory(nbf=now - 7200, exp=now - 3600))
    with pytest.raises(VerificationError) as err:
        await verifier.verify("GET", URL, _request(), b"")
    assert err.value.reason == "key-outside-window"
    await verifier.close()


async def test_a_key_without_the_spec_window_never_verifies_the_spec_profile() -> None:
    """The spec selects a key "whose window [not_before, not_after) covers the current time": one
    published without it counts for web-bot-auth labels only."""
    now = int(time.time())
    verifier, _ = _drafts_verifier(_drafts_directory())
    fields = Fields(
        [
            ("Content-Digest", content_digest(b"{}")),
            ("Authorization", ""),
            ("Signature-Agent", f'"{AGENT_DIR}"'),
        ]
    )
    message = Message("POST", parse_absolute_uri(URL), fields)
    attach_signature(fields, sign_message(message, AGENT, created=now, expires=now + 300))
    with pytest.raises(VerificationError) as err:
        await verifier.verify("POST", URL, fields, b"{}")
    assert err.value.reason == "unknown-keyid"
    await verifier.close()


def test_the_drafts_signed_directory_keeps_its_proven_key_and_drops_an_unproven_one() -> None:
    """protocol-02's signed directory response, whole: its key (drafts' form) is proven for the
    authority asked; under another authority the proof fails and the key is ignored."""
    vectors = json.loads((VECTORS / "web_bot_auth_drafts_ed25519.json").read_text())["vectors"]
    (vector,) = [v for v in vectors if "response_body" in v]
    body = vector["response_body"].encode()
    proofs = tuple((n, v) for n, v in vector["headers"].items() if n in ("Signature", "Signature-Input"))
    result = FetchResult(200, body, None, (("Content-Digest", vector["headers"]["Content-Digest"]), *proofs))
    now = 1735689600 + 10
    asked = directory_url("https://signature-agent.test")
    kept = only_proven(parse_directory(body), result, asked, now, 5)
    assert [k.thumbprint for k in kept.web_keys] == ["poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U"]
    elsewhere = only_proven(parse_directory(body), result, directory_url("https://other.test"), now, 5)
    assert elsewhere.web_keys == ()


async def test_a_drafts_key_rotated_in_is_found_by_the_keyid_refetch() -> None:
    """The refetch for a keyid the cached directory lacks looks in the drafts' keys too, for a
    web-bot-auth label (and only for one: tests above hold the spec's profile to its window)."""
    other = SigningKey.generate()
    jwk = {"kty": "OKP", "crv": "Ed25519", "x": other.public.jwk()["x"]}
    fetch = FakeFetch()
    fetch.answers[directory_url(AGENT_DIR)] = FetchResult(200, json.dumps({"keys": [jwk]}).encode(), None)
    verifier = RequestVerifier(DirectoryResolver(fetch, keyid_refetch_s=0))  # a refetch at once
    assert (await verifier.verify("GET", URL, _request(key=other), b"")).profile == "web-bot-auth"  # cached
    fetch.answers[directory_url(AGENT_DIR)] = FetchResult(200, _drafts_directory(), "max-age=300")
    stack = await verifier.verify("GET", URL, _request(), b"")  # AGENT's key: only in the refetched one
    assert stack.agent.keyid == AGENT.thumbprint
    assert fetch.calls == [directory_url(AGENT_DIR)] * 2
    await verifier.close()


@pytest.mark.parametrize(
    "path", ["/v1/svc.v1.ExchangeService/DiscoverResources", "/v1/svc.v1.ExchangeService/DiscoverResources/"]
)
async def test_an_exchange_call_or_a_spelling_of_one_is_refused_under_web_bot_auth(path: str) -> None:
    """A web-bot-auth label binds the authority only: an exchange call (or a path a backend may route
    as one, which the gateway refuses as malformed) is accepted under the spec's profile only."""
    verifier, fetch = _verifier()
    url = "https://exchange.example" + path
    with pytest.raises(VerificationError) as err:
        await verifier.verify("POST", url, _request(method="POST", url=url), b"")
    assert err.value.reason == "exchange-call-profile"
    assert fetch.calls == []
    await verifier.close()
