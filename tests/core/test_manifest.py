"""The svc.json manifest (spec "Manifest", "Versioning", "Errors") and manifest discovery
(spec "What the service does" 6, DESIGN section 5)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from signing_proxy.core.errors import ManifestError
from signing_proxy.core.manifest import (
    MANIFEST_PATH,
    AuthorizedExchange,
    CatalogContributor,
    ProviderRelationship,
    Role,
    manifest_address,
    parse_manifest,
    render_agent_manifest,
    same_site,
)

HOST = "pub.example"


def publisher(**over: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "ver": "1.0",
        "role": "ROLE_PUBLISHER",
        "domain": HOST,
        "contact": "licensing@pub.example",
        "exchanges": [
            {
                "domain": "exchange.example",
                "endpoint": "https://exchange.example/v1",
                "relationship": "DIRECT",
            }
        ],
    }
    doc.update(over)
    return {k: v for k, v in doc.items() if v is not None}


def body(doc: object) -> bytes:
    return json.dumps(doc).encode()


def refused(raw: bytes, served_host: str | None = HOST, **kw: Any) -> str:
    with pytest.raises(ManifestError) as exc:
        parse_manifest(raw, served_host=served_host, **kw)
    return exc.value.reason


# ------------------------------------------------------------------ Versioning


@pytest.mark.parametrize("ver", ["1.0", "1.7", "1.12"])
def test_versioning_any_minor_of_major_1_is_accepted(ver: str) -> None:
    manifest = parse_manifest(body(publisher(ver=ver)), served_host=HOST)
    assert manifest.ver == ver
    assert manifest.version[0] == 1


@pytest.mark.parametrize("ver", ["2.0", "0.9", "10.0"])
def test_versioning_unknown_major_is_refused(ver: str) -> None:
    assert refused(body(publisher(ver=ver))) == "manifest-version-unsupported"


@pytest.mark.parametrize(
    "ver", ["one", "", "1", "1.0.0", "01.0", "1.00", " 1.0", "1.0 ", "v1.0", "-1.0", "1.x"]
)
def test_versioning_malformed_string_is_refused(ver: str) -> None:
    assert refused(body(publisher(ver=ver))) == "manifest-version-malformed"


@pytest.mark.parametrize("ver", [1.0, 1, True, ["1.0"], {"major": 1}])
def test_versioning_non_string_ver_is_malformed(ver: object) -> None:
    assert refused(body(publisher(ver=ver))) == "manifest-version-malformed"


def test_versioning_json_null_ver_is_malformed() -> None:
    raw = body(publisher()).replace(b'"ver": "1.0"', b'"ver": null')
    assert refused(raw) == "manifest-version-malformed"


def test_versioning_absent_ver_is_refused() -> None:
    assert refused(body(publisher(ver=None))) == "manifest-version-missing"


def test_versioning_duplicate_ver_is_malformed() -> None:
    raw = b'{"ver":"1.0","ver":"1.0","role":"ROLE_AGENT","domain":"pub.example"}'
    assert refused(raw) == "manifest-version-malformed"


def test_versioning_ver_is_read_before_any_other_member() -> None:
    """spec "Versioning" 2: a bad ver wins over every other fault of the document."""
    broken = {"ver": "2.0", "role": "ROLE_NOPE", "domain": "elsewhere.example", "exchanges": "x"}
    assert refused(body(broken)) == "manifest-version-unsupported"
    assert refused(body({**broken, "ver": "one"})) == "manifest-version-malformed"
    assert refused(body({"role": "ROLE_PUBLISHER", "domain": HOST})) == "manifest-version-missing"
    with_dup = b'{"role":"ROLE_AGENT","role":"ROLE_AGENT","ver":"3.1","domain":"pub.example"}'
    assert refused(with_dup) == "manifest-version-unsupported"


def test_duplicate_member_is_refused_once_ver_is_good() -> None:
    raw = b'{"ver":"1.0","role":"ROLE_AGENT","domain":"pub.example","domain":"evil.example"}'
    assert refused(raw) == "manifest-malformed"


@pytest.mark.parametrize("raw", [b"[]", b'"1.0"', b"{", b"\xff", b'{"ver":"1.0","x":NaN}'])
def test_non_object_or_invalid_json_is_malformed(raw: bytes) -> None:
    assert refused(raw) == "manifest-malformed"


def test_size_limit() -> None:
    raw = body(publisher())
    assert refused(raw, max_bytes=len(raw) - 1) == "manifest-too-large"


# ------------------------------------------------------------------ Manifest fields


def test_publisher_manifest_parses() -> None:
    manifest = parse_manifest(body(publisher()), served_host=HOST)
    assert manifest.role is Role.ROLE_PUBLISHER
    assert manifest.domain == HOST
    assert manifest.contact == "licensing@pub.example"
    assert manifest.exchanges == (
        AuthorizedExchange(
            "exchange.example",
            "https://exchange.example/v1",
            ProviderRelationship.PROVIDER_RELATIONSHIP_DIRECT,
        ),
    )
    assert manifest.authorizes("Exchange.Example") == manifest.exchanges[0]
    assert manifest.authorizes("other.example") is None
    assert manifest.extra == {}


@pytest.mark.parametrize("exchanges", [None, []])
def test_publisher_without_exchanges_is_refused(exchanges: object) -> None:
    assert refused(body(publisher(exchanges=exchanges))) == "manifest-missing-exchanges"


@pytest.mark.parametrize("role", ["ROLE_EXCHANGE", "ROLE_BROKER"])
def test_exchanges_optional_for_other_roles(role: str) -> None:
    assert parse_manifest(body(publisher(role=role, exchanges=None)), served_host=HOST).exchanges == ()


@pytest.mark.parametrize(
    ("role", "expected"), [("ROLE_PUBLISHER", Role.ROLE_PUBLISHER), (4, Role.ROLE_PUBLISHER)]
)
def test_role_name_and_number_forms(role: object, expected: Role) -> None:
    assert parse_manifest(body(publisher(role=role)), served_host=HOST).role is expected


@pytest.mark.parametrize("role", [None, "ROLE_UNSPECIFIED", 0])
def test_role_missing_or_unspecified_is_refused(role: object) -> None:
    assert refused(body(publisher(role=role))) == "manifest-missing-role"


@pytest.mark.parametrize("role", ["ROLE_ADMIN", "PUBLISHER", "role_publisher", 9, -1, True, 4.0, ""])
def test_role_unknown_is_refused(role: object) -> None:
    assert refused(body(publisher(role=role))) == "manifest-unknown-role"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("DIRECT", ProviderRelationship.PROVIDER_RELATIONSHIP_DIRECT),
        ("RESELLER", ProviderRelationship.PROVIDER_RELATIONSHIP_RESELLER),
        ("PROVIDER_RELATIONSHIP_DIRECT", ProviderRelationship.PROVIDER_RELATIONSHIP_DIRECT),
        ("PROVIDER_RELATIONSHIP_RESELLER", ProviderRelationship.PROVIDER_RELATIONSHIP_RESELLER),
        (1, ProviderRelationship.PROVIDER_RELATIONSHIP_DIRECT),
        (2, ProviderRelationship.PROVIDER_RELATIONSHIP_RESELLER),
    ],
)
def test_relationship_name_and_number_forms(value: object, expected: ProviderRelationship) -> None:
    exchange = {"domain": "x.example", "endpoint": "https://x.example/v1", "relationship": value}
    manifest = parse_manifest(body(publisher(exchanges=[exchange])), served_host=HOST)
    assert manifest.exchanges[0].relationship is expected
    assert expected.json_value in ("DIRECT", "RESELLER")


@pytest.mark.parametrize("value", ["PARTNER", "direct", "Direct", 3, -1, True, 1.5])
def test_unknown_relationship_is_refused(value: object) -> None:
    exchange = {"domain": "x.example", "endpoint": "https://x.example/v1", "relationship": value}
    assert refused(body(publisher(exchanges=[exchange]))) == "manifest-unknown-relationship"


@pytest.mark.parametrize(
    "exchange",
    [
        {"endpoint": "https://x.example/v1", "relationship": "DIRECT"},
        {"domain": "", "endpoint": "https://x.example/v1", "relationship": "DIRECT"},
        {"domain": "https://x.example", "endpoint": "https://x.example/v1", "relationship": "DIRECT"},
        {"domain": "x.example", "relationship": "DIRECT"},
        {"domain": "x.example", "endpoint": "/v1", "relationship": "DIRECT"},
        {"domain": "x.example", "endpoint": "ftp://x.example/v1", "relationship": "DIRECT"},
        {"domain": "x.example", "endpoint": "https://x.example/v1"},
        {"domain": "x.example", "endpoint": "https://x.example/v1", "relationship": 0},
        {
            "domain": "x.example",
            "endpoint": "https://x.example/v1",
            "relationship": "PROVIDER_RELATIONSHIP_UNSPECIFIED",
        },
        "exchange.example",
    ],
)
def test_bad_exchange_is_refused(exchange: object) -> None:
    assert refused(body(publisher(exchanges=[exchange]))) == "manifest-bad-exchange"


def test_domain_must_match_the_serving_host() -> None:
    assert refused(body(publisher()), served_host="evil.example") == "manifest-domain-mismatch"
    assert refused(body(publisher()), served_host="www.pub.example") == "manifest-domain-mismatch"


@pytest.mark.parametrize("served", ["PUB.example", "pub.example:8443", "pub.example.", "pub.example:443"])
def test_domain_match_ignores_case_port_and_trailing_dot(served: str) -> None:
    assert parse_manifest(body(publisher()), served_host=served).domain == HOST


def test_domain_unchecked_without_served_host() -> None:
    assert parse_manifest(body(publisher(domain="other.example")), served_host=None).domain == "other.example"


@pytest.mark.parametrize("domain", [None, ""])
def test_domain_required(domain: object) -> None:
    assert refused(body(publisher(domain=domain))) == "manifest-missing-domain"


@pytest.mark.parametrize(
    "domain", ["https://pub.example", "pub example", "pub.example/x", "user@pub.example", 7]
)
def test_domain_must_be_a_host_name(domain: object) -> None:
    assert refused(body(publisher(domain=domain))) == "manifest-bad-domain"


def test_unknown_capability_fields_are_kept_in_extra() -> None:
    """spec: exchange-only capability fields (e.g. max_intermediary_hops) are not shown; keep them."""
    doc = publisher(role="ROLE_EXCHANGE", exchanges=None, max_intermediary_hops=3, catalogContributors=[])
    manifest = parse_manifest(body(doc), served_host=HOST)
    assert manifest.extra == {"max_intermediary_hops": 3, "catalogContributors": []}


def test_ext_and_catalog_contributors() -> None:
    doc = publisher(
        ext={"vendor:x": {"a": 1}},
        catalog_contributors=[{"domain": "verify.example", "relationship": "verifier"}],
    )
    manifest = parse_manifest(body(doc), served_host=HOST)
    assert manifest.ext == {"vendor:x": {"a": 1}}
    assert manifest.catalog_contributors == (CatalogContributor("verify.example", "verifier"),)


@pytest.mark.parametrize(
    "contributor",
    [{"domain": "verify.example"}, {"relationship": "verifier"}, {"domain": "v", "relationship": ""}, 5],
)
def test_bad_catalog_contributor_is_refused(contributor: object) -> None:
    assert refused(body(publisher(catalog_contributors=[contributor]))) == "manifest-bad-catalog-contributor"


@pytest.mark.parametrize(
    "over", [{"contact": 5}, {"ext": []}, {"exchanges": "exchange.example"}, {"catalog_contributors": {}}]
)
def test_wrongly_typed_members_are_malformed(over: dict[str, object]) -> None:
    assert refused(body(publisher(**over))) == "manifest-malformed"


def test_entry_limit() -> None:
    raw = body(publisher())
    assert refused(raw, max_entries=0) == "manifest-too-large"


# ------------------------------------------------------------------ agent manifests


def test_render_agent_manifest_exact_bytes() -> None:
    assert render_agent_manifest("agent.example") == (
        b'{"ver":"1.0","role":"ROLE_AGENT","domain":"agent.example"}'
    )


def test_render_agent_manifest_round_trip() -> None:
    manifest = parse_manifest(render_agent_manifest("agent.example"), served_host="agent.example")
    assert (manifest.ver, manifest.role, manifest.domain) == ("1.0", Role.ROLE_AGENT, "agent.example")
    assert manifest.extra == {}


def test_render_agent_manifest_refuses_a_non_domain() -> None:
    with pytest.raises(ManifestError) as exc:
        render_agent_manifest("https://agent.example/")
    assert exc.value.reason == "manifest-bad-domain"


def test_agent_manifest_extras_are_ignored_by_default_and_refused_when_strict() -> None:
    """spec "Manifest": an agent manifest contains only ver, role, domain."""
    doc = {"ver": "1.3", "role": 1, "domain": HOST, "contact": "x", "exchanges": "junk"}
    manifest = parse_manifest(body(doc), served_host=HOST)
    assert manifest.role is Role.ROLE_AGENT
    assert manifest.contact is None
    assert manifest.exchanges == ()
    assert manifest.extra == {"contact": "x", "exchanges": "junk"}
    assert refused(body(doc), strict_agent=True) == "manifest-agent-extra-fields"


# ------------------------------------------------------------------ discovery


def test_manifest_path() -> None:
    assert MANIFEST_PATH == "/.well-known/svc.json"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("https://pub.example/terms/svc.json", "https://pub.example/terms/svc.json"),
        ('"https://pub.example/svc.json"', "https://pub.example/svc.json"),
        ("<https://PUB.example:443/svc.json>", "https://pub.example/svc.json"),
        ("  http://rules.example/m  ", "http://rules.example/m"),
    ],
)
def test_manifest_address_uses_an_absolute_url_value(header: str, expected: str) -> None:
    assert manifest_address(header, "https://pub.example") == expected


@pytest.mark.parametrize(
    "header", ["", "licensing required", "/.well-known/svc.json", "ftp://pub.example/svc.json", "pub.example"]
)
def test_manifest_address_falls_back_to_the_well_known_path(header: str) -> None:
    assert manifest_address(header, "https://pub.example") == "https://pub.example/.well-known/svc.json"


def test_manifest_address_origin_is_canonicalized() -> None:
    assert (
        manifest_address("x", "https://PUB.example:443/articles/1?q=2")
        == "https://pub.example/.well-known/svc.json"
    )
    assert manifest_address("x", "http://pub.example:8080") == "http://pub.example:8080/.well-known/svc.json"
    with pytest.raises(ValueError, match="origin"):
        manifest_address("x", "pub.example")


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("https://pub.example/a", "http://pub.example:8080/b", True),
        ("https://www.pub.example/", "https://cdn.pub.example/", True),
        ("https://pub.example/", "https://www.pub.example/", True),
        ("https://WWW.pub.example/", "https://pub.example/", True),
        ("https://pub.example/", "https://other.example/", False),
        ("https://a.pub.example/", "https://a.other.example/", False),
        ("https://127.0.0.1/", "https://127.0.0.1:8443/", True),
        ("https://127.0.0.1/", "https://127.0.0.2/", False),
        ("https://pub.example/", "not a url", False),
    ],
)
def test_same_site(a: str, b: str, same: bool) -> None:
    assert same_site(a, b) is same
    assert same_site(b, a) is same
