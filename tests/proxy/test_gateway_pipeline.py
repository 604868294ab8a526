"""The gateway pipeline's own rules: the URI the client signed (Host, or the external origin), the
one backend it forwards to, and the upstream it accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from signing_proxy.config import Config, parse_config
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.errors import ConfigError, ProxyError
from signing_proxy.proxy.gateway import GatewayPipeline


def config(tmp_path: Path, *, verify: dict[str, object] | None = None, **gateway: object) -> Config:
    raw: dict[str, object] = {
        "mode": "gateway",
        "data_dir": str(tmp_path),
        "gateway": {"upstream": "http://127.0.0.1:9000", **gateway},
    }
    if verify is not None:
        raw["verify"] = verify
    return parse_config(raw)


async def test_signed_uri_is_host_or_external_origin(tmp_path: Path) -> None:
    target = parse_absolute_uri("http://127.0.0.1:9000/v1/x?a=1")
    plain = GatewayPipeline(config(tmp_path, hosts=["gw.example", "[::1]"]))
    behind = GatewayPipeline(config(tmp_path, external_origin="https://exchange.example/"))
    try:
        assert plain.signed_uri(target, [("Host", "gw.example:8080")]) == "http://gw.example:8080/v1/x?a=1"
        assert plain.signed_uri(target, [("Host", "GW.example")]) == "http://GW.example/v1/x?a=1"  # any case
        assert plain.signed_uri(target, [("Host", "[::1]:81")]) == "http://[::1]:81/v1/x?a=1"
        assert behind.signed_uri(target, [("Host", "10.0.0.7")]) == "https://exchange.example/v1/x?a=1"
        # a Host not in gateway.hosts: a signature made for another origin must not verify here
        for other in ("publisher-a.example", "gw.example.evil", "127.0.0.1:9000"):
            with pytest.raises(ProxyError) as misdirected:
                plain.signed_uri(target, [("Host", other)])
            assert (misdirected.value.status, misdirected.value.reason) == (421, "misdirected-request")
        # a path, query, fragment or userinfo riding in Host would move the path the signature covers
        # away from the one forwarded: "gw/?" + "/v1/x" signs the path "/" (issue: Host binding)
        odd = ["gw.example/?", "gw.example/feed#", "gw.example?x", "u@gw.example", "gw.example:80x", "[::1"]
        odd.append(f"gw.example:{'9' * 4301}")  # int() refuses it with a ValueError: once a 500
        for hosts in ([], [("Host", "a"), ("host", "b")], [("Host", " ")], *([("Host", h)] for h in odd)):
            with pytest.raises(ProxyError) as caught:
                plain.signed_uri(target, hosts)
            assert (caught.value.status, caught.value.reason) == (400, "malformed-host")
    finally:
        await plain.close()
        await behind.close()


async def test_only_the_backend_is_a_target(tmp_path: Path) -> None:
    pipeline = GatewayPipeline(config(tmp_path))
    try:
        with pytest.raises(ProxyError) as caught:
            await pipeline.prepare(
                "GET", parse_absolute_uri("http://elsewhere.example/"), [], b"", framed=False
            )
        assert (caught.value.status, caught.value.reason) == (404, "no-route")
    finally:
        await pipeline.close()


def test_the_backend_is_an_origin(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="an origin only"):
        GatewayPipeline(config(tmp_path, upstream="http://127.0.0.1:9000/api"))
    with pytest.raises(ConfigError, match="exchange_domain"):
        config(tmp_path, providers=["pub.example"])


@pytest.mark.parametrize("accepted", [True, False])
async def test_the_gateway_takes_the_verify_sections_profile_switch(tmp_path: Path, accepted: bool) -> None:
    pipeline = GatewayPipeline(config(tmp_path, verify={"web_bot_auth": accepted, "fetches_per_s": 7}))
    try:
        verifier = pipeline.verifier.verifier
        assert verifier.policy.web_bot_auth is accepted
        assert verifier.resolver.fetch_budget is not None
        assert verifier.resolver.fetch_budget.rate == 7
    finally:
        await pipeline.close()


async def test_by_default_a_gateway_answers_only_for_loopback_names(tmp_path: Path) -> None:
    """With neither gateway.hosts nor external_origin, any Host was taken as ours: a request signed
    for http://publisher-a.example/article verified here (a signature covers @target-uri)."""
    target = parse_absolute_uri("http://127.0.0.1:9000/article")
    pipeline = GatewayPipeline(config(tmp_path))
    try:
        for host in ("localhost:8080", "127.0.0.1", "[::1]:8080"):
            assert pipeline.signed_uri(target, [("Host", host)]) == f"http://{host}/article"
        with pytest.raises(ProxyError) as caught:
            pipeline.signed_uri(target, [("Host", "publisher-a.example")])
        assert (caught.value.status, caught.value.reason) == (421, "misdirected-request")
        assert "gateway.hosts" in caught.value.detail  # the answer names the setting
    finally:
        await pipeline.close()


@pytest.mark.parametrize("host", ["gw.example:8080", "u@gw.example", "gw.example/", ""])
def test_gateway_hosts_are_names_without_a_port(tmp_path: Path, host: str) -> None:
    with pytest.raises(ConfigError, match=r"gateway\.hosts\[0\]: a host name or address without a port"):
        config(tmp_path, hosts=[host])
