"""RFC 7512 PKCS#11 URIs: the attributes that name a token key, strict refusals, no PIN shown."""

from __future__ import annotations

import pytest

from signing_proxy.core.errors import KeyFormatError
from signing_proxy.core.pkcs11_uri import Pkcs11Uri, is_pkcs11_uri, mask_pin_value, parse_pkcs11_uri


def test_path_and_query_attributes_are_read_and_percent_decoded() -> None:
    uri = parse_pkcs11_uri(
        "pkcs11:token=Agent%20keys;serial=0a1b;object=agent-2026;id=%01%FF;type=private"
        "?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/run/secrets/pin"
    )
    assert uri.token == "Agent keys"
    assert uri.serial == "0a1b"
    assert uri.object == "agent-2026"
    assert uri.id == b"\x01\xff"
    assert uri.module_path == "/usr/lib/softhsm/libsofthsm2.so"
    assert uri.pin_source == "file:/run/secrets/pin"
    assert uri.pin_value is None


def test_rfc7512_examples_with_a_key_parse() -> None:  # RFC 7512 section 3 (those naming an object)
    uri = parse_pkcs11_uri(
        "pkcs11:token=The%20Software%20PKCS%2311%20Softtoken;manufacturer=Snake%20Oil,%20Inc.;"
        "model=1.0;object=my-certificate;type=private;id=%69%95%3E%5C%F4%BD%EC%91"
    )
    assert uri.token == "The Software PKCS#11 Softtoken"
    assert uri.manufacturer == "Snake Oil, Inc."
    assert uri.id == bytes.fromhex("69953e5cf4bdec91")
    assert parse_pkcs11_uri("pkcs11:object=my-sign-key;type=private?module-name=mypkcs11").object == (
        "my-sign-key"
    )


def test_the_pin_value_is_read_but_never_shown() -> None:
    uri = parse_pkcs11_uri("pkcs11:token=t;object=k?pin-value=1234")
    assert uri.pin_value == "1234"
    assert "1234" not in str(uri)
    assert "1234" not in repr(uri)
    assert mask_pin_value("pkcs11:token=t;object=k?pin-value=1234&module-path=/m.so") == (
        "pkcs11:token=t;object=k?pin-value=(not shown)&module-path=/m.so"
    )


PIN = "s3cr3t-4711"


@pytest.mark.parametrize(
    "text",
    [
        f"pkcs11:token=t;object=k?module-path=/m.so&pin-value{PIN}",  # the "=" forgotten
        f"pkcs11:token=t;object=k?pin-value:{PIN}",  # ":" for "="
        f"pkcs11:token=t;object=k?pin_value={PIN}",  # "_" for "-"
        f"pkcs11:token=t;object=k?pin-value={PIN} ",  # a character to percent-encode
        f"pkcs11:token=t;object=k?pin-value={PIN}^",
        f"pkcs11:token=t;object=k;pin-value={PIN}",  # ";" for "?"
        f"pkcs11:token=t;object=k?pin-value={PIN}%zz",
        # a PIN with an unencoded "&": what follows it reads as items of their own
        "pkcs11:token=t;object=k?pin-value=ab&s3cr3t-4711",
        "pkcs11:token=t;object=k?pin-value=ab&s3cr3t-4711=1",
        "pkcs11:token=t;object=k?pin-value=ab&s3cr3t=4711",
    ],
)
def test_a_mistyped_pin_value_is_refused_without_showing_the_pin(text: str) -> None:
    """The refusals echoed the item ("query attribute 'pin-values3cr3t-4711' is not name=value")
    or the PIN's character that needed percent-encoding."""
    with pytest.raises(KeyFormatError) as caught:
        parse_pkcs11_uri(text)
    assert caught.value.reason == "bad-pkcs11-uri"
    assert PIN not in caught.value.detail
    assert not any(part in caught.value.detail for part in ("s3cr3t", "4711", "' '", "'^'"))


def test_mask_pin_value_covers_mistyped_forms() -> None:
    for typo in (f"pin-value{PIN}", f"pin-value:{PIN}", f"PIN_VALUE={PIN}", f"pinvalue={PIN}"):
        masked = mask_pin_value(f"pkcs11;token=t;object=k?{typo}&module-path=/m.so")
        assert PIN not in masked
        assert masked.endswith("(not shown)&module-path=/m.so")


def test_str_round_trips() -> None:
    text = "pkcs11:token=Agent%20keys;object=agent;id=%01%02?module-path=/usr/lib/m.so"
    uri = parse_pkcs11_uri(text)
    assert str(uri) == text
    assert parse_pkcs11_uri(str(uri)) == uri


def test_values_are_quoted_as_rfc_7512_says_for_a_path_and_for_a_query() -> None:
    """A "/" is no pk11-path-res-avail character (it was left as it is in a path value); "|" is a
    query value's (it was refused in one)."""
    uri = Pkcs11Uri(
        token="ops/keys", object="team&agent", module_path="/usr/lib/m.so", pin_source="|/bin/pin"
    )
    assert (
        str(uri) == "pkcs11:token=ops%2Fkeys;object=team&agent?module-path=/usr/lib/m.so&pin-source=|/bin/pin"
    )
    assert parse_pkcs11_uri(str(uri)) == uri
    with pytest.raises(KeyFormatError, match="must be percent-encoded"):
        parse_pkcs11_uri("pkcs11:token=a|b;object=k")


def test_vendor_attributes_are_ignored_and_the_scheme_is_case_insensitive() -> None:
    assert parse_pkcs11_uri("PKCS11:token=t;x-vendor=1;object=k?x-other=2").object == "k"
    assert is_pkcs11_uri("Pkcs11:object=k")
    assert not is_pkcs11_uri("/etc/keys/agent.pem")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("file:/etc/key.pem", "starts with 'pkcs11:'"),
        ("pkcs11:token=t", "name the key"),
        ("pkcs11:token=t;object=a;object=b", "appears twice"),
        ("pkcs11:token=t;object=k;colour=blue", "unknown path attribute"),
        ("pkcs11:token=t;object=k?pin=1", "unknown query attribute"),
        ("pkcs11:token=t;object=k%2", "percent-encoding"),
        ("pkcs11:token=t;object=k%zz", "percent-encoding"),
        ("pkcs11:token=t;object=a b", "must be percent-encoded"),
        ("pkcs11:token=t;object=k;type=public", "type=private"),
        ("pkcs11:token=t;object", "name=value"),
        ("pkcs11:token=t;id=", "empty"),
        ("pkcs11:object=k?pin-value=1&pin-source=/f", "not both"),
        ("pkcs11:object=%FF", "not UTF-8"),
    ],
)
def test_malformed_uris_are_refused(text: str, words: str) -> None:
    with pytest.raises(KeyFormatError) as caught:
        parse_pkcs11_uri(text)
    assert caught.value.reason == "bad-pkcs11-uri"
    assert words in caught.value.detail


@pytest.mark.parametrize(
    ("text", "attribute", "found"),
    [
        # "&" for "?": RFC 7512 lets "&" and "=" into a path value, so this was object label
        # "k&pin-value=s3cr3t-4711", shown in every message naming the key
        (f"pkcs11:token=t;object=k&pin-value={PIN}", "object", "pin-value"),
        (f"pkcs11:token=t&PIN_VALUE={PIN};object=k", "token", "pin-value"),
        (f"pkcs11:token=t;object=k&Pin-Value:{PIN}", "object", "pin-value"),
        (f"pkcs11:token=t;object=k&pin-value{PIN}", "object", "pin-value"),  # the "=" forgotten too
        (f"pkcs11:token=t;object=k%26pin-value%3D{PIN}", "object", "pin-value"),  # percent-encoded
        (f"pkcs11:token=t;serial=k&pinvalue={PIN};object=k", "serial", "pin-value"),
        (f"pkcs11:token=t;object=k?module-path=/m.so?pin-value={PIN}", "module-path", "pin-value"),
        (f"pkcs11:token=t;object=k?pin-source=/run/pin?pin_value={PIN}", "pin-source", "pin-value"),
        ("pkcs11:token=t;object=k&pin-source=/run/s3cr3t-4711", "object", "pin-source"),
        ("pkcs11:token=t;object=k&module-path=/s3cr3t-4711.so", "object", "module-path"),
    ],
)
def test_a_query_attribute_in_a_value_is_refused_without_showing_it(
    text: str, attribute: str, found: str
) -> None:
    with pytest.raises(KeyFormatError) as caught:
        parse_pkcs11_uri(text)
    assert caught.value.reason == "bad-pkcs11-uri"
    assert f"attribute {attribute!r}: its value holds what looks like query attribute {found!r}" in (
        caught.value.detail
    )
    assert "(pkcs11:...?" + found + "=...)" in caught.value.detail  # where it belongs
    for shown in (caught.value.detail, str(caught.value)):
        assert not any(part in shown for part in (PIN, "s3cr3t", "4711"))
    if found == "pin-value":
        assert "signing.pkcs11.pin_env or pin_file" in caught.value.detail


def test_look_alikes_of_query_attributes_in_values_still_parse() -> None:
    """A label with "&" (RFC 7512 allows it), a PIN file whose name says pin-value, an id whose
    bytes spell one (an id is shown in hex): nothing misplaced, each shown whole."""
    for text in (
        "pkcs11:token=R&D;object=team&agent",
        "pkcs11:token=t;object=k?pin-source=file:/run/secrets/hsm-pin-value",
        "pkcs11:token=t;object=k?module-path=/opt/pin-source/m.so",
        "pkcs11:token=t;object=pin-source-key",
        "pkcs11:token=t;id=%70%69%6E%2D%76%61%6C%75%65",
    ):
        uri = parse_pkcs11_uri(text)
        assert str(uri) == text
        assert "not shown" not in uri.describe()


def test_a_pin_in_another_value_is_never_shown() -> None:
    """A second line of defence, for a Pkcs11Uri not made by parse_pkcs11_uri: ``describe()``
    (every message naming a token key) and ``str`` hid a pin-value only in its own attribute."""
    uri = Pkcs11Uri(
        token=f"t&pin-value={PIN} x",
        serial="0a1b",
        object=f"k&PIN_VALUE:{PIN}&more",
        module_path=f"/m.so?pin-value={PIN}",
        pin_source=f"/run/pin;pinvalue{PIN}",
    )
    for shown in (uri.describe(), str(uri), repr(uri)):
        assert not any(part in shown for part in (PIN, "s3cr3t", "4711")), shown
    assert uri.describe() == "object 'k&PIN_VALUE:(not shown)' on token 't&pin-value=(not shown)'"
    assert str(uri).startswith("pkcs11:token=t&pin-value%3D(not shown);serial=0a1b;")
