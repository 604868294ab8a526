"""``net.egress.EgressPolicy``: which URLs named by a remote party may be fetched, and at which address.

``check_url`` is pure; ``vet`` resolves through the running loop's ``getaddrinfo``, which these tests
replace (on that loop only) to make a DNS name resolve to loopback, private or mixed addresses. The
fetches themselves, over real loopback sockets, are in ``test_client.py``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from signing_proxy.config import EgressConfig
from signing_proxy.core.uri import Target
from signing_proxy.errors import ConfigError, EgressError, http_status
from signing_proxy.net.egress import CHECKED_URLS_MAX, MAX_URL_CHARS, EgressPolicy, forbidden_class

POLICY = EgressPolicy()
REASONS = {f"egress-{r}" for r in ("scheme", "userinfo", "query", "fragment", "host", "url", "address")}
LOOPBACK_OK = EgressPolicy(["127.0.0.1/32"])


def refused(policy: EgressPolicy, url: str, *, allow_query: bool = True) -> EgressError:
    with pytest.raises(EgressError) as err:
        policy.check_url(url, allow_query=allow_query)
    return err.value


class FakeResolver:
    """Stands in for ``loop.getaddrinfo``: answers ``answers[n]`` to the n-th call (the last one after)."""

    def __init__(self, *answers: Sequence[str] | BaseException) -> None:
        self.answers = answers
        self.calls: list[str] = []

    async def __call__(self, host: str, port: int, **_kw: Any) -> list[tuple[Any, ...]]:
        self.calls.append(host)
        answer = self.answers[min(len(self.calls), len(self.answers)) - 1]
        if isinstance(answer, BaseException):
            raise answer
        out: list[tuple[Any, ...]] = []
        for addr in answer:
            if ":" in addr:
                out.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (addr, port, 0, 0)))
            else:
                out.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (addr, port)))
        return out


def resolve_as(monkeypatch: pytest.MonkeyPatch, *answers: Sequence[str] | BaseException) -> FakeResolver:
    fake = FakeResolver(*answers)
    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", fake)
    return fake


# --- check_url: shapes refused before any I/O --------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://agent.example/", "egress-scheme"),
        ("agent.example/", "egress-scheme"),
        ("https:/agent.example/", "egress-scheme"),
        ("http://agent.example/", "egress-scheme"),  # nothing allow-listed: plain http can never pass
        ("https://user:pw@agent.example/", "egress-userinfo"),
        ("https://agent.example@127.0.0.1/", "egress-userinfo"),
        ("https://agent.example\\@127.0.0.1/", "egress-userinfo"),
        ("https://agent.example/x#y", "egress-fragment"),
        ("https://169.254.169.254/latest/meta-data/iam/security-credentials/role#", "egress-fragment"),
        ("https://agent.example/#", "egress-fragment"),
        ("https://a..b/", "egress-host"),
        ("https:///path", "egress-host"),
        ("https://-a.example/", "egress-host"),
        ("https://a_b.example/", "egress-host"),
        ("https://agent.example./", "egress-host"),
        ("https://" + "a" * 64 + ".example/", "egress-host"),
        ("https://127.1/", "egress-host"),  # inet_aton short forms would reach 127.0.0.1
        ("https://0x7f.0.0.1/", "egress-host"),
        ("https://2130706433/", "egress-host"),
        ("https://127.000.000.001/", "egress-host"),
        ("https://[fe80::1%25eth0]/", "egress-host"),
        ("https://[::1/", "egress-host"),
        ("https://[::1]x/", "egress-host"),
        ("https://agent.example:0/", "egress-host"),
        ("https://agent.example:65536/", "egress-host"),
        ("https://agent.example:443x/", "egress-host"),
        ("https://exämple.com/", "egress-url"),
        ("https://agent.example/a b", "egress-url"),
        ("https://agent.example/a\\b", "egress-url"),
        (" https://agent.example/", "egress-url"),
        ("https://agent.example/" + "a" * MAX_URL_CHARS, "egress-url"),
    ],
)
def test_a_bad_shape_is_refused_with_its_rule(url: str, reason: str) -> None:
    assert refused(POLICY, url).reason == reason


def test_a_query_is_refused_only_where_the_caller_says_so() -> None:
    for url in ("https://agent.example/?x=1", "https://agent.example?x", "https://agent.example/?"):
        assert refused(POLICY, url, allow_query=False).reason == "egress-query"
    assert POLICY.check_url("https://agent.example/list?x=1").path_query == "/list?x=1"


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",  # loopback
        "127.8.9.10",
        "10.1.2.3",  # RFC 1918
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # link-local: cloud metadata
        "100.64.0.1",  # CGNAT
        "0.0.0.0",  # unspecified
        "224.0.0.1",  # multicast
        "255.255.255.255",
        "240.0.0.1",
        "192.0.2.1",  # documentation
        "198.18.0.1",  # benchmarking
        "[::1]",
        "[::]",
        "[::ffff:127.0.0.1]",  # IPv4-mapped
        "[::ffff:10.0.0.1]",
        "[::127.0.0.1]",  # IPv4-compatible (deprecated)
        "[fe80::1]",
        "[fc00::1]",
        "[fd12:3456::1]",
        "[ff02::1]",
        "[64:ff9b::7f00:1]",  # NAT64 of 127.0.0.1
        "[64:ff9b::a9fe:a9fe]",  # NAT64 of 169.254.169.254
        "[2002:7f00:1::]",  # 6to4 of 127.0.0.1
        "[2002:a00:1::1]",  # 6to4 of 10.0.0.1
        "[2001::1]",  # Teredo
        "[2001:db8::1]",
        "[100::1]",
        "[4000::1]",  # outside 2000::/3
    ],
)
def test_a_forbidden_address_literal_is_refused_at_once(host: str) -> None:
    err = refused(POLICY, f"https://{host}/.well-known/x")
    assert err.reason == "egress-address"
    assert http_status(err) == 403


@pytest.mark.parametrize(
    "url",
    [
        "https://agent.example/",
        "https://8.8.8.8/",
        "https://[2606:4700:4700::1111]/",
        "https://[::ffff:8.8.8.8]/",  # mapped public: the address it reaches is public
        "https://[64:ff9b::808:808]/",  # NAT64 of a public address
        "https://[2002:808:808::1]/",  # 6to4 of a public address
        "https://xn--bcher-kva.example:8443/a/b",
        "https://1e100.net/",
    ],
)
def test_a_public_https_url_passes(url: str) -> None:
    target = POLICY.check_url(url, allow_query=False)
    assert target.scheme == "https"
    assert POLICY.check_url(target.uri) == target


def test_check_url_returns_the_canonical_target() -> None:
    target = POLICY.check_url("HTTPS://Agent.Example:443")
    assert target == Target("https", "agent.example", 443, "/")


def test_check_url_remembers_accepted_urls_only_and_boundedly() -> None:
    policy = EgressPolicy()
    first = policy.check_url("https://Agent.Example/a", allow_query=False)
    assert policy.check_url("https://Agent.Example/a", allow_query=False) is first  # remembered
    assert policy.check_url("https://agent.example/a?x", allow_query=True).path_query == "/a?x"
    for _ in range(2):  # a refusal is decided again each time, never remembered
        assert refused(policy, "https://agent.example/a?x", allow_query=False).reason == "egress-query"
        assert refused(policy, "https://127.0.0.1/").reason == "egress-address"
    for n in range(CHECKED_URLS_MAX + 500):  # a stranger naming a new URL each time
        policy.check_url(f"https://agent{n}.example/")
    assert len(policy._checked) == CHECKED_URLS_MAX
    assert policy.check_url("https://agent.example/a", allow_query=False) == first  # still the answer


def test_allow_private_admits_its_addresses_also_over_http() -> None:
    assert LOOPBACK_OK.check_url("http://127.0.0.1:8080/d").uri == "http://127.0.0.1:8080/d"
    assert LOOPBACK_OK.check_url("https://127.0.0.1/d").host == "127.0.0.1"
    assert LOOPBACK_OK.check_url("http://[::ffff:127.0.0.1]/").host == "[::ffff:127.0.0.1]"
    assert refused(LOOPBACK_OK, "http://127.0.0.2/").reason == "egress-address"  # not in the list
    assert refused(LOOPBACK_OK, "http://8.8.8.8/").reason == "egress-scheme"  # public, but plain http
    # a DNS name over http waits for resolution: only then is it known whether its addresses are listed
    assert LOOPBACK_OK.check_url("http://dev.test/").scheme == "http"


def test_the_allow_list_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"allow_private\[1\]"):
        EgressPolicy(["10.0.0.0/8", "ten"])
    with pytest.raises(ConfigError):
        EgressPolicy("10.0.0.0/8")  # a string is a sequence too: one CIDR per character is a mistake
    policy = EgressPolicy.from_config(EgressConfig(allow_private=("10.0.0.0/8", "fd00::/8", "192.168.1.7")))
    assert [str(n) for n in policy.allow_private] == ["10.0.0.0/8", "fd00::/8", "192.168.1.7/32"]
    assert policy.check_url("https://[fd00::5]/").host == "[fd00::5]"


def test_public_addresses_have_no_forbidden_class() -> None:
    for text in ("8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "2a00:1450::1"):
        assert forbidden_class(ipaddress.ip_address(text)) is None
    assert forbidden_class(ipaddress.ip_address("::ffff:169.254.169.254")) == "IPv4-mapped link-local"


# --- vet: every resolved address passes, and the first is the one connected to ------------------------


async def test_vet_returns_the_first_resolved_address(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = resolve_as(monkeypatch, ["93.184.216.34", "2606:2800:220:1::1"])
    assert await POLICY.vet(POLICY.check_url("https://agent.example/")) == "93.184.216.34"
    assert fake.calls == ["agent.example"]


@pytest.mark.parametrize(
    "addresses",
    [
        ["10.0.0.5"],
        ["127.0.0.1"],
        ["169.254.169.254"],
        ["100.100.100.200"],
        ["::1"],
        ["::ffff:127.0.0.1"],
        ["fe80::1%2"],
        ["0.0.0.0"],
        ["93.184.216.34", "192.168.0.10"],  # one bad address refuses the name
    ],
)
async def test_a_name_resolving_to_a_forbidden_address_is_refused(
    monkeypatch: pytest.MonkeyPatch, addresses: list[str]
) -> None:
    resolve_as(monkeypatch, addresses)
    with pytest.raises(EgressError) as err:
        await POLICY.vet(POLICY.check_url("https://internal.example/"))
    assert err.value.reason == "egress-address"
    assert "internal.example" in err.value.detail
    assert not any(a.split("%")[0] in err.value.detail for a in addresses)  # never the address list


async def test_http_to_a_name_needs_every_address_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = EgressPolicy(["127.0.0.0/8"])
    resolve_as(monkeypatch, ["127.0.0.1", "::ffff:127.0.0.2"], ["127.0.0.1", "93.184.216.34"])
    target = policy.check_url("http://localhost:8080/")
    assert await policy.vet(target) == "127.0.0.1"
    with pytest.raises(EgressError) as err:
        await policy.vet(target)
    assert err.value.reason == "egress-scheme"


async def test_an_unresolvable_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    resolve_as(monkeypatch, socket.gaierror(socket.EAI_NONAME, "Name or service not known"), [])
    target = POLICY.check_url("https://nowhere.example/")
    for _ in range(2):  # the resolver fails, then answers with no address
        with pytest.raises(EgressError) as err:
            await POLICY.vet(target)
        assert err.value.reason == "egress-unresolvable"


async def test_an_address_literal_is_never_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = resolve_as(monkeypatch, ["10.0.0.1"])
    assert (
        await POLICY.vet(POLICY.check_url("https://[2606:4700:4700::1111]:8443/")) == "2606:4700:4700::1111"
    )
    assert await LOOPBACK_OK.vet(LOOPBACK_OK.check_url("http://127.0.0.1/")) == "127.0.0.1"
    assert fake.calls == []


async def test_vet_rechecks_a_target_it_did_not_build() -> None:
    for target, reason in [
        (Target("ftp", "agent.example", 21, "/"), "egress-scheme"),
        (Target("https", "a..b", 443, "/"), "egress-host"),
        (Target("https", "127.0.0.1", 443, "/"), "egress-address"),
    ]:
        with pytest.raises(EgressError) as err:
            await POLICY.vet(target)
        assert err.value.reason == reason


# --- property: arbitrary text yields a Target or an EgressError, nothing else --------------------------

_URLISH = st.builds(
    lambda scheme, authority, rest: f"{scheme}://{authority}{rest}",
    st.sampled_from(["https", "http", "HTTPS", "ftp", ""]),
    st.one_of(
        st.text(max_size=40),
        st.from_regex(r"\A[a-z0-9.\-]{1,30}(:[0-9]{0,6})?\Z"),
        st.from_regex(r"\A\[[0-9a-f:.%]{0,40}\](:[0-9]{0,6})?\Z"),
        st.from_regex(r"\A[0-9x.]{1,20}\Z"),
    ),
    st.text(max_size=40),
)


@settings(max_examples=400, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(url=st.one_of(st.text(), _URLISH), allow_query=st.booleans(), listed=st.booleans())
def test_check_url_yields_a_target_or_an_egress_error(url: str, allow_query: bool, listed: bool) -> None:
    policy = LOOPBACK_OK if listed else POLICY
    try:
        target = policy.check_url(url, allow_query=allow_query)
    except EgressError as exc:
        reason = exc.reason
    else:
        reason = ""
    if reason:
        assert reason in REASONS
        return
    assert target.scheme in ("https", "http")
    assert "#" not in target.uri
    assert "@" not in target.authority
    assert allow_query or "?" not in target.path_query
    assert policy.check_url(target.uri, allow_query=allow_query) == target  # canonical: a fixed point
