from __future__ import annotations

import json

import pytest

from signing_proxy.core.errors import FieldError, KeyFormatError
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import PublicKey, SigningKey, load_private_key, public_key_from_jwk
from signing_proxy.core.signatures import Component, Message, component_value
from signing_proxy.core.uri import (
    directory_base,
    forwarded_target,
    host_authority,
    ipv6_text,
    parse_absolute_uri,
    parse_received_uri,
    received_authority,
    spelled,
    valid_host_field,
)
from signing_proxy.net.framing import serialize_head


def test_fields_absent_is_not_empty() -> None:
    fields = Fields([("Authorization", "")])
    assert fields.combined("authorization") == ""
    assert fields.combined("signature-agent") is None


def test_fields_repeated_lines_join_with_comma_space_in_order() -> None:
    fields = Fields([("Accept", "a"), ("X", "1"), ("accept", "  b  ")])
    assert fields.combined("ACCEPT") == "a, b"
    assert fields.get_all("accept") == ["a", "  b  "]
    fields.set("Accept", "c")
    assert list(fields) == [("X", "1"), ("Accept", "c")]
    assert fields.remove("x", "accept") == 2
    assert len(fields) == 0


def test_fields_repr_hides_values() -> None:
    assert "secret" not in repr(Fields([("Authorization", "Bearer secret")]))


def test_key_pem_and_jwk_round_trip() -> None:
    key = SigningKey.generate()
    assert SigningKey.from_pem(key.to_pem()).thumbprint == key.thumbprint
    jwk = key.to_jwk()
    assert set(jwk) == {"kty", "crv", "x", "d"}
    assert load_private_key(json.dumps(jwk).encode()).thumbprint == key.thumbprint
    assert load_private_key(key.to_pem()).thumbprint == key.thumbprint
    assert public_key_from_jwk(key.public.jwk()).thumbprint == key.thumbprint
    assert jwk["d"] not in repr(key)
    assert PublicKey.from_raw(key.public.raw).verify(key.sign(b"x"), b"x")


@pytest.mark.parametrize(
    ("jwk", "reason"),
    [
        ({"kty": "RSA", "n": "x", "e": "AQAB"}, "unsupported-key-type"),
        ({"kty": "OKP", "crv": "X25519", "x": "A" * 43}, "unsupported-key-type"),
        ({"kty": "OKP", "crv": "Ed25519", "x": "AAAA"}, "malformed-jwk"),
        (
            {"kty": "OKP", "crv": "Ed25519", "x": "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs="},
            "malformed-jwk",
        ),
        (
            {"kty": "OKP", "crv": "Ed25519", "x": "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs", "d": "x"},
            "private-member-in-public-jwk",
        ),
    ],
)
def test_public_jwk_is_strict(jwk: dict[str, str], reason: str) -> None:
    with pytest.raises(KeyFormatError) as err:
        public_key_from_jwk(jwk)
    assert err.value.reason == reason


def test_private_jwk_with_mismatched_x_is_refused() -> None:
    a, b = SigningKey.generate(), SigningKey.generate()
    with pytest.raises(KeyFormatError):
        SigningKey.from_jwk({**a.to_jwk(), "x": b.public.jwk()["x"]})
    with pytest.raises(KeyFormatError):
        load_private_key(b"not a key")


@pytest.mark.parametrize(
    ("raw", "uri"),
    [
        ("http://Example.COM:80/a", "http://example.com/a"),
        ("HTTPS://example.com:443", "https://example.com/"),
        ("https://example.com:8443/p%2dq?x=%41", "https://example.com:8443/p%2dq?x=%41"),
        ("http://user:pw@example.com/x#frag", "http://example.com/x"),
        ("http://[::1]:8080/x?", "http://[::1]:8080/x"),
        # only an empty query is dropped: "a=1?" is what a handler reads, so a signature for "a=1"
        # must not pass for it (a covered component changed, the signature unbroken)
        ("http://example.com/q?a=1?", "http://example.com/q?a=1?"),
        ("http://example.com/q??", "http://example.com/q??"),
        ("http://example.com/q?#f", "http://example.com/q"),
        ("http://example.com?q=1", "http://example.com/?q=1"),
    ],
)
def test_target_uri_is_canonical_and_byte_exact(raw: str, uri: str) -> None:
    assert parse_absolute_uri(raw).uri == uri


@pytest.mark.parametrize(
    "raw",
    [
        "ftp://x/",
        "http://",
        "http://x:99999/",
        "http://x/a b",
        "http://[::1/",
        "http://x:\u00b2/",
        "http://x:\u0661/",
        "http://x/100%",  # RFC 3986 pct-encoded: "%" HEXDIG HEXDIG, and nothing else (a verifier
        "http://x/p?q=%2",  # rebuilding the URI refused these, which we signed)
        "http://x/%zz",
        "http://x/%%41",
        "http://x:" + "9" * 4301 + "/",  # int() refuses it with a ValueError, not our FieldError
        "http://x:" + "0" * 4300 + "99999/",
        # read as IPv4 by the resolver (127.0.0.1, 8.0.0.1), while rules and leaves saw a DNS name
        "http://2130706433/",
        "http://127.1/",
        "http://0x7f.1/",
        "http://0177.0.0.1/",
        "http://010.0.0.1/",
        "http://a.example.0X1F/",
        "http://1.2.3.4.5/",
    ],
)  # a superscript two and an Arabic-Indic one are digits to str.isdigit(), and int() refuses the first
def test_bad_targets_are_refused(raw: str) -> None:
    with pytest.raises(FieldError):
        parse_absolute_uri(raw)


@pytest.mark.parametrize(
    ("spelling", "base"),
    [
        ("https://agent.example", "https://agent.example"),
        ("HTTPS://Agent.EXAMPLE:443/", "https://agent.example"),  # RFC 3986 6.2.2.1, 6.2.3
        ("http://agent.example:80/dir/", "http://agent.example/dir"),
        ("https://agent.example:8443", "https://agent.example:8443"),
        ("https://agent.example/%7eme/%2f%41", "https://agent.example/~me/%2FA"),  # 6.2.2.2: unreserved
        ("https://agent.example:" + "0" * 4400 + "8443", "https://agent.example:8443"),  # leading zeros
    ],
)
def test_a_directory_base_has_one_spelling(spelling: str, base: str) -> None:
    """Every spelling of one directory keys the same cache entry and revocation state."""
    assert directory_base(spelling) == base


@pytest.mark.parametrize(
    "url",
    [
        "https://u@agent.example",
        "https://agent.example/?q",
        "https://agent.example#f",
        "https://a.example/%2e/x",
        "https://agent.example:" + "9" * 4301,  # refused as malformed, not an unexpected ValueError
    ],
)
def test_what_names_no_directory_base_is_refused(url: str) -> None:
    with pytest.raises(FieldError) as caught:
        directory_base(url)
    assert caught.value.reason == "malformed-signature-agent"


# what WHATWG URL parsing (Node's new URL(...).hostname) writes for each: checked against Node 20
@pytest.mark.parametrize(
    ("written", "canonical"),
    [
        ("2001:DB8:0:0:0:0:0:1", "2001:db8::1"),
        ("::ffff:127.0.0.1", "::ffff:7f00:1"),  # hex throughout, as WHATWG writes it
        ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),  # the first of two equal runs
        ("2001:db8:0:1:1:1:1:1", "2001:db8:0:1:1:1:1:1"),  # one zero group is not a run
        ("0:0:0:0:0:0:0:0", "::"),
        ("1:0:0:0:0:0:0:0", "1::"),
        ("2001:0db8:0000:0000:0001:0000:0000:0001", "2001:db8::1:0:0:1"),
        ("1:0:0:2:0:0:0:3", "1:0:0:2::3"),  # the longer run
    ],
)
def test_an_ipv6_literal_has_one_spelling(written: str, canonical: str) -> None:
    """The proxy signed and sent an IPv6 literal as the client wrote it; verifiers that rebuild
    ``@authority`` from a WHATWG URL (Cloudflare's) compress it, and refused ours."""
    target = parse_absolute_uri(f"http://[{written}]:8080/p")
    assert (target.host, target.authority) == (f"[{canonical}]", f"[{canonical}]:8080")
    assert ipv6_text(canonical) == canonical


@pytest.mark.parametrize("host", ["127.0.0.1", "1.2.3.4.", "a.example", "1a.example", "x.0xg", "x.0x1g"])
def test_names_that_only_look_numeric_and_dotted_quads_are_hosts(host: str) -> None:
    assert parse_absolute_uri(f"http://{host}/").host == host.lower()


def test_a_received_authority_is_normalized_only_as_rfc_9421_says() -> None:
    """@authority of a received message: lower case, no default port (RFC 9421 section 2.2.3), and
    an IPv6 literal as the client wrote it: a signer need not compress it."""
    received = "https://[2001:DB8:0:0::1]:443/x"
    message = Message("GET", parse_received_uri(received), Fields(()))
    assert component_value(message, Component("@authority")) == "[2001:db8:0:0::1]"
    for uri, authority in [
        ("http://Exchange.EXAMPLE:80/x", "exchange.example"),
        ("https://exchange.example:80/x", "exchange.example:80"),
        ("https://Exchange.example:0443/x", "exchange.example"),  # the default port, however written
        ("https://[2001:DB8::1]:0443/x", "[2001:db8::1]"),
        ("http://exchange.example:/x", "exchange.example"),  # an empty port is the default
        ("http://u@Exchange.example/x", "exchange.example"),  # userinfo is no part of it
        ("https://exchange.example/x", "exchange.example"),
    ]:
        assert received_authority(parse_received_uri(uri)) == authority, uri


@pytest.mark.parametrize(
    ("received", "authority", "request_target"),
    [
        ("https://Exchange.EXAMPLE:443/x?", "Exchange.EXAMPLE:443", "/x?"),
        ("http://[2001:DB8::A]:0080/a?b", "[2001:DB8::A]:0080", "/a?b"),
    ],
)
def test_a_relay_keeps_a_spelling_that_can_travel_on(
    received: str, authority: str, request_target: str
) -> None:
    target = forwarded_target(received)
    assert target == parse_absolute_uri(received)  # one target, whatever its spelling
    assert (target.wire_uri, target.wire_parts()) == (received, (authority, request_target))
    head = serialize_head("GET", target, [], 0, False).decode()
    assert head.startswith(f"GET {request_target} HTTP/1.1\r\nHost: {authority}\r\n")
    relayed = serialize_head("GET", target, [], 0, False, absolute_form=True).decode()
    assert relayed.startswith(f"GET {received} HTTP/1.1\r\nHost: {authority}\r\n")
    message = Message("GET", target, Fields(()))  # what a label over it covers is what is sent
    assert component_value(message, Component("@target-uri")) == received
    assert component_value(message, Component("@request-target")) == request_target


@pytest.mark.parametrize(
    "received",
    [
        "HTTPS://exchange.example/x",
        "https://u@exchange.example/x",
        "https://exchange.example?x",
        "https://exchange.example/x",
    ],
    ids=["upper-case-scheme", "userinfo", "no-path", "already-canonical"],
)
def test_a_spelling_the_next_hop_would_rebuild_otherwise_is_not_kept(received: str) -> None:
    target = forwarded_target(received)
    assert target.received is None
    assert (
        serialize_head("GET", target, [], 0, False)
        .decode()
        .startswith(f"GET {target.path_query} HTTP/1.1\r\nHost: exchange.example\r\n")
    )


def test_a_gateway_keeps_its_request_target_as_received() -> None:
    target = parse_absolute_uri("http://127.0.0.1:9000/x?")
    kept = spelled(target, "/x?")
    assert (kept, kept.received) == (target, "http://127.0.0.1:9000/x?")
    assert spelled(target, "/x") is target  # already its normal form
    assert spelled(target, "/x?#f") is target  # a fragment is never sent: the normal form goes


@pytest.mark.parametrize("value", ["example.com\u00a0", "\u0085example.com", "example.com:80\u00a0"])
def test_a_host_with_non_ascii_space_at_an_end_is_malformed_not_trimmed(value: str) -> None:
    """``str.strip()`` took U+00A0 and U+0085 (bytes 0xA0, 0x85 read as Latin-1) off a Host's ends,
    so ``example.com\\xa0`` was read as ``example.com``; only spaces and tabs are OWS."""
    with pytest.raises(FieldError) as refused:
        host_authority([value])
    assert refused.value.reason == "malformed-host"
    assert not valid_host_field(value)
    assert host_authority([" example.com\t"]) == "example.com"
