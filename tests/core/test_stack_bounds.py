"""What a stack of labels costs a verifier (DESIGN section 7: every per-client structure has a bound).

A stranger needs no valid signature to make a verifier work: each later label need only be
well-formed, and every signature base repeats the covered values (an ``Authorization`` of up to a
whole request head). The verifier built and kept the base of every label before it looked up any
key, re-joined the whole ``Signature`` field once per label, and took any number of labels when no
hop cap was configured. Now a stack has at most ``MAX_HOPS`` labels, refused ``too-many-hops`` before
any label is read; the first label's base is the only one built before its key is in hand, a later
one's only once its key is found; and ``Signature`` is joined and parsed once for all the labels.

Bases are counted, not timed: each one reads the covered ``Authorization`` once, so a ``Fields``
that counts its reads counts the bases built.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import pytest

from signing_proxy.core.digest import content_digest
from signing_proxy.core.errors import VerificationError
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.profiles import WEB_BOT_AUTH, profile_components, profile_params
from signing_proxy.core.signature_verify import MAX_HOPS
from signing_proxy.core.signatures import (
    Component,
    Message,
    SignatureEntry,
    VerificationKey,
    VerifiedStack,
    attach_signature,
    hop_components,
    parse_signature_stack,
    sign_message,
    verify_stack,
)
from signing_proxy.core.uri import parse_absolute_uri

NOW = 1_700_000_000
URL = "https://exchange.example/svc.v1.ExchangeService/DiscoverResources"
BODY = b'{"ver":"1.0"}'
AGENT = SigningKey.from_seed(bytes(range(32)))
BROKER = SigningKey.from_seed(bytes(range(1, 33)))


class CountingFields(Fields):
    """Fields that count how often each field's combined value is read (by lower-case name)."""

    __slots__ = ("reads",)

    def __init__(self, lines: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(lines)
        self.reads: Counter[str] = Counter()

    def combined(self, name: str) -> str | None:
        self.reads[name.lower()] += 1
        return super().combined(name)


def stack(labels: int) -> Message:
    """A request signed by the agent (``hop0``) and ``labels - 1`` brokers, each covering the one
    before it; every signature valid. Its fields count their reads from here on."""
    fields = Fields(
        [("Content-Digest", content_digest(BODY)), ("Authorization", "Bearer t"), ("Signature-Agent", "")]
    )
    message = Message("POST", parse_absolute_uri(URL), fields)
    attach_signature(fields, sign_message(message, AGENT, created=NOW, expires=NOW + 300, label="hop0"))
    for hop in range(1, labels):
        member = sign_message(
            message,
            BROKER,
            created=NOW,
            expires=NOW + 300,
            label=f"hop{hop}",
            components=hop_components(f"hop{hop - 1}"),
        )
        attach_signature(fields, member)
    return Message(message.method, message.target, CountingFields(fields))


def reads(message: Message) -> Counter[str]:
    assert isinstance(message.fields, CountingFields)
    return message.fields.reads


class Keys:
    """A key lookup that records every label it is asked about; ``known`` keys by thumbprint."""

    def __init__(self, *known: SigningKey) -> None:
        self.known = {k.thumbprint: VerificationKey(k.public) for k in known}
        self.asked: list[str] = []

    def __call__(self, entry: SignatureEntry, _index: int) -> VerificationKey | None:
        self.asked.append(entry.label)
        return self.known.get(entry.keyid or "")


def verify(message: Message, keys: Keys, *, max_hops: int | None = None) -> VerifiedStack:
    return verify_stack(message, BODY, keys, now=NOW + 1, max_hops=max_hops)


def test_the_bound_is_the_documented_one() -> None:
    assert MAX_HOPS == 16  # README, "Where the spec is silent": a change there changes this


def test_a_stack_of_the_bound_verifies_without_a_hop_cap() -> None:
    keys = Keys(AGENT, BROKER)
    assert verify(stack(MAX_HOPS), keys).hops == MAX_HOPS
    assert len(keys.asked) == MAX_HOPS


@pytest.mark.parametrize("max_hops", [None, MAX_HOPS + 10], ids=["no hop cap", "a cap above the bound"])
def test_a_stack_past_the_bound_is_refused_before_any_key_or_base(max_hops: int | None) -> None:
    message = stack(MAX_HOPS + 1)  # every signature valid: only the count refuses it
    keys = Keys(AGENT, BROKER)
    with pytest.raises(VerificationError) as err:
        verify(message, keys, max_hops=max_hops)
    assert err.value.reason == "too-many-hops"
    assert str(MAX_HOPS) in err.value.detail
    assert keys.asked == []
    assert reads(message)["authorization"] == 0  # no base built


def test_a_lower_hop_cap_still_applies() -> None:
    with pytest.raises(VerificationError) as err:
        verify(stack(3), Keys(AGENT, BROKER), max_hops=2)
    assert err.value.reason == "too-many-hops"


def test_parsing_refuses_a_stack_past_the_bound_before_reading_its_labels() -> None:
    # the relay and the retrieval check read the labels through parse_signature_stack themselves
    assert len(parse_signature_stack(stack(MAX_HOPS).fields)) == MAX_HOPS
    with pytest.raises(VerificationError) as err:
        parse_signature_stack(stack(MAX_HOPS + 1).fields)
    assert err.value.reason == "too-many-hops"


def test_a_refused_first_label_costs_one_base_however_many_labels_follow() -> None:
    message = stack(MAX_HOPS)
    keys = Keys(BROKER)  # the agent's key is unknown: refused at the first label
    with pytest.raises(VerificationError) as err:
        verify(message, keys)
    assert (err.value.reason, err.value.label) == ("unknown-keyid", "hop0")
    assert keys.asked == ["hop0"]
    assert reads(message)["authorization"] == 1  # the first label's base only


def test_a_later_label_whose_key_is_unknown_costs_no_base_of_its_own() -> None:
    message = stack(MAX_HOPS)
    keys = Keys(AGENT)  # the brokers' key is unknown: refused at the second label
    with pytest.raises(VerificationError) as err:
        verify(message, keys)
    assert (err.value.reason, err.value.label) == ("unknown-keyid", "hop1")
    assert reads(message)["authorization"] == 1  # hop1's key was not found: its base never built


@pytest.mark.parametrize("labels", [2, MAX_HOPS])
def test_the_signature_field_is_read_as_often_for_any_number_of_labels(labels: int) -> None:
    message = stack(labels)
    assert verify(message, Keys(AGENT, BROKER)).hops == labels
    # once to parse the stack, once for every label's "signature";key= member: never once per label
    assert reads(message)["signature"] == 2
    assert reads(message)["authorization"] == labels  # each base built once


def test_a_later_label_covering_an_absent_field_is_refused_before_any_key() -> None:
    # web-bot-auth: a later hop may cover a component the first label does not; one that is absent
    # is still refused with no key looked up, though that label's base is built only when verified
    fields = Fields([("Content-Digest", content_digest(BODY))])
    message = Message("GET", parse_absolute_uri("https://publisher.example/feed"), fields)
    first = profile_components(WEB_BOT_AUTH, previous=None, agent=None)
    params = profile_params(WEB_BOT_AUTH, bytes(64))
    signed = sign_message(
        message, AGENT, created=NOW, expires=NOW + 60, label="agent", components=first, extra_params=params
    )
    attach_signature(message.fields, signed)
    outer = (
        *profile_components(WEB_BOT_AUTH, previous="agent", agent=None, inner=first),
        Component("content-digest"),
    )
    hop = sign_message(
        message, BROKER, created=NOW, expires=NOW + 60, label="broker", components=outer, extra_params=params
    )
    attach_signature(message.fields, hop)
    message.fields.remove("content-digest")
    keys = Keys(AGENT, BROKER)
    with pytest.raises(VerificationError) as err:
        verify_stack(message, None, keys, now=NOW + 1)
    assert (err.value.reason, err.value.label) == ("missing-covered-header", "broker")
    assert keys.asked == []
