"""``signing-proxy delegate issue|extend|inspect|verify`` through real subprocesses."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.jws import parse_jwt
from signing_proxy.core.keys import format_rfc3339
from signing_proxy.storage.keystore import KeyStore
from tests.harness import run_cli

DENIAL = "DENIAL_REASON_DELEGATION_INVALID"


def ok(*args: str) -> str:
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def refused(*args: str, status: int = 2) -> str:
    done = run_cli(*args)
    assert done.returncode == status, (done.stdout, done.stderr)
    if status == 2:
        assert done.stderr.count("\n") == 1, done.stderr  # one line
        assert done.stdout == ""
    return done.stderr if status == 2 else done.stdout


def claims(token: str, index: int = -1) -> dict[str, Any]:
    return parse_jwt(token.split("~")[index]).claims


class Keys:
    """Owner, principal, agent key files (0600) and their public halves as PEM and JWK."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.owner, self.principal, self.agent = (SigningKey.generate() for _ in range(3))
        for name in ("owner", "principal", "agent"):
            key: SigningKey = getattr(self, name)
            path = tmp / f"{name}.pem"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(key.to_pem())
        (tmp / "agent.pub.jwk").write_text(json.dumps(self.agent.public.jwk()))
        self.jwks = tmp / "owner.jwks"
        self.jwks.write_text(json.dumps({"keys": [self.owner.public.jwk()]}))

    def path(self, name: str) -> str:
        return str(self.tmp / name)

    def authority(self, *extra: str, holder: str = "principal.pem") -> str:
        return ok(
            "delegate",
            "issue",
            "--owner-key",
            self.path("owner.pem"),
            "--iss",
            "https://owner.example",
            "--holder-key",
            self.path(holder),
            "--scope",
            "dist:US:*",
            "--scope",
            "subscription:news",
            "--expires",
            "2h",
            "--max-spend-cents",
            "10000",
            "--max-accesses",
            "100",
            "--quota-period",
            "1d",
            *extra,
        )


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path)


@pytest.fixture
def proxy_config(tmp_path: Path) -> Path:
    """A proxy config whose key store exists (as after `keys rotate` or a first run)."""
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data")}))
    ok("keys", "rotate", "--config", str(path))
    return path


def store_key(tmp_path: Path) -> str:
    state = KeyStore(tmp_path / "data").load(private=False)
    chosen = state.signing_record(time.time())
    assert chosen is not None
    return chosen.thumbprint


@pytest.mark.parametrize("action", ["issue", "extend", "inspect", "verify"])
def test_every_delegate_command_has_help(action: str) -> None:
    done = run_cli("delegate", action, "--help")
    assert done.returncode == 0
    assert f"usage: signing-proxy delegate {action}" in done.stdout


# --- issue --------------------------------------------------------------------------------------------


def test_issue_prints_the_authority_jwt(keys: Keys) -> None:
    before = int(time.time())
    token = keys.authority()
    assert "~" not in token
    assert "\n" not in token
    parsed = parse_jwt(token)
    assert parsed.header == {"alg": "EdDSA", "typ": "JWT"}
    c = parsed.claims
    assert c["iss"] == "https://owner.example"
    assert c["cnf"] == {"jkt": keys.principal.thumbprint}
    assert c["scope"] == "dist:US:* subscription:news"
    assert before + 7200 <= c["exp"] <= int(time.time()) + 7200
    assert c["svc_max_spend_cents"] == "10000"  # int64 in proto-JSON: a string
    assert c["svc_max_accesses"] == 100
    assert c["svc_quota_period"] == "86400s"
    assert keys.owner.public.verify(parsed.jws.signature, parsed.jws.signing_input)


@pytest.mark.parametrize("holder", ["principal.pem", "agent.pub.jwk"])
def test_issue_holder_may_be_a_private_or_public_key_file(keys: Keys, holder: str) -> None:
    token = keys.authority(holder=holder)
    expected = keys.principal if holder == "principal.pem" else keys.agent
    assert claims(token)["cnf"]["jkt"] == expected.thumbprint


def test_issue_with_holder_jkt_and_rfc3339_expiry(keys: Keys) -> None:
    exp = format_rfc3339(time.time() + 3600)
    token = ok(
        "delegate",
        "issue",
        "--owner-key",
        keys.path("owner.pem"),
        "--iss",
        "owner",
        f"--holder-jkt={keys.agent.thumbprint}",
        "--expires",
        exp,
    )
    c = claims(token)
    assert c["cnf"]["jkt"] == keys.agent.thumbprint
    assert format_rfc3339(c["exp"]) == exp
    assert "scope" not in c  # no --scope: unrestricted


def test_issue_refuses_bad_input_with_one_line(keys: Keys) -> None:
    base = ("delegate", "issue", "--owner-key", keys.path("owner.pem"), "--iss", "o", "--expires", "1h")
    holder = f"--holder-jkt={keys.agent.thumbprint}"
    assert "name the holder once" in refused(*base)
    assert "name the holder once" in refused(*base, holder, "--holder-key", keys.path("agent.pem"))
    assert "--holder-jkt" in refused(*base, "--holder-jkt=abc")
    assert "--scope 'dist::x'" in refused(*base, holder, "--scope", "dist::x")
    for expires in ("tomorrow", "0s", "36501d"):  # no date; already expired; over 100 years (durations)
        assert "--expires" in refused(*base[:-2], "--expires", expires, holder)
    os.chmod(keys.tmp / "owner.pem", 0o644)
    assert "--owner-key" in refused(*base, holder)


# --- extend -------------------------------------------------------------------------------------------


def test_extend_to_the_proxy_key_with_holder_config(keys: Keys, proxy_config: Path, tmp_path: Path) -> None:
    (tmp_path / "authority.jwt").write_text(keys.authority() + "\n")
    done = run_cli(
        "delegate",
        "extend",
        "@" + str(tmp_path / "authority.jwt"),
        "--principal-key",
        keys.path("principal.pem"),
        "--holder-config",
        str(proxy_config),
        "--scope",
        "dist:US:CA",
        "--expires",
        "1h",
    )
    assert done.returncode == 0, done.stderr
    chain = done.stdout.strip()
    proxy_jkt = store_key(tmp_path)
    assert f"holder: the proxy's signing key {proxy_jkt}" in done.stderr
    assert len(chain.split("~")) == 2
    child = parse_jwt(chain.split("~")[1])
    assert child.header["jwk"] == keys.principal.public.jwk()
    assert child.claims["cnf"] == {"jkt": proxy_jkt}
    assert child.claims["scope"] == "dist:US:CA"
    # caps default to the parent's (a child restates them; absent would mean none)
    assert child.claims["svc_max_spend_cents"] == "10000"
    assert child.claims["svc_max_accesses"] == 100
    assert child.claims["svc_quota_period"] == "86400s"
    assert child.claims["iss"].endswith(keys.principal.thumbprint)
    # --data-dir names the same key, without a config file
    again = ok(
        "delegate",
        "extend",
        chain.split("~")[0],
        "--principal-key",
        keys.path("principal.pem"),
        "--data-dir",
        str(tmp_path / "data"),
    )
    assert claims(again)["cnf"]["jkt"] == proxy_jkt
    assert claims(again)["exp"] == claims(again, 0)["exp"]  # default: the parent's exp
    assert claims(again)["scope"] == claims(again, 0)["scope"]


def test_extend_with_a_static_signing_key_config(keys: Keys, tmp_path: Path) -> None:
    config = tmp_path / "static.yaml"
    config.write_text(
        yaml.safe_dump({"data_dir": str(tmp_path / "d2"), "signing": {"key": keys.path("agent.pem")}})
    )
    chain = ok(
        "delegate",
        "extend",
        keys.authority(),
        "--principal-key",
        keys.path("principal.pem"),
        "--holder-config",
        str(config),
    )
    assert claims(chain)["cnf"]["jkt"] == keys.agent.thumbprint


def test_extend_reads_the_chain_from_stdin(keys: Keys) -> None:
    done = run_cli(
        "delegate",
        "extend",
        "@-",
        "--principal-key",
        keys.path("principal.pem"),
        f"--holder-jkt={keys.agent.thumbprint}",
        stdin=keys.authority() + "\n",
    )
    assert done.returncode == 0, done.stderr
    assert claims(done.stdout.strip())["cnf"]["jkt"] == keys.agent.thumbprint


@pytest.mark.parametrize(
    ("flags", "rule", "reason"),
    [
        (("--scope", "dist:EU"), "may only narrow its parent's scope", "scope-widened"),
        (("--scope", "*"), "may only narrow its parent's scope", "scope-widened"),
        (("--max-spend-cents", "10001"), "may not raise", "cap-raised"),
        (("--max-accesses", "101"), "may not raise", "cap-raised"),
        (("--quota-period", "1h"), "re-period", "cap-raised"),
        (("--expires", "3h"), "may not outlive its parent", "outlives-parent"),
    ],
)
def test_extend_refuses_to_widen_and_names_the_rule(
    keys: Keys, flags: tuple[str, ...], rule: str, reason: str
) -> None:
    error = refused(
        "delegate",
        "extend",
        keys.authority(),
        "--principal-key",
        keys.path("principal.pem"),
        f"--holder-jkt={keys.agent.thumbprint}",
        *flags,
    )
    assert rule in error
    assert f"{DENIAL}: {reason}: link 1:" in error


def test_extend_refuses_a_principal_key_the_chain_does_not_name(keys: Keys) -> None:
    error = refused(
        "delegate",
        "extend",
        keys.authority(),
        "--principal-key",
        keys.path("agent.pem"),
        f"--holder-jkt={keys.agent.thumbprint}",
    )
    assert "signer-not-named-by-parent" in error
    assert "--principal-key must be the key" in error


def test_extend_without_a_key_store_says_how_to_make_one(keys: Keys, tmp_path: Path) -> None:
    error = refused(
        "delegate",
        "extend",
        keys.authority(),
        "--principal-key",
        keys.path("principal.pem"),
        "--data-dir",
        str(tmp_path / "none"),
    )
    assert "no key store" in error
    assert "keys rotate" in error


# --- inspect ------------------------------------------------------------------------------------------


def three_links(keys: Keys, proxy_jkt: str) -> str:
    """owner -> principal -> agent (sub-delegation) -> proxy."""
    two = ok(
        "delegate",
        "extend",
        keys.authority(),
        "--principal-key",
        keys.path("principal.pem"),
        "--holder-key",
        keys.path("agent.pub.jwk"),
        "--scope",
        "dist:US:CA",
        "--expires",
        "90m",
    )
    return ok(
        "delegate", "extend", two, "--principal-key", keys.path("agent.pem"), f"--holder-jkt={proxy_jkt}"
    )


def test_inspect_shows_each_link_and_its_status(keys: Keys, tmp_path: Path) -> None:
    chain = three_links(keys, SigningKey.generate().thumbprint)
    done = run_cli("delegate", "inspect", chain, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert [link["index"] for link in doc["links"]] == [0, 1, 2]
    assert doc["links"][0]["status"] == {"linkage": "anchor", "signature": "not-checked", "expiry": "ok"}
    for link in doc["links"][1:]:
        assert link["status"] == {"signature": "ok", "linkage": "ok", "expiry": "ok"}
    assert doc["links"][1]["signer_jkt"] == keys.principal.thumbprint
    assert doc["links"][2]["signer_jkt"] == keys.agent.thumbprint
    assert doc["links"][2]["header"]["jwk"] == keys.agent.public.jwk()
    assert doc["result"] == {"ok": True, "anchored": False}
    text = ok("delegate", "inspect", chain)
    assert "link 2 (delegation)" in text
    assert "not checked (needs the owner's key: --owner-jwks)" in text
    assert "result: ok (except the authority's signature" in text
    anchored = json.loads(ok("delegate", "inspect", chain, "--json", "--owner-jwks", str(keys.jwks)))
    assert anchored["links"][0]["status"]["signature"] == "ok"
    assert anchored["links"][0]["signer_jkt"] == keys.owner.thumbprint
    assert anchored["result"] == {"ok": True, "anchored": True}


def test_inspect_flags_a_tampered_link_and_expiry(keys: Keys) -> None:
    chain = three_links(keys, SigningKey.generate().thumbprint)
    links = chain.split("~")
    h, p, s = links[1].split(".")
    links[1] = f"{h}.{p}.{('B' if s[0] == 'A' else 'A')}{s[1:]}"
    done = run_cli("delegate", "inspect", "~".join(links), "--json")
    assert done.returncode == 1
    doc = json.loads(done.stdout)
    assert doc["links"][1]["status"]["signature"] == "bad"
    assert doc["result"]["ok"] is False
    assert doc["result"]["reason"] == "signer-not-named-by-parent"
    later = format_rfc3339(time.time() + 6 * 3600)
    done = run_cli("delegate", "inspect", chain, "--now", later)
    assert done.returncode == 1
    assert "EXPIRED" in done.stdout
    assert f"result: {DENIAL}: expired: link 0" in done.stdout


def test_inspect_refuses_what_is_not_a_chain() -> None:
    assert "not a delegation chain" in refused("delegate", "inspect", "abc")
    assert "not a delegation chain" in refused("delegate", "inspect", "a.b.c~~d.e.f")


# --- verify -------------------------------------------------------------------------------------------


def test_verify_accepts_a_chain_bound_to_the_holder(keys: Keys, proxy_config: Path, tmp_path: Path) -> None:
    chain = three_links(keys, store_key(tmp_path))
    done = run_cli(
        "delegate",
        "verify",
        chain,
        "--owner-jwks",
        str(keys.jwks),
        "--holder-config",
        str(proxy_config),
        "--json",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["valid"] is True
    assert doc["links"] == 3
    assert doc["holder_jkt"] == store_key(tmp_path)
    assert doc["owner_jkt"] == keys.owner.thumbprint
    assert doc["scope"] == ["dist:US:CA"]
    assert doc["max_spend_cents"] == 10000
    assert doc["quota_period"] == "86400s"
    text = ok(
        "delegate", "verify", chain, "--owner-jwks", str(keys.jwks), f"--holder-jkt={store_key(tmp_path)}"
    )
    assert text.startswith("ok: 3 link(s)")
    assert "scope:           dist:US:CA" in text


def test_verify_refuses_with_the_denial_reason(keys: Keys, tmp_path: Path) -> None:
    chain = three_links(keys, keys.owner.thumbprint)
    out = refused(
        "delegate",
        "verify",
        chain,
        "--owner-jwks",
        str(keys.jwks),
        "--holder-key",
        keys.path("agent.pem"),
        status=1,
    )
    assert (
        out.strip()
        == f"{DENIAL}: holder-mismatch: link 2: cnf.jkt is not the thumbprint of the request signer"
    )
    other = tmp_path / "other.jwks"
    other.write_text(json.dumps({"keys": [SigningKey.generate().public.jwk()]}))
    out = refused(
        "delegate",
        "verify",
        chain,
        "--owner-jwks",
        str(other),
        "--holder-key",
        keys.path("owner.pem"),
        status=1,
    )
    assert out.startswith(f"{DENIAL}: untrusted-issuer-key: link 0:")
    later = format_rfc3339(time.time() + 3 * 3600)
    out = refused(
        "delegate",
        "verify",
        chain,
        "--owner-jwks",
        str(keys.jwks),
        "--holder-key",
        keys.path("owner.pem"),
        "--now",
        later,
        status=1,
    )
    assert out.startswith(f"{DENIAL}: expired: link 0:")


def test_verify_owner_key_windows_and_issuer_grace(keys: Keys, tmp_path: Path) -> None:
    chain = keys.authority()
    jwk = {**keys.owner.public.jwk(), "use": "sig", "alg": "EdDSA"}
    ended = format_rfc3339(time.time() - 600)
    windowed = tmp_path / "windowed.jwks"
    windowed.write_text(
        json.dumps({"keys": [{**jwk, "not_before": "2020-01-01T00:00:00Z", "not_after": ended}]})
    )
    args = (
        "delegate",
        "verify",
        chain,
        "--owner-jwks",
        str(windowed),
        "--holder-key",
        keys.path("principal.pem"),
    )
    done = run_cli(*args)
    assert done.returncode == 1
    assert "untrusted-issuer-key" in done.stdout
    assert "outside their window" in done.stderr
    assert run_cli(*args, "--issuer-grace", "1h").returncode == 0  # a recently rotated owner key


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "must be a JWK Set"),
        ({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "AAAA", "d": "AAAA"}]}, "private"),
        ({"keys": [{"kty": "RSA", "n": "x", "e": "AQAB"}]}, "only OKP/Ed25519"),
        ({"keys": [{"not_before": "2020-01-01T00:00:00Z"}]}, "both not_before and not_after"),
    ],
)
def test_verify_refuses_a_bad_owner_jwks(keys: Keys, tmp_path: Path, doc: Any, message: str) -> None:
    path = tmp_path / "bad.jwks"
    path.write_text(json.dumps(doc))
    error = refused(
        "delegate",
        "verify",
        keys.authority(),
        "--owner-jwks",
        str(path),
        f"--holder-jkt={keys.agent.thumbprint}",
    )
    assert message in error
    assert "--owner-jwks" in error
