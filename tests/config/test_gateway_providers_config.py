"""``gateway.providers`` takes what the manifest watcher can fetch and compare: a provider's domain
(a port allowed) or its base URL; an entry that is neither (a path, a trailing slash, a space,
userinfo) is refused at load with its index, instead of a watcher that never checks it."""

from __future__ import annotations

import pytest

from signing_proxy.config import ConfigError, parse_config


def gateway(*providers: str) -> dict[str, object]:
    return {"gateway": {"providers": list(providers), "exchange_domain": "exchange.example"}}


@pytest.mark.parametrize(
    "provider",
    [
        "pub.example",
        "PUB.Example.",
        "pub.example:8443",
        "203.0.113.7",
        "[2001:db8::1]",
        "http://127.0.0.1:8443",
        "https://pub.example/base/",
    ],
)
def test_a_provider_domain_or_base_url_is_accepted(provider: str) -> None:
    assert parse_config(gateway(provider)).gateway.providers == (provider,)


@pytest.mark.parametrize(
    "provider",
    [
        "pub-a.example/",
        "pub.example/sub",
        "not a host!",
        "",
        "-pub.example",
        "pub.example:0",
        "bücher.example",
        "https://pub.example:abc",
        "https://[::1",
        "https://pub_ex!ample/",
        "https://pub.example:0",
    ],
)
def test_a_provider_that_is_no_host_is_refused(provider: str) -> None:
    with pytest.raises(ConfigError, match=r"^gateway\.providers\[1\]: a provider's domain"):
        parse_config(gateway("pub.example", provider))


@pytest.mark.parametrize(
    ("provider", "message"),
    [
        ("alice:s3cret@pub.example", "a value not shown"),
        ("https://pub.example/?page=1", "no query"),
        ("ftp://pub.example", "must be an absolute http(s) URL"),
        ("https://alice:s3cret@pub.example", "without user:password@"),
    ],
)
def test_a_provider_url_is_checked_as_a_url_and_never_quoted_with_a_password(
    provider: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=r"^gateway\.providers\[0\]: ") as caught:
        parse_config(gateway(provider))
    assert message in str(caught.value)
    assert "s3cret" not in str(caught.value)
