"""``upstream.pin_ca_files``: each key is one host, kept in the form targets are looked up in.

A key the proxy never looks up (``host:8443``, ``*.corp.example``, a URL) was accepted and ignored:
that host was then verified against the system store plus ``ca_file``, not "only that CA". Spellings
of one host (``::1``, ``[0:0::1]``; ``API.internal.``) are one key, and two of them are refused.
"""

from __future__ import annotations

import pytest

from signing_proxy.config import ConfigError, UpstreamConfig, parse_config

CA = "/etc/pins/ca.pem"


@pytest.mark.parametrize(
    "key",
    [
        "host:8443",  # a port: pins are per host (the lookup has no port)
        "[::1]:8443",
        "api.internal:",
        "*.corp.example",  # a pattern: pins are exact
        "*",
        "https://api.internal",  # a URL
        "api.internal/",  # a path
        "api.internal/x",
        "api.internal?x",
        "api.internal#x",
        "",  # not a host
        ".",
        "a..b",
        "bad host",
        " api.internal",
        "bücher.example",  # an IDN is named in its xn-- form, as targets carry it
        "[::1",
        "[not-v6]",
        "[fe80::1%eth0]",  # a zone names this machine's interface, never a peer's
        "fe80::1%eth0",
        "[127.0.0.1]",
    ],
)
def test_a_key_that_is_not_one_host_is_refused_and_named(key: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"upstream": {"pin_ca_files": {key: CA}}})
    said = str(err.value)
    assert said.startswith(f"upstream.pin_ca_files[{key!r}]: must be one host name or IP address"), said
    assert "no ':PORT', no '*.domain' pattern, no URL, path or userinfo" in said


@pytest.mark.parametrize(
    "key", ["alice@api.internal", "alice:s3cret@api.internal", "alice:s3cret@[::1]:8443"]
)
def test_a_key_with_userinfo_is_refused_without_showing_it(key: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"upstream": {"pin_ca_files": {key: CA}}})
    said = str(err.value)
    assert said.startswith("upstream.pin_ca_files[a key with an '@', not shown]: must be one host"), said
    assert "s3cret" not in said
    assert "alice" not in said


@pytest.mark.parametrize(
    ("first", "second", "host"),
    [
        ("::1", "[::1]", "[::1]"),
        ("[::1]", "[0:0::1]", "[::1]"),
        ("::1", "[0:0:0:0:0:0:0:1]", "[::1]"),
        ("[2001:DB8::1]", "2001:db8:0:0:0:0:0:1", "[2001:db8::1]"),
        ("api.internal", "api.internal.", "api.internal"),
        ("api.internal", "API.internal", "api.internal"),
        ("API.Internal.", "api.INTERNAL", "api.internal"),
    ],
)
def test_two_keys_for_one_host_are_refused_naming_both(first: str, second: str, host: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"upstream": {"pin_ca_files": {first: "/a.pem", second: "/b.pem"}}})
    assert str(err.value) == (
        f"upstream.pin_ca_files[{second!r}]: upstream.pin_ca_files[{first!r}] pins {host} too: keep one"
    )


@pytest.mark.parametrize(
    ("key", "host"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("localhost", "localhost"),
        ("API.internal", "api.internal"),
        ("api.internal.", "api.internal"),
        ("API.Internal.", "api.internal"),
        ("::1", "[::1]"),  # a bare IPv6 address: no port can hide in it (a host:port has one ':')
        ("[::1]", "[::1]"),
        ("[0:0::1]", "[::1]"),
        ("[0000:0000:0000:0000:0000:0000:0000:0001]", "[::1]"),
        ("[2001:DB8:0:0:0:0:0:1]", "[2001:db8::1]"),
        ("[::FFFF:127.0.0.1]", "[::ffff:7f00:1]"),  # the hex form core.uri.ipv6_text gives targets
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("svc_a.internal", "svc_a.internal"),
    ],
)
def test_a_key_is_kept_in_the_form_targets_are_looked_up_in(key: str, host: str) -> None:
    upstream = parse_config({"upstream": {"pin_ca_files": {key: CA}}}).upstream
    assert upstream.pinned() == {host: CA}
    assert upstream.pin_ca_files == {key: CA}  # the file's spelling stays what the file said


def test_several_hosts_keep_their_own_files() -> None:
    upstream = UpstreamConfig(pin_ca_files={"::1": "/v6.pem", "A.example.": "/a.pem", "b.example": "/b.pem"})
    assert upstream.pinned() == {"[::1]": "/v6.pem", "a.example": "/a.pem", "b.example": "/b.pem"}


def test_a_section_built_in_code_is_checked_when_its_pins_are_read() -> None:
    """The library's callers build UpstreamConfig themselves: no _check runs, ``pinned`` refuses."""
    with pytest.raises(ConfigError, match=r"^upstream\.pin_ca_files\['host:8443'\]: must be one host"):
        UpstreamConfig(pin_ca_files={"host:8443": CA}).pinned()


def test_an_override_keeps_the_check() -> None:
    config = parse_config({"upstream": {"pin_ca_files": {"api.internal": CA}}})
    with pytest.raises(ConfigError, match=r"^upstream\.pin_ca_files\['\*\.corp\.example'\]: "):
        config.with_overrides(**{"upstream.pin_ca_files": {"*.corp.example": CA}})
