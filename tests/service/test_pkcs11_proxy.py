"""The proxy signing with a key on a real SoftHSM2 token (``signing.key: pkcs11:...``): generated on
the token by the CLI, requests signed through the proxy verify at the origin with the token's public
key under our verifier and ``http-message-signatures``; a wrong PIN or a missing token refuses the
start with the reason; a token removed at run time gives a 503 problem (never an unsigned request)
and ``/readyz`` not ready, and both recover when the token comes back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
import yaml

from signing_proxy.core.b64 import b64url_decode
from signing_proxy.core.jwk import PublicKey
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin, free_port, run_cli, wait_for
from tests.softhsm import PIN, SoftHsm

pytestmark = pytest.mark.integration


def via(proxy: ProxyProcess, url: str) -> requests.Response:
    return requests.get(url, proxies={"http": proxy.url}, timeout=WAIT_S)


def ready(proxy: ProxyProcess) -> requests.Response:
    return requests.get(proxy.url + "/readyz", timeout=WAIT_S)


def token_config(tmp_path: Path, hsm: SoftHsm) -> Path:
    path = tmp_path / "token.yaml"
    path.write_text(yaml.safe_dump({"signing": {"pkcs11": hsm.pkcs11_config()}}))
    return path


def generate(tmp_path: Path, hsm: SoftHsm, obj: str = "agent") -> PublicKey:
    """``keys generate --pkcs11``; the public key from ``keys show --pkcs11`` (read from the token)."""
    config = str(token_config(tmp_path, hsm))
    made = run_cli("keys", "generate", "--config", config, "--pkcs11", hsm.uri(obj), env=hsm.env())
    assert made.returncode == 0, made.stderr
    public = shown_public(tmp_path, hsm, obj)
    assert "thumbprint: " + public.thumbprint in made.stdout
    assert PIN not in made.stdout + made.stderr
    return public


def proxy_config(hsm: SoftHsm, obj: str = "agent") -> dict[str, object]:
    return {"signing": {"key": hsm.uri(obj), "pkcs11": hsm.pkcs11_config()}}


def test_requests_signed_on_the_token_verify_at_the_origin(tmp_path: Path) -> None:
    hsm = SoftHsm(tmp_path)
    public = generate(tmp_path, hsm)
    with VerifyingOrigin() as origin, ProxyProcess(tmp_path, proxy_config(hsm), env=hsm.env()) as proxy:
        origin.trust(public)
        for path in ("/a", "/b?q=1"):
            answer = via(proxy, origin.url(path))
            assert answer.status_code == 200
        assert [a.verified for a in origin.arrivals] == [True, True]
        assert [a.oracle for a in origin.arrivals] == ["ok", "ok"]  # http-message-signatures agrees
        assert {k for a in origin.arrivals for k in a.keyids} == {public.thumbprint}
        assert ready(proxy).status_code == 200
        assert f"keyid={public.thumbprint}" in "\n".join(proxy.stderr_lines)
        assert PIN not in "\n".join(proxy.stderr_lines)


def test_wrong_pin_and_missing_token_refuse_the_start_by_name(tmp_path: Path) -> None:
    hsm = SoftHsm(tmp_path)
    generate(tmp_path, hsm)
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump({"listen": "127.0.0.1:0", "data_dir": str(tmp_path), **proxy_config(hsm)})
    )

    wrong = run_cli("run", "--config", str(config), env=hsm.env(pin="0000-wrong"))
    assert wrong.returncode == 2
    assert "signing.key" in wrong.stderr
    assert "refused the PIN (token-pin-incorrect)" in wrong.stderr
    assert "0000-wrong" not in wrong.stderr
    assert PIN not in wrong.stderr

    with hsm.removed():
        missing = run_cli("run", "--config", str(config), env=hsm.env())
    assert missing.returncode == 2
    assert "token-missing" in missing.stderr
    assert "agent-keys" in missing.stderr  # the token it looked for


def test_a_removed_token_fails_closed_and_recovers(tmp_path: Path) -> None:
    hsm = SoftHsm(tmp_path)
    public = generate(tmp_path, hsm)
    with VerifyingOrigin() as origin, ProxyProcess(tmp_path, proxy_config(hsm), env=hsm.env()) as proxy:
        origin.trust(public)
        assert via(proxy, origin.url("/before")).status_code == 200
        with hsm.removed():
            refused = via(proxy, origin.url("/while-removed"))
            assert refused.status_code == 503
            assert refused.headers["Content-Type"].startswith("application/problem+json")
            assert refused.json()["reason"] == "signing-token-unavailable"
            readiness = ready(proxy)
            assert readiness.status_code == 503
            assert readiness.json()["checks"]["signing_key"] != "ok"
            assert [a.target_uri.rsplit("/", 1)[1] for a in origin.arrivals] == ["before"]  # nothing unsigned
        wait_for(lambda: ready(proxy).status_code == 200, "readiness once the token is back")
        assert via(proxy, origin.url("/after")).status_code == 200
        assert [a.verified for a in origin.arrivals] == [True, True]
        assert origin.arrivals[-1].oracle == "ok"


def test_a_store_rotates_to_a_token_key_that_signs_and_is_published(tmp_path: Path) -> None:
    hsm = SoftHsm(tmp_path)
    data = tmp_path / "data"
    config = tmp_path / "store.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(data), "signing": {"pkcs11": hsm.pkcs11_config()}}))
    first = run_cli("keys", "rotate", "--config", str(config), env=hsm.env())  # a file key, to begin
    assert first.returncode == 0, first.stderr
    rotated = run_cli(
        "keys", "rotate", "--config", str(config), "--pkcs11", hsm.uri("agent"), "--now", env=hsm.env()
    )
    assert rotated.returncode == 0, rotated.stderr
    assert "generated " in rotated.stdout
    public = shown_public(tmp_path, hsm)
    assert f"new key {public.thumbprint}: published now, signs now" in rotated.stdout
    listed = run_cli("keys", "list", "--json", "--config", str(config), env=hsm.env())
    assert listed.returncode == 0, listed.stderr
    where = {k["thumbprint"]: k["pkcs11"] for k in json.loads(listed.stdout)["keys"]}
    recorded = where[public.thumbprint]  # the token key is marked, by its URI (with the object's id)
    assert recorded is not None
    assert recorded.startswith(hsm.uri("agent") + ";id=")
    assert [uri for thumbprint, uri in where.items() if thumbprint != public.thumbprint] == [None]
    text = run_cli("keys", "list", "--config", str(config), env=hsm.env()).stdout
    assert f"(on a token: {recorded})" in text
    assert PIN not in listed.stdout + text

    out = tmp_path / "site"
    published = run_cli("publish", "--config", str(config), "--out", str(out), "--domain", "agent.example")
    assert published.returncode == 0, published.stderr
    directory = (out / ".well-known" / "http-message-signatures-directory").read_bytes()
    assert public.jwk()["x"].encode() in directory

    proxy_cfg = {"data_dir": str(data), "signing": {"key": None, "pkcs11": hsm.pkcs11_config()}}
    with VerifyingOrigin() as origin, ProxyProcess(tmp_path, proxy_cfg, env=hsm.env()) as proxy:
        origin.trust(public)
        assert via(proxy, origin.url("/from-the-store")).status_code == 200
        assert origin.arrivals[-1].verified
        assert origin.arrivals[-1].oracle == "ok"
        assert origin.arrivals[-1].keyids == [public.thumbprint]


def shown_public(tmp_path: Path, hsm: SoftHsm, obj: str = "agent") -> PublicKey:
    """The public key of the token's key ``obj`` as ``keys show --pkcs11`` prints it."""
    config = str(token_config(tmp_path, hsm))
    shown = run_cli("keys", "show", "--config", config, "--pkcs11", hsm.uri(obj), env=hsm.env())
    assert shown.returncode == 0, shown.stderr
    assert PIN not in shown.stdout + shown.stderr
    lines = dict(line.split(":", 1) for line in shown.stdout.splitlines())
    public = PublicKey.from_raw(b64url_decode(json.loads(lines["public jwk"])["x"]))
    assert public.thumbprint == lines["thumbprint"].strip()
    return public


def test_a_relay_stacks_its_label_with_a_token_key(tmp_path: Path) -> None:
    hsm = SoftHsm(tmp_path)
    public = generate(tmp_path, hsm)
    relay_port = free_port()
    relay_cfg = {
        "mode": "relay",
        "listen": f"127.0.0.1:{relay_port}",
        "signing": {"key": hsm.uri("agent"), "label": "broker", "pkcs11": hsm.pkcs11_config()},
        "relay": {"verify": False},
    }
    (tmp_path / "relay").mkdir()
    (tmp_path / "agent").mkdir()
    agent_cfg = {"upstream": {"next_hop": f"http://127.0.0.1:{relay_port}"}}
    with (
        VerifyingOrigin() as origin,
        ProxyProcess(tmp_path / "relay", relay_cfg, env=hsm.env()),
        ProxyProcess(tmp_path / "agent", agent_cfg) as agent,
    ):
        origin.trust(public, agent.key)
        assert via(agent, origin.url("/relayed")).status_code == 200
    arrival = origin.arrivals[-1]
    assert arrival.verified, arrival.reason
    assert arrival.oracle == "ok", arrival.oracle
    assert arrival.labels == ["agent", "broker"]
    assert arrival.keyids == [agent.key.thumbprint, public.thumbprint]


def test_workers_are_refused_with_a_token_key(tmp_path: Path) -> None:
    hsm = SoftHsm(tmp_path)
    generate(tmp_path, hsm)
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump({"listen": "127.0.0.1:0", "data_dir": str(tmp_path), **proxy_config(hsm)})
    )
    refused = run_cli("run", "--config", str(config), "--workers", "2", env=hsm.env())
    assert refused.returncode == 2
    assert "--workers" in refused.stderr
    assert "PKCS#11" in refused.stderr


def test_a_pin_after_an_ampersand_is_refused_and_never_shown(tmp_path: Path) -> None:
    """``object=agent&pin-value=PIN`` ("&" for "?") parsed as the object label "agent&pin-value=PIN"
    (RFC 7512 lets "&" and "=" into a path value): ``run`` and ``keys show`` asked the token for
    that key and printed "no private key object 'agent&pin-value=4711-user' ..." with the PIN."""
    hsm = SoftHsm(tmp_path)
    generate(tmp_path, hsm)
    uri = f"pkcs11:token={hsm.label};object=agent&pin-value={PIN}"
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": "127.0.0.1:0",
                "data_dir": str(tmp_path),
                "signing": {"key": uri, "pkcs11": hsm.pkcs11_config()},
            }
        )
    )
    run = run_cli("run", "--config", str(config), env=hsm.env())
    show = run_cli(
        "keys", "show", "--config", str(token_config(tmp_path, hsm)), "--pkcs11", uri, env=hsm.env()
    )
    for done, where in ((run, "signing.key"), (show, "--pkcs11")):
        assert done.returncode == 2, done.stderr
        assert f"{where}: path attribute 'object': its value holds what looks like query attribute" in (
            done.stderr
        )
        assert "'pin-value'" in done.stderr
        assert "token-key-missing" not in done.stderr  # refused before the token is asked
        assert PIN not in done.stdout + done.stderr
        assert "4711" not in done.stdout + done.stderr
