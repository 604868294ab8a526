"""The one-pass path for the common request (``pipeline._sign_plain``) makes exactly the bytes of the
general path (``_build`` + ``Signer.sign`` + ``outgoing``), or steps aside: generated requests and
configurations, in-process, no network. The general path is the reference; the one-pass path must
never sign what it would not, nor sign anything differently."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.core.uri import Target, parse_absolute_uri
from signing_proxy.errors import ProxyError
from signing_proxy.metrics import Metrics
from signing_proxy.net.framing import Outgoing
from signing_proxy.proxy.pipeline import BearerStore, Signer, SigningPipeline, _sign_plain
from signing_proxy.proxy.profiles import ProfileSelector
from signing_proxy.proxy.signer import Repeats
from signing_proxy.proxy.transactions import TransactionKeys
from tests.oracle import oracle_verify

KEY = SigningKey.from_seed(bytes(range(32)))
NOW = 1_900_000_000.5
ENV = {"TOKEN": "t0ken"}

CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "signature-agent": {"signing": {"signature_agent": "https://agent.example/dir"}},
    "next-hop": {"upstream": {"next_hop": "http://relay.example:8080"}},
    "bearer": {"credentials": [{"hosts": ["*.example"], "bearer_env": "TOKEN", "allow_plaintext": True}]},
    "bearer-override": {
        "credentials": [
            {"hosts": ["api.example"], "bearer_env": "TOKEN", "override": True, "allow_plaintext": True}
        ]
    },
    "unsigned-host": {"hosts": {"unsigned": ["static.example"]}},
    "profiles": {"profiles": {"rules": [{"hosts": ["bot.example"], "profile": "web-bot-auth"}]}},
    "short-validity": {"signing": {"validity_s": 1}},
    "label": {"signing": {"label": "proxy-1"}},
}

_token = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12)
_name = st.one_of(
    st.sampled_from(
        [
            "Accept",
            "Content-Type",
            "authorization",
            "Authorization",
            "Connection",
            "Keep-Alive",
            "TE",
            "Host",
            "Content-Length",
            "Expect",
            "Signature",
            "signature-input",
            "Signature-Agent",
            "Signature-Key",
            "Content-Digest",
            "Proxy-Authorization",
            "X-Trace",
        ]
    ),
    _token,
)
_value = st.one_of(
    st.sampled_from(["", " padded\t", "close", "x-trace, keep-alive", "Bearer agent's", "a\rb", "caf\u00e9"]),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20),
    st.text(st.characters(min_codepoint=0x09, max_codepoint=0x2FF), max_size=8),
)
_url = st.builds(
    lambda host, port, path, query: f"{'http'}://{host}{port}/{path}{query}",
    st.sampled_from(["api.example", "static.example", "bot.example", "127.0.0.1", "other.test"]),
    st.sampled_from(["", ":8443", ":80"]),
    st.sampled_from(["", "svc", "a/b%20c", "x;y"]),
    st.sampled_from(["", "?q=1", f"?agent_id={KEY.thumbprint}", "?agent_id=someone-else"]),
)


def pipeline(name: str, metrics: Metrics | None = None) -> SigningPipeline:
    config = parse_config(CONFIGS[name])
    keys = StaticKeyProvider(KEY)
    signer = Signer(
        keys,
        label=config.signing.label,
        validity_s=config.signing.validity_s,
        clock=lambda: NOW,
        metrics=metrics,
    )
    return SigningPipeline(
        config=config,
        signer=signer,
        bearers=BearerStore(config.credentials, ENV),
        transactions=TransactionKeys(keys, clock=lambda: NOW),
        profiles=ProfileSelector(config.profiles),
    )


def general(
    p: SigningPipeline,
    method: str,
    target: Target,
    lines: list[tuple[str, str]],
    body: bytes,
    *,
    framed: bool,
) -> Outgoing:
    """The general path: ``prepare`` minus the one-pass path, signing as a first signature of the
    request this second (the one-pass path's, made before, would move its ``expires``: ``Repeats``)."""
    p.signer.repeats = Repeats()
    return p._serialized(method, target, p.sign_fields(method, target, lines, body), framed)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(CONFIGS)),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "get"]),
    url=_url,
    lines=st.lists(st.tuples(_name, _value), max_size=6),
    body=st.sampled_from([b"", b"x" * 1024, b'{"a":1}']),
    framed=st.booleans(),
)
@example("default", "GET", "http://api.example/", [("Authorization", " Bearer padded\t")], b"", False)
@example("bearer", "GET", "http://api.example/", [("Authorization", "Basic YQ==")], b"", False)
@example("bearer-override", "GET", "http://api.example/", [("Authorization", "Basic YQ==")], b"", False)
def test_the_one_pass_path_makes_the_general_paths_bytes_or_steps_aside(  # noqa: PLR0917
    name: str, method: str, url: str, lines: list[tuple[str, str]], body: bytes, framed: bool
) -> None:
    """Whatever the one-pass path signs, the general path signs byte for byte the same."""
    p, target = pipeline(name), parse_absolute_uri(url)
    plain = _sign_plain(p, method, target, lines, body, framed=framed)
    try:
        reference = general(p, method, target, lines, body, framed=framed)
    except ProxyError:
        assert plain is None  # what the general path refuses, the one-pass path never signs
        return
    if plain is not None:
        assert plain == reference


def test_the_common_request_takes_the_one_pass_path_and_verifies() -> None:
    """The bench's request (and an agent's usual one) is signed in one pass, counted once, and an
    independent verifier accepts it."""
    metrics = Metrics()
    p = pipeline("signature-agent", metrics)
    target = parse_absolute_uri("http://127.0.0.1:18081/bench")
    lines = [("Host", "127.0.0.1:18081"), ("Content-Length", "4"), ("Content-Type", "text/plain")]
    plain = _sign_plain(p, "POST", target, lines, b"body", framed=False)
    assert plain is not None
    assert plain == general(pipeline("signature-agent"), "POST", target, lines, b"body", framed=False)
    p.signer.repeats = Repeats()  # as a first signature of the request this second
    assert p.prepare("POST", target, lines, b"body", framed=False) == plain
    assert metrics._signatures == {"agent": 2}  # _sign_plain, then prepare: one each
    head_lines = plain.head.decode("latin-1").split("\r\n")[1:]
    fields = [(n, v) for n, _, v in (line.partition(": ") for line in head_lines if line)]
    keys = {KEY.thumbprint: KEY.public.key}
    assert oracle_verify("POST", target.uri, fields, plain.body, keys, check_time=False) == ["agent"]


@pytest.mark.parametrize(
    ("name", "url", "lines", "why"),
    [
        ("unsigned-host", "http://static.example/", [], "a hosts.unsigned host"),
        ("profiles", "http://bot.example/", [], "another profile"),
        ("default", f"http://api.example/r?agent_id={KEY.thumbprint}", [], "a transaction's key"),
        ("default", "http://api.example/", [("Connection", "x-trace")], "Connection names more"),
        ("default", "http://api.example/", [("Authorization", "a"), ("authorization", "b")], "two"),
    ],
)
def test_requests_with_another_rule_go_the_general_way(
    name: str, url: str, lines: list[tuple[str, str]], why: str
) -> None:
    """Each rule beyond the spec's plain signature hands the request to the general path."""
    assert _sign_plain(pipeline(name), "GET", parse_absolute_uri(url), lines, b"", framed=False) is None, why


def test_an_exchange_call_with_a_requester_goes_the_general_way(tmp_path: Path) -> None:
    """A Requester may be inserted (and a chain's key chosen): never in one pass."""
    from tests.proxy.test_requester import DISCOVER, JSON_LINES, injector

    p = pipeline("default")
    with_requester = SigningPipeline(
        config=p.config, signer=p.signer, bearers=p.bearers, requester=injector(tmp_path)
    )
    target = parse_absolute_uri(DISCOVER)
    assert _sign_plain(with_requester, "POST", target, JSON_LINES, b"{}", framed=False) is None
    other = parse_absolute_uri("http://api.example/not-an-exchange")
    assert _sign_plain(with_requester, "POST", other, JSON_LINES, b"{}", framed=False) is not None


@pytest.mark.parametrize("value", ["Bearer abc\u00a0", "\u0085Bearer abc", "\u00a0"])
@pytest.mark.parametrize("name", ["default", "bearer"])
def test_an_authorization_with_non_ascii_at_an_end_is_refused_not_trimmed(name: str, value: str) -> None:
    """``str.strip()`` also trimmed U+00A0 and U+0085 (bytes 0xA0, 0x85 as Latin-1): ``Bearer abc`` went
    out signed in place of what the agent sent, and a value of one 0xA0 became empty, so a bearer rule
    without ``override`` put its token where the agent had sent an Authorization. RFC 9110 section 5.5
    trims only spaces and tabs; the value then reaches the non-ASCII check whole."""
    p, target = pipeline(name), parse_absolute_uri("http://api.example/")
    lines = [("Authorization", value)]
    assert _sign_plain(p, "GET", target, lines, b"", framed=False) is None
    with pytest.raises(ProxyError) as refused:
        general(p, "GET", target, lines, b"", framed=False)
    assert refused.value.reason == "non-ascii-component"
