"""The proxy's start-up check of the Delegation mirror fields (``proxy/delegation_file.py``) refuses
exactly what the gateway's ``check_mirror`` would: a configuration the proxy starts with is one
whose every delegated call the gateway accepts (no proxy that starts only to be denied)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.config.identity import DelegationConfig
from signing_proxy.core.delegation import extend_chain, issue_authority, verify_chain
from signing_proxy.core.errors import DelegationError
from signing_proxy.core.gateway_ingest import check_mirror, read_delegation
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import KeyProvider
from signing_proxy.errors import ConfigError
from signing_proxy.proxy.delegation_file import load_delegation

NOW = 1_800_000_000.0
OWNER = SigningKey.from_seed(b"\x31" * 32)
PRINCIPAL = SigningKey.from_seed(b"\x32" * 32)
AGENT = SigningKey.from_seed(b"\x33" * 32)


class Keys(KeyProvider):
    def current(self, now: float) -> SigningKey | None:
        return AGENT


def chain_file(tmp_path: Path, authority: dict[str, Any], child: dict[str, Any]) -> str:
    token = issue_authority(
        OWNER,
        iss="https://owner.example",
        holder_jkt=PRINCIPAL.thumbprint,
        now=NOW,
        scope=["dist:*"],
        exp=int(NOW) + 3600,
        **authority,
    )
    token = extend_chain(
        token,
        PRINCIPAL,
        holder_jkt=AGENT.thumbprint,
        now=NOW,
        scope=["dist:US"],
        exp=int(NOW) + 1800,
        **child,
    )
    path = tmp_path / "delegation.jwt"
    path.write_text(token)
    return str(path)


def delegation_config(path: str, **mirror: Any) -> DelegationConfig:
    return DelegationConfig(token_file=path, principal_domain="p.example", principal_id="p1", **mirror)


@pytest.mark.parametrize(
    ("mirror", "message"),
    [
        (
            {"max_accesses": 5},
            "requester.delegation.max_accesses: the chain carries no svc_max_accesses",
        ),
        (
            {"max_spend_cents": 100},
            "requester.delegation.max_spend_cents: the chain carries no svc_max_spend_cents",
        ),
        (
            {"quota_period": "3600s"},
            "requester.delegation.quota_period: the chain carries no svc_quota_period",
        ),
    ],
)
def test_a_mirrored_cap_or_period_the_chain_does_not_carry_is_refused_naming_the_key(
    tmp_path: Path, mirror: dict[str, Any], message: str
) -> None:
    path = chain_file(tmp_path, {}, {})  # no caps, no period anywhere in the chain
    with pytest.raises(ConfigError, match=message) as info:
        load_delegation(delegation_config(path, **mirror), (), Keys(), NOW)
    assert info.value.reason == "delegation-invalid"


def test_a_period_on_an_uncapped_chain_must_still_be_the_final_links(tmp_path: Path) -> None:
    path = chain_file(tmp_path, {"quota_period_s": 86_400}, {"quota_period_s": 86_400})
    with pytest.raises(
        ConfigError, match="quota_period: 3600s differs from the chain's svc_quota_period, 86400s"
    ):
        load_delegation(delegation_config(path, quota_period="3600s"), (), Keys(), NOW)


CHAINS = [
    pytest.param({}, {}, id="no-caps"),
    pytest.param({"max_accesses": 100}, {"max_accesses": 50}, id="accesses-lifetime"),
    pytest.param({"max_spend_cents": 10_000}, {"max_spend_cents": 5_000}, id="spend-lifetime"),
    pytest.param(
        {"max_accesses": 100, "max_spend_cents": 10_000, "quota_period_s": 86_400},
        {"max_accesses": 50, "max_spend_cents": 5_000, "quota_period_s": 86_400},
        id="both-daily",
    ),
    pytest.param(
        {"max_accesses": 100, "quota_period_s": 86_400},
        {"max_accesses": 50},
        id="daily-then-lifetime",
    ),
    pytest.param({"quota_period_s": 86_400}, {"quota_period_s": 86_400}, id="period-no-caps"),
]
MIRRORS = [
    {
        name: value
        for name, value in (("max_accesses", accesses), ("max_spend_cents", spend), ("quota_period", period))
        if value is not None
    }
    for accesses, spend, period in itertools.product(
        (None, 1, 50, 1_000_000), (None, 1, 5_000, 10**9), (None, "3600s", "86400s")
    )
]


@pytest.mark.parametrize(("authority", "child"), CHAINS)
def test_what_the_proxy_starts_with_the_gateway_accepts(
    tmp_path: Path, authority: dict[str, Any], child: dict[str, Any]
) -> None:
    path = chain_file(tmp_path, authority, child)
    started = 0
    for mirror in MIRRORS:
        try:
            loaded = load_delegation(delegation_config(path, **mirror), (), Keys(), NOW)
        except ConfigError:
            continue
        started += 1
        sent = read_delegation(loaded.doc.proto_json())  # what the proxy injects, as the gateway reads it
        verified = verify_chain(sent.token, owner_keys=[OWNER.public], holder_jkt=AGENT.thumbprint, now=NOW)
        try:
            check_mirror(sent, verified, NOW)
        except DelegationError as exc:
            pytest.fail(f"the proxy starts with {mirror} but the gateway refuses: {exc.reason}: {exc.detail}")
    assert started  # at least the empty mirror (the chain decides) starts
