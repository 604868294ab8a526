"""``config check`` said OK (exit 0) for configurations ``run`` then refused with exit status 2:
an ``access.proxy_auth_file`` or ``signing.key`` missing or readable by others, an operator CA
(``intercept.ca_cert``/``ca_key``) missing, a ``gateway.upstream`` with a path. It reads them now
with the loaders ``run`` uses, says what ``run`` says, shows no secret, and creates nothing (no key
store, no CA of ours: ``run`` makes those on first use)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from signing_proxy.cli.main import main
from signing_proxy.core.jwk import SigningKey
from signing_proxy.storage.ca import CertificateAuthority
from tests.harness import run_cli

PASSWORD = "hunter2-proxy-secret"
KEY = SigningKey.generate()


def private_file(path: Path, data: bytes, mode: int = 0o600) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    path.chmod(mode)
    return str(path)


def proxy_users(tmp: Path, mode: int = 0o600) -> str:
    return private_file(tmp / "proxy-users", f"agent:{PASSWORD}\n".encode(), mode)


def signing_key(tmp: Path, mode: int = 0o600) -> str:
    return private_file(tmp / "agent-key.pem", KEY.to_pem(), mode)


def operator_ca(tmp: Path) -> dict[str, str]:
    ca = CertificateAuthority.generate(common_name="operator CA")
    (tmp / "op.pem").write_bytes(ca.cert_pem())
    return {"ca_cert": str(tmp / "op.pem"), "ca_key": private_file(tmp / "op-key.pem", ca._ca_key_pem())}


def write_config(tmp: Path, settings: dict[str, Any]) -> Path:
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), "listen": "127.0.0.1:0", **settings}))
    return path


REFUSED: dict[str, tuple[Callable[[Path], dict[str, Any]], str]] = {
    "proxy_auth_file_0644": (
        lambda tmp: {"access": {"proxy_auth_file": proxy_users(tmp, 0o644)}},
        "access.proxy_auth_file: {tmp}/proxy-users mode is 0644",
    ),
    "proxy_auth_file_missing": (
        lambda tmp: {"access": {"proxy_auth_file": str(tmp / "nope")}},
        "access.proxy_auth_file: {tmp}/nope does not exist",
    ),
    "signing_key_0644": (
        lambda tmp: {"signing": {"key": signing_key(tmp, 0o644)}},
        "signing.key: {tmp}/agent-key.pem: key file mode is 0644",
    ),
    "signing_key_missing": (
        lambda tmp: {"signing": {"key": str(tmp / "nope.pem")}},
        "signing.key: {tmp}/nope.pem: key file does not exist",
    ),
    "operator_ca_key_missing": (
        lambda tmp: {"intercept": {"ca_cert": str(tmp / "nope.pem"), "ca_key": str(tmp / "nope-key.pem")}},
        "interception CA: CA key file {tmp}/nope-key.pem does not exist",
    ),
    "gateway_upstream_with_a_path": (
        lambda tmp: {"mode": "gateway", "gateway": {"upstream": "http://127.0.0.1:9/api/"}},
        "gateway.upstream: an origin only (http://host:port), without a path",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_config_check_refuses_what_run_refuses(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings, said = REFUSED[case]
    config = write_config(tmp_path, settings(tmp_path))
    said = said.format(tmp=tmp_path)
    assert main(["config", "check", str(config)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("signing-proxy: ")
    assert said in err
    assert PASSWORD not in err
    assert "PRIVATE KEY" not in err
    assert not (tmp_path / "data").exists()  # nothing created: no key store, no CA of ours


@pytest.mark.parametrize(
    "case", ["proxy_auth_file_0644", "signing_key_missing", "gateway_upstream_with_a_path"]
)
def test_run_refuses_them_with_the_same_words(case: str, tmp_path: Path) -> None:
    """The parity the check stands for: ``run`` stops at start with the same line (exit 2)."""
    settings, said = REFUSED[case]
    config = write_config(tmp_path, settings(tmp_path))
    done = run_cli("run", "--config", str(config), timeout_s=60)
    assert done.returncode == 2, done.stderr
    assert said.format(tmp=tmp_path) in done.stderr.splitlines()[-1]


def test_config_check_passes_what_run_takes_and_shows_no_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(
        tmp_path,
        {
            "access": {"proxy_auth_file": proxy_users(tmp_path)},
            "signing": {"key": signing_key(tmp_path)},
            "intercept": operator_ca(tmp_path),
        },
    )
    assert main(["config", "check", str(config)]) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    assert out.startswith(f"# {config}: OK\n")
    assert PASSWORD not in out + err
    assert "PRIVATE KEY" not in out + err
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    "settings",
    [
        {},  # the key store and our CA: made by run on first use, never by a check
        {"signing": {"key": "pkcs11:token=t;object=k"}},  # a token key: the token is not opened
        {"mode": "gateway", "gateway": {"upstream": "http://127.0.0.1:9/"}, "signing": {"key": "/nope.pem"}},
        {"intercept": {"enabled": False, "ca_cert": "/nope.pem", "ca_key": "/nope-key.pem"}},
    ],
    ids=["defaults", "pkcs11-key", "gateway-reads-no-key", "interception-off"],
)
def test_config_check_reads_only_what_run_reads_and_creates_nothing(
    settings: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, settings)
    assert main(["config", "check", str(config)]) == 0, capsys.readouterr().err
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("upstream", ["http://127.0.0.1:99999/", "http://[::1"])
@pytest.mark.parametrize("command", ["check", "run"])
def test_a_gateway_upstream_that_does_not_parse_is_refused_naming_it(
    tmp_path: Path, upstream: str, command: str
) -> None:
    """``config check`` died with a traceback (FieldError: malformed-target), ``run`` said only
    ``malformed-target: invalid port``: both name the setting now, exit status 2."""
    config = tmp_path / "gw.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "mode": "gateway",
                "listen": "127.0.0.1:0",
                "data_dir": str(tmp_path),
                "gateway": {"upstream": upstream},
            }
        )
    )
    args = ("config", "check", str(config)) if command == "check" else ("run", "--config", str(config))
    done = run_cli(*args)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "gateway.upstream: " in done.stderr.splitlines()[-1]
