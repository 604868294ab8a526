"""A refusal says what fixes it (the flag, the configuration key, the variable), through real subprocesses."""

from __future__ import annotations

from pathlib import Path

from tests.harness import run_cli


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
