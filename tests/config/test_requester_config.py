"""``requester`` configuration: defaults, accepted shapes, and every mistake named by its key path."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from signing_proxy.config import (
    Config,
    ConfigError,
    DelegationConfig,
    RequesterConfig,
    parse_config,
)

BASE: dict[str, Any] = {
    "id": "agent-7",
    "domain": "agent.example",
    "type": "REQUESTER_TYPE_AGENT",
    "exchanges": ["https://exchange.example/v1"],
}
DELEGATION: dict[str, Any] = {
    "token_file": "/etc/signing-proxy/delegation.jwt",
    "principal_domain": "corp.example",
    "principal_id": "alice@corp.example",
}


def requester(**over: Any) -> dict[str, Any]:
    return {"requester": {**BASE, **over}}


def test_requester_is_not_configured_by_default() -> None:
    assert Config().requester is None
    assert parse_config({}).requester is None


def test_a_full_requester_is_accepted() -> None:
    config = parse_config(
        requester(
            type=4,
            name="Research assistant",
            scopes=["dist:US:*", "subscription:news"],
            ext={"vendor:tier": "gold", "nested": {"a": [1, 2.5, None, True]}},
            ext_critical=["vendor:tier"],
            delegation={
                **DELEGATION,
                "expires_at": "2030-01-01T00:00:00Z",
                "max_spend_cents": 5000,
                "max_accesses": 100,
                "quota_period": "86400s",
                "revocation_uri": "https://corp.example/revocations",
                "issuer": "https://corp.example",
                "token_format": "jwt",
                "ext": {"k": "v"},
                "ext_critical": ["k"],
            },
        )
    )
    r = config.requester
    assert isinstance(r, RequesterConfig)
    assert r.type == 4
    assert r.ext["nested"] == {"a": [1, 2.5, None, True]}
    assert isinstance(r.delegation, DelegationConfig)
    assert r.delegation.max_spend_cents == 5000


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"id": ""}, "requester.id: required"),
        ({"domain": ""}, "requester.domain: required"),
        ({"domain": "https://agent.example"}, "requester.domain: a domain name"),
        ({"type": ""}, "requester.type: required"),
        ({"type": "REQUESTER_TYPE_UNSPECIFIED"}, "requester.type: REQUESTER_TYPE_UNSPECIFIED is rejected"),
        ({"type": 0}, "requester.type: REQUESTER_TYPE_UNSPECIFIED is rejected"),
        ({"type": "AGENT"}, "requester.type: unknown RequesterType 'AGENT'"),
        ({"type": 9}, "requester.type: unknown RequesterType 9"),
        ({"type": [1]}, "requester.type: must be an integer"),
        ({"type": 4}, "requester.delegation: required with type REQUESTER_TYPE_DELEGATED"),  # spec Errors:
        ({"type": "REQUESTER_TYPE_DELEGATED"}, "requester.delegation: required"),  # "token missing"
        ({"scopes": ["dist::US"]}, r"requester.scopes\[0\]: a scope has no empty segments"),
        ({"ext_critical": ["x"]}, r"requester.ext_critical\[0\]: 'x' is not a key of requester.ext"),
        ({"ext": {"when": datetime.date(2030, 1, 1)}}, "requester.ext.when: must be JSON data"),
        ({"ext": {"x": float("nan")}}, "requester.ext.x: must be a finite number"),
        ({"exchanges": []}, "requester.exchanges: list the exchange base URLs"),
        ({"exchanges": ["exchange.example"]}, r"requester.exchanges\[0\]: must be an absolute http\(s\) URL"),
        ({"exchanges": ["https://x.example/v1?a=b"]}, r"requester.exchanges\[0\]: a base URL has no query"),
        ({"exchanges": ["https://x.example/v1"] * 2}, "requester.exchanges: an exchange is listed twice"),
        ({"token": "x"}, "requester.token: unknown key"),
        ({"delegation": {}}, "requester.delegation.token_file: required"),
        ({"delegation": {**DELEGATION, "principal_domain": ""}}, "requester.delegation.principal_domain"),
        ({"delegation": {**DELEGATION, "principal_id": " "}}, "requester.delegation.principal_id: required"),
        (
            {"delegation": {**DELEGATION, "expires_at": "2030-01-01 00:00"}},
            "requester.delegation.expires_at: '2030-01-01 00:00' is not an RFC 3339",
        ),
        ({"delegation": {**DELEGATION, "max_spend_cents": -1}}, "requester.delegation.max_spend_cents"),
        ({"delegation": {**DELEGATION, "max_accesses": 2**31}}, "requester.delegation.max_accesses"),
        ({"delegation": {**DELEGATION, "quota_period": "1w"}}, "requester.delegation.quota_period: '1w'"),
        ({"delegation": {**DELEGATION, "token_format": "cwt"}}, "requester.delegation.token_format: must be"),
        ({"delegation": {**DELEGATION, "revocation_uri": "corp"}}, "requester.delegation.revocation_uri"),
        ({"delegation": {**DELEGATION, "issuer": ""}}, "requester.delegation.issuer: must be non-empty"),
        ({"delegation": {**DELEGATION, "token": "eyJ"}}, "requester.delegation.token: unknown key"),
    ],
)
def test_mistakes_are_refused_with_their_key_path(over: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(requester(**over))


def test_a_relay_carries_no_requester() -> None:
    with pytest.raises(ConfigError, match="requester: only in mode agent"):
        parse_config({"mode": "relay", **requester()})


def test_type_keeps_the_string_union_for_names() -> None:
    config = parse_config(requester(type="REQUESTER_TYPE_RESEARCH"))
    assert config.requester is not None
    assert config.requester.type == "REQUESTER_TYPE_RESEARCH"
