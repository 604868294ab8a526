"""``delegate inspect`` never prints a private key, even one whose JWK lacks ``kty`` (a leaked key
need not be well formed): under a header's ``jwk``, or in any object of a link that looks like a
key, the private members are shown as ``(not shown)`` with the warning naming the link."""

from __future__ import annotations

import json
from typing import Any

import pytest

from signing_proxy.cli.main import main
from signing_proxy.core.delegation import issue_authority
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.jws import sign_jwt
from signing_proxy.core.keys import format_rfc3339

NOW = 1_800_000_000
AT = format_rfc3339(NOW)
OWNER = SigningKey.from_seed(b"\x41" * 32)
PRINCIPAL = SigningKey.from_seed(b"\x42" * 32)
AGENT = SigningKey.from_seed(b"\x43" * 32)
SECRET = PRINCIPAL.to_jwk()["d"]
KEYLESS = {"crv": "Ed25519", "x": PRINCIPAL.public.jwk()["x"], "d": SECRET}  # kty forgotten


def leaky_chain(header: dict[str, Any], claims: dict[str, Any]) -> str:
    authority = issue_authority(
        OWNER, iss="https://owner.example", holder_jkt=PRINCIPAL.thumbprint, now=NOW, exp=NOW + 3600
    )
    child = sign_jwt(
        {"iss": "p", "exp": NOW + 600, "cnf": {"jkt": AGENT.thumbprint}, **claims}, PRINCIPAL, header
    )
    return f"{authority}~{child}"


WHERE = [
    pytest.param({"jwk": KEYLESS}, {}, ("header", "jwk"), id="header-jwk-without-kty"),
    pytest.param(
        {"jwk": {"crv": "Ed25519", "d": SECRET}}, {}, ("header", "jwk"), id="header-jwk-without-kty-or-x"
    ),
    pytest.param({}, {"svc_key": KEYLESS}, ("claims", "svc_key"), id="claim-that-looks-like-a-key"),
    pytest.param({}, {"cnf_jwk": {"jwk": {"d": SECRET}}}, ("claims", "cnf_jwk", "jwk"), id="claims-jwk"),
]


@pytest.mark.parametrize(("header", "claims", "path"), WHERE)
def test_inspect_hides_a_private_key_without_kty_in_text(
    capsys: pytest.CaptureFixture[str], header: dict[str, Any], claims: dict[str, Any], path: tuple[str, ...]
) -> None:
    status = main(["delegate", "inspect", leaky_chain(header, claims), "--now", AT])
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    assert '"d":"(not shown)"' in out
    assert "warning: link 1 carries a private key (d; not shown)" in err
    assert status == 1


@pytest.mark.parametrize(("header", "claims", "path"), WHERE)
def test_inspect_hides_a_private_key_without_kty_in_json(
    capsys: pytest.CaptureFixture[str], header: dict[str, Any], claims: dict[str, Any], path: tuple[str, ...]
) -> None:
    status = main(["delegate", "inspect", leaky_chain(header, claims), "--json", "--now", AT])
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    shown: Any = json.loads(out)["links"][1]
    for name in path:
        shown = shown[name]
    assert shown["d"] == "(not shown)"
    assert "warning: link 1 carries a private key (d; not shown)" in err
    assert status == 1


def test_a_claim_that_is_not_a_key_is_shown_as_is(capsys: pytest.CaptureFixture[str]) -> None:
    # the heuristic hides members of key-like objects only: a custom claim with a "d" is not a key
    chain = leaky_chain({}, {"svc_note": {"d": "ordinary"}})
    main(["delegate", "inspect", chain, "--json", "--now", AT])
    out, err = capsys.readouterr()
    assert json.loads(out)["links"][1]["claims"]["svc_note"] == {"d": "ordinary"}
    assert "private key" not in err
