"""Requester injection (``proxy/requester.py``): which calls get it, in what shape, and when the proxy
refuses (start-up, reload, per request after a key rotation or expiry)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.config import Config, parse_config
from signing_proxy.core.delegation import extend_chain, issue_authority, verify_chain
from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import KeyProvider
from signing_proxy.core.signatures import Message, VerificationKey, verify_stack
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.errors import ConfigError, ProxyError
from signing_proxy.proxy.pipeline import BearerStore, Signer, SigningPipeline
from signing_proxy.proxy.requester import RequesterInjector, injector_for
from signing_proxy.service.app import ProxyApp

NOW = 1_800_000_000.0
HOUR = 3600
OWNER = SigningKey.from_seed(b"\x21" * 32)
PRINCIPAL = SigningKey.from_seed(b"\x22" * 32)
PROXY = SigningKey.from_seed(b"\x23" * 32)
ROTATED = SigningKey.from_seed(b"\x24" * 32)
EXCHANGE = "https://exchange.example/v1"
DISCOVER = EXCHANGE + "/svc.v1.ExchangeService/DiscoverResources"
BODY = b'{"ver":"1.0","exchange":"exchange.example","uris":["https://pub.example/a"]}'
JSON_LINES = [("Content-Type", "application/json")]


class Keys(KeyProvider):
    """A key provider whose key the test swaps (a rotation)."""

    def __init__(self, key: SigningKey | None) -> None:
        self.key = key

    def current(self, now: float) -> SigningKey | None:
        return self.key


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_chain(holder: SigningKey = PROXY, *, exp: int = int(NOW) + HOUR, **child: Any) -> str:
    authority = issue_authority(
        OWNER,
        iss="https://owner.example",
        holder_jkt=PRINCIPAL.thumbprint,
        now=NOW,
        scope=["dist:US:*", "subscription:news"],
        exp=int(NOW) + 2 * HOUR,
        max_spend_cents=10_000,
        max_accesses=100,
        quota_period_s=86_400,
    )
    return extend_chain(
        authority,
        PRINCIPAL,
        holder_jkt=holder.thumbprint,
        now=NOW,
        scope=child.get("scope", ["dist:US:CA", "subscription:news"]),
        exp=exp,
        max_spend_cents=child.get("max_spend_cents", 5_000),
        max_accesses=child.get("max_accesses", 50),
        quota_period_s=86_400,
    )


def write_chain(path: Path, chain: str) -> Path:
    path.write_text(chain + "\n")
    return path


def config(tmp_path: Path, *, delegation: dict[str, Any] | None = None, **over: Any) -> Config:
    raw: dict[str, Any] = {
        "id": "agent-7",
        "domain": "agent.example",
        "type": "REQUESTER_TYPE_AGENT" if delegation is None else "REQUESTER_TYPE_DELEGATED",
        "name": "Research assistant",
        "scopes": ["dist:US:CA"],
        "exchanges": [EXCHANGE, "http://127.0.0.1:9100/"],
        **over,
    }
    if delegation is not None:
        raw["delegation"] = {
            "token_file": str(tmp_path / "delegation.jwt"),
            "principal_domain": "corp.example",
            "principal_id": "alice@corp.example",
            **delegation,
        }
    return parse_config({"data_dir": str(tmp_path / "data"), "requester": raw})


def injector(
    tmp_path: Path,
    *,
    chain: str | None = None,
    keys: KeyProvider | None = None,
    clock: Clock | None = None,
    **kw: Any,
) -> RequesterInjector:
    write_chain(tmp_path / "delegation.jwt", chain if chain is not None else make_chain())
    cfg = config(tmp_path, delegation=kw.pop("delegation", {}), **kw)
    made = injector_for(cfg, keys or Keys(PROXY), clock=clock or Clock())
    assert made is not None
    return made


def apply(
    inj: RequesterInjector,
    body: bytes = BODY,
    *,
    url: str = DISCOVER,
    method: str = "POST",
    lines: Any = None,
) -> bytes:
    fields = Fields(JSON_LINES if lines is None else lines)
    return inj.apply(method, parse_absolute_uri(url), fields, body)


# --- what is injected ---------------------------------------------------------------------------


def test_injects_the_proto_json_requester_into_an_exchange_call(tmp_path: Path) -> None:
    inj = injector(tmp_path)
    out = apply(inj)
    doc = json.loads(out)
    assert {k: v for k, v in doc.items() if k != "requester"} == json.loads(BODY)  # the rest unchanged
    assert out.endswith(BODY[1:])  # byte for byte
    requester = doc["requester"]
    assert requester == inj.document()
    assert requester["id"] == "agent-7"
    assert requester["domain"] == "agent.example"
    assert requester["type"] == "REQUESTER_TYPE_DELEGATED"
    assert requester["name"] == "Research assistant"
    assert requester["scopes"] == ["dist:US:CA"]
    d = requester["delegation"]
    assert d["principal_domain"] == "corp.example"
    assert d["principal_id"] == "alice@corp.example"
    assert d["scopes"] == ["dist:US:CA", "subscription:news"]  # mirror of the final scope claim
    assert d["expires_at"] == "2027-01-15T09:00:00Z"  # the chain's earliest exp, RFC 3339
    assert d["max_spend_cents"] == "5000"  # int64 as a string, the chain's effective cap
    assert d["max_accesses"] == 50
    assert d["quota_period"] == "86400s"
    assert d["token_format"] == "jwt"
    token = base64.b64decode(d["token"], validate=True).decode("ascii")
    assert token == make_chain()
    verified = verify_chain(token, owner_keys=[OWNER.public], holder_jkt=PROXY.thumbprint, now=NOW)
    assert verified.scope == ("dist:US:CA", "subscription:news")


def test_a_public_agent_carries_no_delegation(tmp_path: Path) -> None:
    made = injector_for(config(tmp_path, type=1, scopes=[]), Keys(PROXY), clock=Clock())
    assert made is not None
    doc = json.loads(apply(made))["requester"]
    assert doc == {
        "id": "agent-7",
        "domain": "agent.example",
        "type": "REQUESTER_TYPE_AGENT",
        "name": "Research assistant",
    }


def test_configured_mirror_fields_narrower_than_the_chain_are_sent(tmp_path: Path) -> None:
    inj = injector(
        tmp_path,
        delegation={
            "expires_at": "2027-01-15T08:30:00Z",
            "max_spend_cents": 100,
            "max_accesses": 5,
            "quota_period": "1d",
            "revocation_uri": "https://corp.example/revoked",
            "issuer": "https://owner.example",
            "ext": {"vendor:cost-center": "42"},
            "ext_critical": ["vendor:cost-center"],
        },
        ext={"vendor:tier": "gold"},
        ext_critical=["vendor:tier"],
    )
    doc = inj.document()
    assert doc["ext"] == {"vendor:tier": "gold"}
    assert doc["ext_critical"] == ["vendor:tier"]
    d = doc["delegation"]
    assert (d["expires_at"], d["max_spend_cents"], d["max_accesses"], d["quota_period"]) == (
        "2027-01-15T08:30:00Z",
        "100",
        5,
        "86400s",
    )
    assert d["revocation_uri"] == "https://corp.example/revoked"
    assert d["issuer"] == "https://owner.example"
    assert d["ext"] == {"vendor:cost-center": "42"}


def test_document_is_a_fresh_copy(tmp_path: Path) -> None:
    inj = injector(tmp_path)
    inj.document()["delegation"]["token"] = "x"
    assert inj.document()["delegation"]["token"] != "x"


# --- which requests are touched ------------------------------------------------------------------


def test_a_body_that_already_has_a_requester_is_never_touched(tmp_path: Path) -> None:
    inj = injector(tmp_path)
    once = apply(inj)
    assert apply(inj, once) == once  # no double injection
    mine = b'{"requester":{"id":"mine","domain":"a.example","type":"REQUESTER_TYPE_AGENT"},"uris":[]}'
    assert apply(inj, mine) == mine


@pytest.mark.parametrize(
    "body",
    [b"", b"[1,2]", b'"s"', b"null", b"{not json", b"\x00\x01\x02", b'{"a":1,"a":2}', b"\xef\xbb\xbf{}"],
)
def test_a_body_that_is_not_a_json_object_is_never_touched(tmp_path: Path, body: bytes) -> None:
    assert apply(injector(tmp_path), body) == body


@pytest.mark.parametrize(
    "lines",
    [
        [("Content-Type", "application/grpc+proto")],
        [("Content-Type", "text/plain")],
        [("Content-Type", "application/json"), ("Content-Encoding", "gzip")],
    ],
)
def test_a_body_declared_as_something_else_is_never_touched(tmp_path: Path, lines: Any) -> None:
    assert apply(injector(tmp_path), lines=lines) == BODY


@pytest.mark.parametrize(
    "lines",
    [[], [("Content-Type", "application/json; charset=utf-8")], [("Content-Type", "application/x+json")]],
)
def test_json_or_undeclared_bodies_are_injected(tmp_path: Path, lines: Any) -> None:
    assert b'"requester"' in apply(injector(tmp_path), lines=lines)


@pytest.mark.parametrize(
    "url",
    [
        "https://other.example/v1/svc.v1.ExchangeService/DiscoverResources",  # another host
        "http://exchange.example/v1/svc.v1.ExchangeService/DiscoverResources",  # another scheme
        "https://exchange.example:8443/v1/svc.v1.ExchangeService/DiscoverResources",  # another port
        "https://exchange.example/v2/svc.v1.ExchangeService/DiscoverResources",  # another base path
        "https://exchange.example/svc.v1.ExchangeService/DiscoverResources",  # not under the base
        "https://exchange.example/v1/svc.v1.BrokerService/DiscoverResources",  # another service
        "https://exchange.example/v1/svc.v1.ExchangeService/",  # no method
        "https://exchange.example/v1/svc.v1.ExchangeService/A/B",  # not a method
        "https://exchange.example/v1/x/svc.v1.ExchangeService/DiscoverResources",
    ],
)
def test_only_configured_exchange_service_calls_are_touched(tmp_path: Path, url: str) -> None:
    assert apply(injector(tmp_path), url=url) == BODY


@pytest.mark.parametrize("method", ["PUT", "PATCH", "GET", "DELETE"])
def test_only_posts_are_touched(tmp_path: Path, method: str) -> None:
    assert apply(injector(tmp_path), method=method) == BODY


@pytest.mark.parametrize(
    "url",
    [
        DISCOVER,
        EXCHANGE + "/svc.v1.ExchangeService/ExecuteTransaction",
        "https://EXCHANGE.example:443/v1/svc.v1.ExchangeService/DiscoverResources?trace=1",
        "http://127.0.0.1:9100/svc.v1.ExchangeService/DiscoverResources",  # base "/" configured
    ],
)
def test_every_method_of_a_configured_exchange_is_touched(tmp_path: Path, url: str) -> None:
    assert b'"requester"' in apply(injector(tmp_path), url=url)


# --- refusals at start-up (and on reload: the same load) -----------------------------------------


def refusal(tmp_path: Path, **kw: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:  # no exchange to answer: the operator reads it (exit 2)
        injector(tmp_path, **kw)
    assert info.value.detail.startswith("requester.")  # the key path, as every configuration error
    token = (tmp_path / "delegation.jwt").read_text().strip()
    assert token not in info.value.detail
    for part in token.replace("~", ".").split("."):
        assert len(part) < 16 or part not in info.value.detail  # no piece of the token in the error
    return info.value


def test_startup_refuses_a_chain_bound_to_another_key_and_says_how_to_reissue(tmp_path: Path) -> None:
    error = refusal(tmp_path, chain=make_chain(holder=ROTATED))
    assert error.reason == "delegation-holder-mismatch"
    assert ROTATED.thumbprint in error.detail
    assert PROXY.thumbprint in error.detail
    assert "signing-proxy delegate extend" in error.detail
    assert "--holder-config" in error.detail
    assert "key rotation" in error.detail


def test_startup_refuses_a_configured_issuer_that_is_not_the_chains_iss(tmp_path: Path) -> None:
    """Delegation.issuer mirrors the token's iss: a configured other issuer is a false claim."""
    error = refusal(tmp_path, delegation={"issuer": "https://corp.example"})
    assert error.reason == "delegation-invalid"
    assert error.detail.startswith("requester.delegation.issuer: 'https://corp.example'")
    assert "'https://owner.example'" in error.detail


def test_startup_refuses_an_expired_chain(tmp_path: Path) -> None:
    error = refusal(tmp_path, clock=Clock(NOW + HOUR))
    assert error.reason == "delegation-expired"
    assert "DENIAL_REASON_DELEGATION_INVALID: expired" in error.detail


def test_startup_refuses_a_malformed_chain(tmp_path: Path) -> None:
    error = refusal(tmp_path, chain="not.a.jwt")
    assert error.reason == "delegation-invalid"
    assert "malformed-token" in error.detail


def test_startup_refuses_a_missing_token_file(tmp_path: Path) -> None:
    cfg = config(tmp_path, delegation={})
    with pytest.raises(ConfigError) as info:
        injector_for(cfg, Keys(PROXY), clock=Clock())
    assert info.value.reason == "delegation-unreadable"
    assert "requester.delegation.token_file" in info.value.detail


def test_startup_refuses_when_no_key_signs(tmp_path: Path) -> None:
    assert refusal(tmp_path, keys=Keys(None)).reason == "no-valid-signing-key"


@pytest.mark.parametrize(
    ("delegation", "over", "message"),
    [
        (
            {"expires_at": "2027-01-15T10:00:00Z"},
            {},
            "expires_at: 2027-01-15T10:00:00Z is later than the chain",
        ),
        ({"expires_at": "2027-01-15T07:00:00Z"}, {}, "expires_at: 2027-01-15T07:00:00Z has passed"),
        (
            {"max_spend_cents": 5001},
            {},
            "max_spend_cents: 5001 is above the chain's svc_max_spend_cents 5000",
        ),
        ({"max_accesses": 51}, {}, "max_accesses: 51 is above the chain's svc_max_accesses 50"),
        (
            {"quota_period": "3600s"},
            {},
            "quota_period: 3600s differs from the chain's svc_quota_period, 86400s",
        ),
        (
            {},
            {"scopes": ["dist:EU"]},
            "requester.scopes: \\['dist:EU'\\] not covered by the delegation's scope",
        ),
    ],
)
def test_startup_refuses_mirror_fields_wider_than_the_chain(
    tmp_path: Path, delegation: dict[str, Any], over: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        injector(tmp_path, delegation=delegation, **over)


def test_unspecified_type_never_reaches_the_injector(tmp_path: Path) -> None:
    from signing_proxy.config import ConfigError

    with pytest.raises(ConfigError, match="REQUESTER_TYPE_UNSPECIFIED"):
        config(tmp_path, type="REQUESTER_TYPE_UNSPECIFIED")


# --- per request: rotation, expiry and a changed token file ---------------------------------------


def test_after_a_key_rotation_injected_requests_fail_closed_with_503(tmp_path: Path) -> None:
    keys = Keys(PROXY)
    inj = injector(tmp_path, keys=keys)
    assert b"delegation" in apply(inj)
    keys.key = ROTATED  # the store rotated; the chain still names the old key
    with pytest.raises(ProxyError) as info:
        apply(inj)
    assert (info.value.status, info.value.reason) == (503, "delegation-holder-mismatch")
    assert "--holder-config" in info.value.detail
    with pytest.raises(ProxyError):
        inj.document()
    without = inj.document(delegation=False)  # for an exchange not listed: the identity only
    assert "delegation" not in without
    assert without == {k: v for k, v in json.loads(inj._pair[1]).items() if k != "delegation"}
    assert inj.check() == "delegation-holder-mismatch"
    # Requests the requester is not injected into are not affected.
    other = "https://pub.example/v1/svc.v1.ExchangeService/DiscoverResources"
    assert apply(inj, url=other) == BODY
    assert apply(inj, b'{"requester":{}}') == b'{"requester":{}}'


def test_an_expired_delegation_fails_closed_with_503(tmp_path: Path) -> None:
    clock = Clock()
    inj = injector(tmp_path, clock=clock)
    clock.now = NOW + HOUR
    with pytest.raises(ProxyError) as info:
        apply(inj)
    assert (info.value.status, info.value.reason) == (503, "delegation-expired")


def test_a_reissued_token_file_is_picked_up(tmp_path: Path) -> None:
    keys, clock = Keys(PROXY), Clock()
    inj = injector(tmp_path, keys=keys, clock=clock)
    keys.key = ROTATED
    write_chain(tmp_path / "delegation.jwt", make_chain(holder=ROTATED, exp=int(NOW) + 1800))
    os.utime(tmp_path / "delegation.jwt", ns=(1, 1))  # a different fingerprint even within one tick
    clock.now += 1.5
    with pytest.raises(ProxyError):  # requests never read the file: the old chain is still in force
        apply(inj)
    assert inj.reload()  # the service's periodic reload, off the event loop
    d = json.loads(apply(inj))["requester"]["delegation"]
    token = base64.b64decode(d["token"]).decode()
    verify_chain(token, owner_keys=[OWNER.public], holder_jkt=ROTATED.thumbprint, now=clock.now)
    assert d["expires_at"] == "2027-01-15T08:30:00Z"
    assert inj.check() == "ok"


def test_a_bad_new_token_file_is_refused_and_the_old_one_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    inj = injector(tmp_path, clock=clock)
    before = inj.document()
    write_chain(tmp_path / "delegation.jwt", make_chain(holder=ROTATED))  # bound to a key we do not sign with
    os.utime(tmp_path / "delegation.jwt", ns=(1, 1))
    clock.now += 1.5
    assert not inj.reload()
    assert json.loads(apply(inj))["requester"] == before
    assert "delegation not reloaded" in caplog.text
    assert ROTATED.thumbprint in caplog.text  # which key the refused file names


# --- in the pipeline: digest and signature cover the final body -----------------------------------


def test_the_pipeline_signs_the_body_with_the_requester(tmp_path: Path) -> None:
    clock = Clock()
    inj = injector(tmp_path, clock=clock)
    cfg = config(tmp_path)
    signer = Signer(Keys(PROXY), label="agent", validity_s=300, clock=clock)
    target = parse_absolute_uri(DISCOVER)
    out = SigningPipeline(config=cfg, signer=signer, bearers=BearerStore(()), requester=inj).prepare(
        "POST", target, JSON_LINES, BODY, framed=True
    )
    assert json.loads(out.body)["requester"] == inj.document()
    head = out.head.decode("latin-1").split("\r\n")[1:]
    lines = [tuple(line.split(": ", 1)) for line in head if ": " in line]
    fields = Fields([(n, v) for n, v in lines if n.lower() != "host"])
    assert fields.combined("content-digest") == content_digest(out.body)
    assert fields.combined("content-length") == str(len(out.body))
    stack = verify_stack(
        Message("POST", target, fields),
        out.body,
        lambda entry, _i: VerificationKey(PROXY.public) if entry.keyid == PROXY.thumbprint else None,
        now=clock.now,
    )
    assert stack.signatures[0].keyid == PROXY.thumbprint


def test_the_app_exposes_the_requester_and_refuses_to_start_with_a_mismatch(tmp_path: Path) -> None:
    write_chain(tmp_path / "delegation.jwt", make_chain())
    raw = {"intercept": {"enabled": False}}
    cfg = config(tmp_path, delegation={}).with_overrides(**raw)
    app = ProxyApp(cfg, Keys(PROXY), clock=Clock())
    assert app.requester is not None
    assert app.requester.document()["id"] == "agent-7"
    status, doc = app.readiness()
    assert doc["checks"]["delegation"] == "ok"  # type: ignore[index]
    assert status == 200
    with pytest.raises(ConfigError) as info:
        ProxyApp(cfg, Keys(ROTATED), clock=Clock())
    assert info.value.reason == "delegation-holder-mismatch"
    plain = ProxyApp(parse_config({"data_dir": str(tmp_path / "data"), **raw}), Keys(PROXY), clock=Clock())
    assert plain.requester is None


def test_a_configuration_reload_refuses_a_mismatched_delegation_and_keeps_the_running_one(
    tmp_path: Path,
) -> None:
    write_chain(tmp_path / "delegation.jwt", make_chain())
    raw = {"intercept": {"enabled": False}}
    cfg = config(tmp_path, delegation={}).with_overrides(**raw)
    app = ProxyApp(cfg, Keys(PROXY), clock=Clock())
    running = app.requester
    other = tmp_path / "other.jwt"
    write_chain(other, make_chain(holder=ROTATED))
    bad = cfg.with_overrides(**{"requester.delegation.token_file": str(other)})
    with pytest.raises(ConfigError) as info:
        app.reload(bad)
    assert info.value.reason == "delegation-holder-mismatch"
    assert app.requester is running  # nothing swapped
    app.reload(cfg.with_overrides(**{"requester.name": "Renamed"}))
    assert app.requester is not running
    assert app.requester is not None
    assert app.requester.document()["name"] == "Renamed"
    app.reload(parse_config({"data_dir": str(tmp_path / "data"), **raw}))
    assert app.requester is None
