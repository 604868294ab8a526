"""A refusal says what fixes it (the flag, the configuration key, the variable), through real subprocesses."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from signing_proxy.core.jwk import SigningKey
from tests.harness import WAIT_S, ProxyProcess, run_cli, started


@contextmanager
def verify_origin(*flags: str) -> Iterator[int]:
    """``signing-proxy verify-origin --listen 127.0.0.1:0 FLAGS``: its port; stopped by PID after."""
    with started("verify-origin", "--listen", "127.0.0.1:0", *flags, until="listening on") as lines:
        assert "verify-origin listening on http://127.0.0.1:" in lines[-1], lines
        yield int(lines[-1].rsplit(":", 1)[1])


def test_publish_without_a_domain_names_the_flag_the_key_and_the_variable(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    assert run_cli("keys", "rotate", "--data-dir", data).returncode == 0
    done = run_cli("publish", "--out", str(tmp_path / "public"), "--data-dir", data)
    assert done.returncode == 2
    assert "publish.domain is required" in done.stderr
    for fix in ("--domain DOMAIN", "publish.domain", "SIGNING_PROXY_PUBLISH_DOMAIN"):
        assert fix in done.stderr
    assert len(done.stderr.splitlines()) == 1
    given = run_cli("publish", "--out", str(tmp_path / "public"), "--data-dir", data, "--domain", "a.example")
    assert given.returncode == 0, given.stderr


def test_a_public_gateway_without_allowed_clients_names_the_key_and_the_variable(tmp_path: Path) -> None:
    """Refused while reading the configuration: nothing binds 0.0.0.0."""
    done = run_cli("gateway", "--upstream", "http://127.0.0.1:9000", "--listen", "0.0.0.0:8080",
                   "--host", "gw.example", "--data-dir", str(tmp_path))  # fmt: skip
    assert done.returncode == 2
    assert "set access.allow_clients" in done.stderr
    assert "SIGNING_PROXY_ALLOW_CLIENTS" in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_verify_origin_pins_the_public_half_of_a_private_key_file(tmp_path: Path) -> None:
    """The quick-start proxy sends an empty Signature-Agent: its own key file, pinned, verifies it."""
    key = SigningKey.generate()
    with (
        ProxyProcess(tmp_path, key=key) as proxy,
        verify_origin("--pinned-key", str(tmp_path / "agent-key.pem")) as port,
    ):
        resp = requests.get(f"http://127.0.0.1:{port}/hello", proxies={"http": proxy.url}, timeout=WAIT_S)
    assert resp.status_code == 200, resp.text
    assert resp.json()["verified"] is True
    assert resp.json()["labels"][0]["keyid"] == key.thumbprint


def test_verify_origin_names_the_flag_and_the_path_of_a_missing_key_file(tmp_path: Path) -> None:
    for flag in ("--pinned-key", "--pinned-broker-key"):
        done = run_cli("verify-origin", "--listen", "127.0.0.1:0", flag, str(tmp_path / "missing.jwk"))
        assert done.returncode == 2
        missing = tmp_path / "missing.jwk"
        assert (
            done.stderr
            == f"signing-proxy: {flag}: {missing}: cannot read key file: No such file or directory\n"
        )


def test_a_second_rotation_is_refused_with_the_reason_the_readme_quotes(tmp_path: Path) -> None:
    data = str(tmp_path)
    assert run_cli("keys", "rotate", "--data-dir", data).returncode == 0  # the store's first key
    assert run_cli("keys", "rotate", "--data-dir", data).returncode == 0  # published, waiting to sign
    again = run_cli("keys", "rotate", "--data-dir", data)
    assert again.returncode == 2
    assert "already waiting to sign" in again.stderr
    assert again.stderr.rstrip().endswith("(rotation-pending)")
