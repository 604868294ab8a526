"""Checks that need no I/O run before any I/O (DESIGN section 7), and issue 15 attack 5, "replay a
leaked request for years": a request that fails parse, label count, components, ``alg``, ``keyid``
shape, window or lifetime causes no network traffic at all — a counting directory server on loopback
(allow-listed) sees nothing — and is refused with its stable reason."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import pytest

from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.verify import HttpClient, VerificationError, VerifierPolicy, build_verifier
from tests.verify.strangers import BODY, LOOPBACK, TARGET, Host, directory_doc, forged, host, signed

AGENT = SigningKey.from_seed(bytes(range(32)))
TEN_YEARS = 10 * 365 * 86400


@pytest.fixture
async def counted() -> AsyncIterator[Host]:
    async with host() as found:
        found.directory(directory_doc(AGENT, now=int(time.time())))
        yield found


def edit(fields: Fields, name: str, change: Callable[[str], str]) -> Fields:
    fields.set(name, change(fields.combined(name) or ""))
    return fields


CASES: list[tuple[str, Callable[[str, int], Fields], str]] = [
    ("no signature", lambda a, n: Fields([("Signature-Agent", a)]), "missing-signature"),
    (
        "unparsable Signature-Input",
        lambda a, n: edit(signed(a, AGENT, now=n), "Signature-Input", lambda v: v + ",,("),
        "malformed-signature-input",
    ),
    (
        "too many labels",
        lambda a, n: edit(
            edit(signed(a, AGENT, now=n), "Signature-Input", lambda v: v + ', b=("@method");keyid="k"'),
            "Signature",
            lambda v: v + ", b=:AAAA:",
        ),
        "too-many-hops",
    ),
    (
        "a component missing",
        lambda a, n: edit(
            signed(a, AGENT, now=n), "Signature-Input", lambda v: v.replace(' "authorization"', "")
        ),
        "missing-covered-component",
    ),
    ("alg", lambda a, n: forged(a, AGENT.thumbprint, now=n, alg="rsa-pss-sha512"), "unsupported-algorithm"),
    (  # RFC 9421 section 2.3: alg is a String; the Token ed25519 compared equal to it
        "alg as a Token",
        lambda a, n: edit(
            forged(a, AGENT.thumbprint, now=n),
            "Signature-Input",
            lambda v: v.replace('alg="ed25519"', "alg=ed25519"),
        ),
        "unsupported-algorithm",
    ),
    (  # and nonce a String: an Integer passed under the spec's profile
        "nonce as an Integer",
        lambda a, n: edit(forged(a, AGENT.thumbprint, now=n), "Signature-Input", lambda v: v + ";nonce=5"),
        "malformed-signature-input",
    ),
    ("keyid shape", lambda a, n: forged(a, "key-1", now=n), "unknown-keyid"),
    ("expired", lambda a, n: signed(a, AGENT, now=n, created=n - 120, expires=n - 1), "signature-expired"),
    (
        "expired by 1 s, within skew",
        lambda a, n: signed(a, AGENT, now=n, created=n - 60, expires=n - 1),
        "signature-expired",
    ),
    ("from the future", lambda a, n: signed(a, AGENT, now=n, created=n + 60), "signature-not-yet-valid"),
    (
        "valid for ten years",
        lambda a, n: signed(a, AGENT, now=n, created=1, expires=n + TEN_YEARS),
        "validity-too-long",
    ),
    (
        "an hour and a second",
        lambda a, n: signed(a, AGENT, now=n, created=n, expires=n + 3601),
        "validity-too-long",
    ),
]


@pytest.mark.parametrize(("case", "build", "reason"), CASES, ids=[c[0] for c in CASES])
async def test_cheap_checks_refuse_before_any_fetch(
    counted: Host, case: str, build: Callable[[str, int], Fields], reason: str
) -> None:
    async with HttpClient.standalone() as client:
        verifier = build_verifier(VerifierPolicy(max_hops=1), client=client, egress=LOOPBACK)
        with pytest.raises(VerificationError) as err:
            await verifier.verify("POST", TARGET, build(f'"{counted.base}"', int(time.time())), BODY)
        await verifier.close()
    assert err.value.reason == reason, err.value
    assert counted.seen == [], case


async def test_cheap_checks_a_missing_covered_header_is_refused_before_any_fetch(counted: Host) -> None:
    fields = signed(f'"{counted.base}"', AGENT, now=int(time.time()))
    fields.remove("authorization")
    async with HttpClient.standalone() as client:
        verifier = build_verifier(client=client, egress=LOOPBACK)
        with pytest.raises(VerificationError) as err:
            await verifier.verify("POST", TARGET, fields, BODY)
        await verifier.close()
    assert (err.value.reason, counted.seen) == ("missing-covered-header", [])


async def test_cheap_checks_a_tampered_body_is_refused_before_any_fetch(counted: Host) -> None:
    fields = signed(f'"{counted.base}"', AGENT, now=int(time.time()))
    async with HttpClient.standalone() as client:
        verifier = build_verifier(client=client, egress=LOOPBACK)
        with pytest.raises(VerificationError) as err:
            await verifier.verify("POST", TARGET, fields, b'{"ver":"2.0"}')
        await verifier.close()
    assert (err.value.reason, counted.seen) == ("content-digest-mismatch", [])


async def test_cheap_checks_pass_then_one_fetch_and_the_request_verifies(counted: Host) -> None:
    now = int(time.time())
    async with HttpClient.standalone() as client:
        verifier = build_verifier(client=client, egress=LOOPBACK)
        stack = await verifier.verify("POST", TARGET, signed(f'"{counted.base}"', AGENT, now=now), BODY)
        await verifier.close()
    assert stack.agent.keyid == AGENT.thumbprint
    assert len(counted.seen) == 1
