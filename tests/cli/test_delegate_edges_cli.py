"""``signing-proxy delegate`` at its edges, through real subprocesses: NumericDates past year 9999
(``--expires``, ``--now``, a crafted ``exp``), an expiry not after now, a private key in a link, and
the token file ``run`` reads. Every refusal is one clean line, never a traceback."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from signing_proxy.core.jws import sign_jwt
from tests.cli.test_delegate_cli import DENIAL, Keys, ok, refused, store_key
from tests.harness import run_cli

LAST_SECOND = 253_402_300_799  # 9999-12-31T23:59:59Z, core.delegation.NUMERIC_DATE_MAX
OUT_OF_RANGE = "exp is out of range (a NumericDate from 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z)"


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path)


def issue(keys: Keys, expires: str) -> list[str]:
    holder = f"--holder-jkt={keys.principal.thumbprint}"
    return [
        "delegate",
        "issue",
        "--owner-key",
        keys.path("owner.pem"),
        "--iss",
        "o",
        holder,
        "--expires",
        expires,
    ]


def verify_args(keys: Keys, chain: str, holder: str = "principal.pem") -> list[str]:
    return ["delegate", "verify", chain, "--owner-jwks", str(keys.jwks), "--holder-key", keys.path(holder)]


def crafted(keys: Keys, exp: Any, holder: str | None = None) -> str:
    """An authority JWT the owner signed with an ``exp`` (None: none) our builders may refuse to write."""
    claims = {"iss": "o", "exp": exp, "cnf": {"jkt": holder or keys.principal.thumbprint}}
    return sign_jwt({k: v for k, v in claims.items() if v is not None}, keys.owner)


def clean(done: Any) -> None:
    assert "Traceback" not in done.stderr, done.stderr


# --- bug 3: NumericDates past 9999 --------------------------------------------------------------------


def test_issue_refuses_an_expires_past_9999_once_its_offset_is_applied(keys: Keys) -> None:
    # 9999-12-31T23:59:59-23:59 is 10000-01-01T23:58:59Z: it was signed, then verify and inspect crashed.
    error = refused(*issue(keys, "9999-12-31T23:59:59-23:59"))
    assert error == (
        "signing-proxy: --expires: '9999-12-31T23:59:59-23:59' is after 9999-12-31T23:59:59Z once its "
        "offset is applied\n"
    )
    last = ok(*issue(keys, "9999-12-31T23:59:59Z"))
    assert "expires_at:      9999-12-31T23:59:59Z" in ok(*verify_args(keys, last))
    assert json.loads(ok(*verify_args(keys, last), "--json"))["expires_at"] == "9999-12-31T23:59:59Z"
    assert "exp 9999-12-31T23:59:59Z" in ok("delegate", "inspect", last)


@pytest.mark.parametrize("now", ["0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-00:01"])
def test_inspect_and_verify_refuse_a_now_outside_rfc3339(keys: Keys, now: str) -> None:
    chain = keys.authority()
    expected = (
        f"signing-proxy: --now: {now!r} is outside 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z once its "
        "offset is applied\n"
    )
    assert refused("delegate", "inspect", chain, f"--now={now}") == expected
    assert refused("delegate", "inspect", chain, "--json", f"--now={now}") == expected
    assert refused(*verify_args(keys, chain), f"--now={now}") == expected


@pytest.mark.parametrize("exp", [LAST_SECOND + 1, 300_000_000_000, 2**53, -(2**53)])
def test_a_signed_exp_outside_rfc3339_is_refused_not_a_traceback(keys: Keys, exp: int) -> None:
    token = crafted(keys, exp)
    out = refused(*verify_args(keys, token), status=1)
    assert out == f"{DENIAL}: bad-claim-value: link 0: {OUT_OF_RANGE}\n"
    done = run_cli("delegate", "inspect", token)
    clean(done)
    assert done.returncode == 1
    assert "expiry:    BAD (exp is outside 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z)" in done.stdout
    assert f"result: {DENIAL}: bad-claim-value: link 0: {OUT_OF_RANGE}" in done.stdout
    done = run_cli("delegate", "inspect", token, "--json", "--owner-jwks", str(keys.jwks))
    clean(done)
    assert done.returncode == 1
    doc = json.loads(done.stdout)
    assert doc["links"][0]["status"]["expiry"] == "out-of-range"
    assert doc["result"]["reason"] == "bad-claim-value"
    extend = refused(
        "delegate",
        "extend",
        token,
        "--principal-key",
        keys.path("principal.pem"),
        f"--holder-jkt={keys.agent.thumbprint}",
    )
    assert OUT_OF_RANGE in extend


def _proxy(tmp_path: Path, **delegation: object) -> Path:
    """A proxy config whose key store exists and whose requester carries the chain in chain.jwt."""
    config = tmp_path / "proxy.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": "127.0.0.1:0",
                "data_dir": str(tmp_path / "data"),
                "requester": {
                    "id": "agent-7",
                    "domain": "agent.example",
                    "type": "REQUESTER_TYPE_AGENT",
                    "exchanges": ["https://exchange.example/v1"],
                    "delegation": {
                        "token_file": str(tmp_path / "chain.jwt"),
                        "principal_domain": "corp.example",
                        "principal_id": "alice@corp.example",
                        **delegation,
                    },
                },
            }
        )
    )
    ok("keys", "rotate", "--config", str(config))
    return config


def test_run_names_the_token_file_whose_exp_is_past_9999(keys: Keys, tmp_path: Path) -> None:
    # run exited 2 with only "malformed-timestamp: 300000000000 is outside the RFC 3339 range"
    config = _proxy(tmp_path)
    (tmp_path / "chain.jwt").write_text(crafted(keys, 300_000_000_000) + "\n")
    for command in (("run", "--config", str(config)), ("config", "check", str(config))):
        error = refused(*command)
        assert f"requester.delegation.token_file {tmp_path / 'chain.jwt'}: " in error
        assert f"bad-claim-value: link 0: {OUT_OF_RANGE}" in error


@pytest.mark.parametrize(
    ("mirror", "named"),
    [
        ({"max_accesses": 5}, "requester.delegation.max_accesses: the chain carries no svc_max_accesses"),
        ({"issuer": "https://other.example"}, "requester.delegation.issuer: 'https://other.example' is not"),
    ],
    ids=["cap-the-chain-lacks", "another-issuer"],
)
def test_config_check_refuses_the_mirrors_run_refuses(
    keys: Keys, tmp_path: Path, mirror: dict[str, object], named: str
) -> None:
    """``config check`` read the chain but checked none of what the Delegation mirrors of it: it said
    OK for a configuration ``run`` then refused (and the gateway would deny)."""
    config = _proxy(tmp_path, **mirror)
    exp = int(time.time()) + 3600
    (tmp_path / "chain.jwt").write_text(crafted(keys, exp, holder=store_key(tmp_path)) + "\n")
    for command in (("run", "--config", str(config)), ("config", "check", str(config))):
        assert named in refused(*command)


def test_run_refuses_a_configured_expires_at_past_9999(keys: Keys, tmp_path: Path) -> None:
    """Refused when the configuration is read (``config check`` too), before any key is looked at:
    an RFC 3339 value is read only within what can be written back."""
    config = _proxy(tmp_path)
    (tmp_path / "chain.jwt").write_text(crafted(keys, None, holder=store_key(tmp_path)) + "\n")
    doc = yaml.safe_load(config.read_text())
    doc["requester"]["delegation"]["expires_at"] = "9999-12-31T23:59:59-23:59"
    config.write_text(yaml.safe_dump(doc))
    said = (
        "requester.delegation.expires_at: '9999-12-31T23:59:59-23:59' is outside "
        "0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z\n"
    )
    for command in (("run", "--config", str(config)), ("config", "check", str(config))):
        error = refused(*command)
        assert error.startswith("signing-proxy: configuration error: "), error
        assert error.endswith(f"proxy.yaml: {said}"), error


# --- bug 7: an expiry not after now -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expires", "message"),
    [
        ("2000-01-01T00:00:00Z", "--expires: '2000-01-01T00:00:00Z' is not after now ("),
        ("1970-01-01T00:00:00Z", "--expires: '1970-01-01T00:00:00Z' is not after now ("),
        ("0s", "--expires: '0s' is no time from now; a duration must be positive"),
        ("0d", "--expires: '0d' is no time from now; a duration must be positive"),
    ],
)
def test_issue_and_extend_refuse_an_expiry_not_after_now(keys: Keys, expires: str, message: str) -> None:
    error = refused(*issue(keys, expires))
    assert message in error
    assert "neither a duration" not in error
    extend = refused(
        "delegate",
        "extend",
        keys.authority(),
        "--principal-key",
        keys.path("principal.pem"),
        f"--holder-jkt={keys.agent.thumbprint}",
        "--expires",
        expires,
    )
    assert message in extend


# --- bug 8: a private key in a link -------------------------------------------------------------------


def test_inspect_never_prints_a_private_key_a_link_carries(keys: Keys) -> None:
    authority = keys.authority()
    secret = keys.principal.to_jwk()["d"]
    child_claims = {"iss": "p", "exp": int(time.time()) + 600, "cnf": {"jkt": keys.agent.thumbprint}}
    child = sign_jwt(
        {**child_claims, "scope": "dist:US:CA", "svc_max_spend_cents": "10", "svc_max_accesses": 1},
        keys.principal,
        {"jwk": keys.principal.to_jwk()},  # the principal's private JWK, d and all
    )
    chain = f"{authority}~{child}"
    warning = "warning: link 1 carries a private key (d; not shown)"
    text = run_cli("delegate", "inspect", chain)
    clean(text)
    assert text.returncode == 1
    assert secret not in text.stdout + text.stderr
    assert '"d":"(not shown)"' in text.stdout
    assert warning in text.stderr
    assert "result: DENIAL_REASON_DELEGATION_INVALID: malformed-token: link 1" in text.stdout
    as_json = run_cli("delegate", "inspect", chain, "--json", "--owner-jwks", str(keys.jwks))
    assert as_json.returncode == 1
    assert secret not in as_json.stdout + as_json.stderr
    assert json.loads(as_json.stdout)["links"][1]["header"]["jwk"]["d"] == "(not shown)"
    assert warning in as_json.stderr
    # verify refuses the link and never echoes it either
    out = refused(*verify_args(keys, chain, "agent.pem"), status=1)
    assert secret not in out
    assert out.startswith(f"{DENIAL}: malformed-token: link 1:")


def test_inspect_flags_a_private_key_even_where_no_verifier_looks(keys: Keys) -> None:
    # The authority's header jwk is never consulted (the owner keys are the anchors): the chain is
    # valid, but whoever holds it holds the owner's private key. inspect hides it and exits 1.
    claims = {"iss": "o", "exp": int(time.time()) + 600, "cnf": {"jkt": keys.principal.thumbprint}}
    token = sign_jwt(claims, keys.owner, {"jwk": keys.owner.to_jwk()})
    secret = keys.owner.to_jwk()["d"]
    assert "ok: 1 link(s)" in ok(*verify_args(keys, token))
    done = run_cli("delegate", "inspect", token, "--owner-jwks", str(keys.jwks))
    assert done.returncode == 1
    assert secret not in done.stdout + done.stderr
    assert "result: ok" in done.stdout
    assert "warning: link 0 carries a private key (d; not shown)" in done.stderr
