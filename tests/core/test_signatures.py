"""The spec's "Request signature" and "Multi-hop forwarding" rules: one refusal test per rule.

Every negative test signs exactly what it sends (so the signature itself is valid) and breaks one
rule only; it asserts the stable reason, so removing the rule makes the test fail.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TypedDict, Unpack

import pytest

from signing_proxy.core.digest import content_digest
from signing_proxy.core.errors import FieldError, SigningError, VerificationError
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.signatures import (
    SPEC_COMPONENTS,
    Component,
    Message,
    SignedMember,
    VerificationKey,
    VerifiedStack,
    attach_signature,
    hop_components,
    parse_signature_agent,
    parse_signature_stack,
    serialize_params_value,
    sign_message,
    signature_base,
    verify_stack,
)
from signing_proxy.core.uri import parse_absolute_uri, parse_received_uri
from tests.oracle import oracle_agent_sign, oracle_sign, oracle_verify

NOW = 1_700_000_000
URL = "https://exchange.example/svc.v1.ExchangeService/DiscoverResources?x=%2Fa"
BODY = b'{"ver":"1.0"}'
AGENT = SigningKey.from_seed(bytes(range(32)))
BROKER = SigningKey.from_seed(bytes(range(1, 33)))
OTHER = SigningKey.from_seed(bytes(range(2, 34)))

Param = tuple[str, str | int]
"""One signature parameter, as ``serialize_params_value`` takes it."""


class KeyState(TypedDict, total=False):
    """What ``keys`` may set on every ``VerificationKey`` besides its public key."""

    not_before: int | None
    not_after: int | None
    revoked: bool
    source: str | None


class StackLimits(TypedDict, total=False):
    """The bounds of ``verify_stack`` a test may change."""

    skew_s: int
    max_validity_s: int | None
    max_hops: int | None


class VerifyOptions(StackLimits, total=False):
    """Everything ``verify`` takes after the message."""

    body: bytes | None
    known: dict[str, VerificationKey] | None
    now: float


def unsigned(body: bytes = BODY, auth: str | None = "", agent: str | None = "") -> Message:
    lines = [("Content-Type", "application/json"), ("Content-Digest", content_digest(body))]
    if auth is not None:
        lines.append(("Authorization", auth))
    if agent is not None:
        lines.append(("Signature-Agent", agent))
    return Message("POST", parse_absolute_uri(URL), Fields(lines))


def forge(
    message: Message,
    key: SigningKey,
    *,
    label: str = "agent",
    components: Sequence[Component] = SPEC_COMPONENTS,
    params: Sequence[Param] | None = None,
) -> Message:
    """Sign exactly these components and params (in this order) and attach the result."""
    if params is None:
        params = [("keyid", key.thumbprint), ("alg", "ed25519"), ("created", NOW), ("expires", NOW + 300)]
    params_value = serialize_params_value(components, params)
    base = signature_base(message, components, params_value)
    attach_signature(message.fields, SignedMember(label, params_value, key.sign(base), base))
    return message


def signed(body: bytes = BODY, **kw: str | None) -> Message:
    message = unsigned(body, **kw)
    attach_signature(message.fields, sign_message(message, AGENT, created=NOW, expires=NOW + 300))
    return message


def add_hop(message: Message, key: SigningKey, label: str, previous: str) -> Message:
    hop = sign_message(
        message, key, created=NOW + 1, expires=NOW + 301, label=label, components=hop_components(previous)
    )
    attach_signature(message.fields, hop)
    return message


def keys(*signers: SigningKey, **over: Unpack[KeyState]) -> dict[str, VerificationKey]:
    return {k.thumbprint: VerificationKey(k.public, **over) for k in signers}


def verify(
    message: Message,
    body: bytes | None = BODY,
    known: dict[str, VerificationKey] | None = None,
    now: float = NOW + 10,
    **kw: Unpack[StackLimits],
) -> VerifiedStack:
    known = keys(AGENT, BROKER) if known is None else known
    return verify_stack(message, body, lambda entry, _i: known.get(entry.keyid or ""), now=now, **kw)


def refused(message: Message, reason: str, **kw: Unpack[VerifyOptions]) -> VerificationError:
    with pytest.raises(VerificationError) as err:
        verify(message, **kw)
    assert err.value.reason == reason, err.value
    return err.value


# --- the happy paths -------------------------------------------------------------------------


def test_agent_signature_verifies_and_result_says_who_signed() -> None:
    result = verify(signed(agent='"https://agent.example"'))
    assert result.hops == 1
    assert result.agent.keyid == AGENT.thumbprint
    assert result.directory == "https://agent.example"
    assert result.agent.components == tuple(c.serialized for c in SPEC_COMPONENTS)


def test_signature_input_params_are_in_spec_order() -> None:
    message = signed()
    value = message.fields.combined("Signature-Input")
    assert value == (
        'agent=("@method" "@target-uri" "content-digest" "authorization" "signature-agent")'
        f';keyid="{AGENT.thumbprint}";alg="ed25519";created={NOW};expires={NOW + 300}'
    )


def test_three_label_stack_each_covering_the_one_before() -> None:
    message = add_hop(add_hop(signed(), BROKER, "broker", "agent"), OTHER, "broker2", "broker")
    result = verify(message, known=keys(AGENT, BROKER, OTHER))
    assert [s.label for s in result.signatures] == ["agent", "broker", "broker2"]
    assert '"signature";key="broker"' in result.signatures[2].components


def test_adding_a_label_keeps_earlier_members_byte_for_byte() -> None:
    message = signed()
    before_input = message.fields.combined("Signature-Input")
    before_sig = message.fields.combined("Signature")
    add_hop(message, BROKER, "broker", "agent")
    assert (message.fields.combined("Signature-Input") or "").startswith(f"{before_input}, broker=")
    assert (message.fields.combined("Signature") or "").startswith(f"{before_sig}, broker=")


def test_empty_authorization_and_signature_agent_are_accepted() -> None:
    assert verify(signed(auth="", agent="")).directory is None


@pytest.mark.parametrize("value", ['"https://agent.example/dir"', "https://agent.example/dir"])
def test_signature_agent_bare_url_and_sf_string_name_the_same_directory(value: str) -> None:
    assert verify(signed(agent=value)).directory == "https://agent.example/dir"


# --- rule 1: exactly the five components --------------------------------------------------------


@pytest.mark.parametrize("dropped", [c.name for c in SPEC_COMPONENTS])
def test_rule1_signature_omitting_a_component_is_refused(dropped: str) -> None:
    components = [c for c in SPEC_COMPONENTS if c.name != dropped]
    err = refused(forge(unsigned(), AGENT, components=components), "missing-covered-component")
    assert dropped in err.detail


def test_rule1_signature_covering_more_than_the_five_is_refused() -> None:
    components = [*SPEC_COMPONENTS, Component("content-type")]
    refused(forge(unsigned(), AGENT, components=components), "unexpected-covered-component")


def test_rule1_component_covered_twice_is_refused() -> None:
    components = [*SPEC_COMPONENTS, Component("@method")]
    refused(forge(unsigned(), AGENT, components=components), "duplicate-component")


# --- rule 2: created and expires, the window -----------------------------------------------------


@pytest.mark.parametrize("missing", ["created", "expires", "alg", "keyid"])
def test_rule2_required_parameters(missing: str) -> None:
    params: list[Param] = [
        ("keyid", AGENT.thumbprint),
        ("alg", "ed25519"),
        ("created", NOW),
        ("expires", NOW + 300),
    ]
    params = [p for p in params if p[0] != missing]
    known = keys(AGENT)
    if missing == "keyid":
        known = {"": VerificationKey(AGENT.public)}
    refused(forge(unsigned(), AGENT, params=params), f"missing-{missing}", known=known)


def test_alg_other_than_ed25519_is_refused() -> None:
    params: list[Param] = [
        ("keyid", AGENT.thumbprint),
        ("alg", "rsa-pss-sha512"),
        ("created", NOW),
        ("expires", NOW + 300),
    ]
    refused(forge(unsigned(), AGENT, params=params), "unsupported-algorithm")


def test_unknown_signature_parameter_is_refused() -> None:
    params: list[Param] = [
        ("keyid", AGENT.thumbprint),
        ("alg", "ed25519"),
        ("created", NOW),
        ("expires", NOW + 300),
        ("foo", "bar"),
    ]
    refused(forge(unsigned(), AGENT, params=params), "unknown-signature-parameter")


def test_expires_not_after_created_is_refused() -> None:
    params: list[Param] = [
        ("keyid", AGENT.thumbprint),
        ("alg", "ed25519"),
        ("created", NOW),
        ("expires", NOW),
    ]
    refused(forge(unsigned(), AGENT, params=params), "bad-signature-window")


def test_rule2_created_in_the_future_beyond_skew_is_refused() -> None:
    refused(signed(), "signature-not-yet-valid", now=NOW - 6)
    assert verify(signed(), now=NOW - 5).hops == 1  # within the default 5 s skew


def test_rule2_expired_signature_is_refused_at_the_boundary_skew_never_extends_expires() -> None:
    assert verify(signed(), now=NOW + 299.999).hops == 1
    refused(signed(), "signature-expired", now=NOW + 300)  # [created, expires) is half-open
    refused(signed(), "signature-expired", now=NOW + 301, skew_s=300)  # skew is for created only
    refused(signed(), "signature-expired", now=NOW + 300 + 4)  # the 5 s skew accepted this before


def test_lifetime_above_max_validity_is_refused_at_the_boundary() -> None:
    def lifetime(seconds: int) -> Message:
        params: list[Param] = [
            ("keyid", AGENT.thumbprint),
            ("alg", "ed25519"),
            ("created", NOW),
            ("expires", NOW + seconds),
        ]
        return forge(unsigned(), AGENT, params=params)

    assert verify(lifetime(3600)).hops == 1  # default verify.max_validity_s
    refused(lifetime(3601), "validity-too-long")
    assert verify(lifetime(60), max_validity_s=60).hops == 1
    refused(lifetime(61), "validity-too-long", max_validity_s=60)


def test_replay_for_years_is_refused() -> None:
    """Issue 15 attack 5: ``created=1``, ``expires=now+10y`` was accepted."""
    ten_years = 10 * 365 * 86400
    params: list[Param] = [
        ("keyid", AGENT.thumbprint),
        ("alg", "ed25519"),
        ("created", 1),
        ("expires", NOW + ten_years),
    ]
    refused(forge(unsigned(), AGENT, params=params), "validity-too-long")


def test_keyid_that_is_not_a_thumbprint_is_refused_without_a_lookup() -> None:
    params: list[Param] = [("keyid", "key-1"), ("alg", "ed25519"), ("created", NOW), ("expires", NOW + 300)]

    def lookup(_entry: object, _index: int) -> VerificationKey:
        raise AssertionError("looked up a keyid of the wrong shape")

    with pytest.raises(VerificationError) as err:
        verify_stack(forge(unsigned(), AGENT, params=params), BODY, lookup, now=NOW + 10)
    assert err.value.reason == "unknown-keyid"


# --- rules 3-5: covered headers ------------------------------------------------------------------


@pytest.mark.parametrize("header", ["authorization", "signature-agent"])
def test_rule4_missing_covered_header_is_refused_never_treated_as_empty(header: str) -> None:
    message = signed()
    message.fields.remove(header)
    refused(message, "missing-covered-header")


def test_rule5_a_second_authorization_line_invalidates_the_signature() -> None:
    message = signed(auth="Bearer a")
    message.fields.add("authorization", "Bearer b")
    err = refused(message, "bad-signature")
    assert "authorization" in err.detail


def test_rule5_header_names_are_case_insensitive() -> None:
    message = signed(auth="Bearer a")
    lines = [(n.upper(), v) for n, v in message.fields]
    assert verify(Message(message.method, message.target, Fields(lines))).hops == 1


# --- rule 6: rebuilt content, digest, key ---------------------------------------------------------


def test_tampered_target_is_refused() -> None:
    message = signed()
    tampered = Message(message.method, parse_absolute_uri(URL.replace("x=%2Fa", "x=%2fa")), message.fields)
    refused(tampered, "bad-signature")


def test_tampered_method_is_refused() -> None:
    message = signed()
    refused(Message("PUT", message.target, message.fields), "bad-signature")


def test_tampered_body_fails_the_content_digest() -> None:
    refused(signed(), "content-digest-mismatch", body=b'{"ver":"2.0"}')


def test_missing_content_digest_is_refused() -> None:
    message = signed()
    message.fields.remove("content-digest")
    refused(message, "missing-content-digest")


def test_unknown_keyid_is_refused() -> None:
    refused(signed(), "unknown-keyid", known=keys(BROKER))


def test_revoked_key_is_refused() -> None:
    refused(signed(), "key-revoked", known=keys(AGENT, revoked=True))


def test_key_window_is_half_open() -> None:
    refused(signed(), "key-outside-window", known=keys(AGENT, not_after=NOW + 10))  # now == not_after
    refused(signed(), "key-outside-window", known=keys(AGENT, not_before=NOW + 11))
    assert verify(signed(), known=keys(AGENT, not_before=NOW + 10, not_after=NOW + 11)).hops == 1


def test_signature_by_another_key_is_refused() -> None:
    message = unsigned()
    params: list[Param] = [
        ("keyid", AGENT.thumbprint),
        ("alg", "ed25519"),
        ("created", NOW),
        ("expires", NOW + 300),
    ]
    refused(forge(message, OTHER, params=params), "bad-signature")


# --- the stack: labels, multi-hop -----------------------------------------------------------------


def test_missing_signature_headers_are_refused() -> None:
    refused(unsigned(), "missing-signature")
    message = signed()
    message.fields.remove("signature")
    refused(message, "missing-signature")


def test_dangling_label_is_refused() -> None:
    message = signed()
    message.fields.set(
        "Signature-Input", (message.fields.combined("Signature-Input") or "").replace("agent=", "agent2=")
    )
    refused(message, "dangling-label")


def test_duplicate_label_is_refused() -> None:
    message = signed()
    message.fields.add("Signature-Input", message.fields.combined("Signature-Input") or "")
    refused(message, "duplicate-label")


def test_malformed_signature_input_is_refused() -> None:
    message = signed()
    message.fields.set("Signature-Input", "agent=(")
    refused(message, "malformed-signature-input")


def test_later_label_that_does_not_cover_its_predecessor_is_refused() -> None:
    message = forge(signed(), BROKER, label="broker")  # covers only the five
    refused(message, "predecessor-not-covered")


def test_later_label_covering_a_label_other_than_the_one_before_is_refused() -> None:
    message = add_hop(signed(), BROKER, "broker", "agent")
    forge(message, OTHER, label="broker2", components=hop_components("agent"))
    refused(message, "predecessor-not-covered", known=keys(AGENT, BROKER, OTHER))


def test_hop_cap_counts_signatures() -> None:
    message = add_hop(signed(), BROKER, "broker", "agent")
    assert verify(message, max_hops=2).hops == 2
    refused(message, "too-many-hops", max_hops=1)


def test_tampered_agent_signature_breaks_the_broker_label_too() -> None:
    message = add_hop(signed(), BROKER, "broker", "agent")
    sig = message.fields.combined("Signature") or ""
    agent_part, broker_part = sig.split(", ")
    flipped = agent_part[:10] + ("A" if agent_part[10] != "A" else "B") + agent_part[11:]
    message.fields.set("Signature", f"{flipped}, {broker_part}")
    err = refused(message, "bad-signature")
    assert err.label == "agent"


def test_component_identifiers_are_built_once_and_shared() -> None:
    first = parse_signature_stack(signed().fields)[0].components
    again = parse_signature_stack(signed().fields)[0].components
    assert first == SPEC_COMPONENTS
    assert all(a is b for a, b in zip(first, again, strict=True))  # immutable: one object per identifier


def test_signature_agent_must_be_a_url() -> None:
    refused(signed(agent='"ftp://agent.example"'), "malformed-signature-agent")
    with pytest.raises(FieldError):
        parse_signature_agent('"unterminated')


# --- signing refuses what cannot be signed (fail closed) ------------------------------------------


def test_signing_refuses_an_absent_covered_header() -> None:
    with pytest.raises(SigningError) as err:
        sign_message(unsigned(auth=None), AGENT, created=NOW, expires=NOW + 300)
    assert err.value.reason == "missing-covered-header"


def test_signing_refuses_non_ascii_values() -> None:
    with pytest.raises(SigningError) as err:
        sign_message(unsigned(auth="Bearer caf\u00e9"), AGENT, created=NOW, expires=NOW + 300)
    assert err.value.reason == "non-ascii-component"


def test_extra_params_follow_the_spec_four_and_still_verify() -> None:
    message = unsigned()
    plain = sign_message(message, AGENT, created=NOW, expires=NOW + 300)
    extra = sign_message(message, AGENT, created=NOW, expires=NOW + 300, extra_params=[("nonce", 'a"b')])
    assert extra.params_value == plain.params_value + ';nonce="a\\"b"'
    attach_signature(message.fields, extra)
    assert verify(message).agent.keyid == AGENT.thumbprint


@pytest.mark.parametrize("extra", [(), (("tag", "t"),)])
def test_signing_refuses_integers_beyond_the_structured_field_range(extra: Sequence[tuple[str, str]]) -> None:
    with pytest.raises(SigningError) as err:
        sign_message(unsigned(), AGENT, created=NOW, expires=10**15, extra_params=extra)
    assert err.value.reason == "bad-signature-parameter"


# --- interoperability with an independent RFC 9421 implementation ---------------------------------


def test_our_signatures_verify_under_http_message_signatures() -> None:
    now = int(time.time())
    message = unsigned(auth="Bearer abc", agent='"https://agent.example"')
    attach_signature(message.fields, sign_message(message, AGENT, created=now, expires=now + 300))
    hop = sign_message(
        message, BROKER, created=now, expires=now + 300, label="broker", components=hop_components("agent")
    )
    attach_signature(message.fields, hop)
    public = {AGENT.thumbprint: AGENT.public.key, BROKER.thumbprint: BROKER.public.key}
    assert oracle_verify("POST", URL, list(message.fields), BODY, public, labels=("agent", "broker")) == [
        "agent",
        "broker",
    ]


def test_we_verify_http_message_signatures_single_label_and_stack() -> None:
    now = int(time.time())
    lines = [
        ("Content-Type", "application/json"),
        ("Content-Digest", content_digest(BODY)),
        ("Authorization", ""),
        ("Signature-Agent", ""),
    ]
    lines = oracle_sign("POST", URL, lines, BODY, keyid=AGENT.thumbprint, private_key=AGENT._private, now=now)
    message = Message("POST", parse_absolute_uri(URL), Fields(lines))
    assert verify(message, now=now).agent.label == "agent"
    five = tuple(c.name for c in SPEC_COMPONENTS)
    lines = oracle_sign(
        "POST",
        URL,
        lines,
        BODY,
        keyid=BROKER.thumbprint,
        private_key=BROKER._private,
        now=now,
        label="broker",
        components=(*five, '"signature";key="agent"'),
    )
    message = Message("POST", parse_absolute_uri(URL), Fields(lines))
    assert [s.label for s in verify(message, now=now).signatures] == ["agent", "broker"]


@pytest.mark.parametrize(
    "received",
    [
        "https://exchange.example:443/svc/call",  # a default port, as a client that was given it sends it
        "https://Exchange.EXAMPLE/svc/call",
        "https://[2001:DB8::A]/svc/call",
        "https://exchange.example/svc/call?",  # an empty query (RFC 3986 section 6.2.3: not the same URI)
    ],
)
def test_target_uri_is_the_one_received_not_a_normal_form_of_it(received: str) -> None:
    """RFC 9421 section 2.2.2: ``@target-uri`` is the target URI assembled from the authority and
    target as they arrived (RFC 9112 section 3.3). A third party that signs the URI it sends, as pyauth
    does, was refused ``bad-signature``: the base was rebuilt over our normal form of it."""
    now = int(time.time())
    lines = oracle_agent_sign("POST", received, BODY, AGENT, signature_agent="", now=now)
    target = parse_received_uri(received)
    assert target.uri != received  # the normal form differs; the base must not be built over it
    assert target.received == received
    assert verify(Message("POST", target, Fields(lines)), now=now).agent.label == "agent"
    with pytest.raises(VerificationError) as refused:
        verify(Message("POST", parse_absolute_uri(received), Fields(lines)), now=now)
    assert refused.value.reason == "bad-signature"


def test_a_received_target_with_a_fragment_is_refused() -> None:
    with pytest.raises(FieldError) as refused:
        parse_received_uri("https://exchange.example/feed#/admin")
    assert refused.value.reason == "malformed-target"
