"""The ``intercept`` configuration section and the trust bootstrap commands ``ca export`` and ``env``."""

from __future__ import annotations

import shlex
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from signing_proxy.cli.main import main
from signing_proxy.config import Config, ConfigError, InterceptConfig, parse_config
from signing_proxy.storage.ca import CertificateAuthority

SYSTEM_BUNDLE_MARKER = b"-----BEGIN CERTIFICATE-----"


@pytest.fixture(autouse=True)
def _no_inherited_trust(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def write_config(tmp_path: Path, raw: dict[str, Any]) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), **raw}))
    return path


def exports(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            out[name] = shlex.split(value)[0]  # as a shell reads it (the placeholders stay literal)
    return out


# --- configuration ------------------------------------------------------------------------------


def test_intercept_defaults() -> None:
    intercept = Config().intercept
    assert intercept == InterceptConfig()
    assert intercept.enabled is True
    assert intercept.allowed_ports == (443, 80)
    assert intercept.tunnel == ()
    assert intercept.ca_cert is None
    assert intercept.ca_key is None
    assert intercept.ca_validity_days == 365
    assert intercept.leaf_cache_size == 1024
    assert intercept.handshake_timeout_s == 10.0
    assert intercept.no_proxy == ()


def test_intercept_values_are_read() -> None:
    config = parse_config(
        {
            "intercept": {
                "allowed_ports": [8443],
                "tunnel": ["*.bank.example", "pinned.example"],
                "ca_cert": "/etc/ca.pem",
                "ca_key": "/etc/ca-key.pem",
                "no_proxy": ["localhost", ".internal.example", "10.0.0.0/8"],
            }
        }
    )
    assert config.intercept.allowed_ports == (8443,)
    assert config.intercept.tunnel == ("*.bank.example", "pinned.example")
    assert config.intercept.no_proxy == ("localhost", ".internal.example", "10.0.0.0/8")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"allowed_ports": [0]}, "intercept.allowed_ports[0]: must be a port number 1-65535"),
        ({"allowed_ports": [443, 65536]}, "intercept.allowed_ports[1]: must be a port number"),
        ({"allowed_ports": ["443"]}, "intercept.allowed_ports[0]: must be an integer"),
        ({"allowed_ports": [True]}, "intercept.allowed_ports[0]: must be an integer"),
        ({"allowed_ports": 443}, "intercept.allowed_ports: must be a list"),
        ({"tunnel": ["a.*.example"]}, "intercept.tunnel[0]: host patterns are"),
        ({"tunnel": ["https://x.example"]}, "intercept.tunnel[0]: host patterns are"),
        ({"ca_cert": "/etc/ca.pem"}, "intercept: set both ca_cert and ca_key"),
        ({"ca_key": "/etc/ca-key.pem"}, "intercept: set both ca_cert and ca_key"),
        ({"ca_validity_days": 0}, "intercept.ca_validity_days: must be a positive integer"),
        ({"ca_validity_days": 4000}, "intercept.ca_validity_days: must be at most 3650"),
        ({"leaf_cache_size": 0}, "intercept.leaf_cache_size: must be a positive integer"),
        ({"handshake_timeout_s": 0}, "intercept.handshake_timeout_s: must be a positive"),
        ({"no_proxy": ["a.example,b.example"]}, "intercept.no_proxy[0]: must be one host"),
        ({"no_proxy": [""]}, "intercept.no_proxy[0]: must be one host"),
        ({"enabled": "yes"}, "intercept.enabled: must be true or false"),
        ({"intercept_all": True}, "intercept.intercept_all: unknown key"),
    ],
)
def test_intercept_mistakes_name_their_key_path(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"intercept": raw})
    assert str(refused.value).startswith(message), str(refused.value)


# --- signing-proxy ca export ----------------------------------------------------------------------


def test_ca_export_creates_the_ca_once_and_prints_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    status, out, _ = run_cli(capsys, "ca", "export", "--data-dir", str(data))
    assert status == 0
    assert out.encode() == (data / "ca.pem").read_bytes()
    assert stat.S_IMODE((data / "ca-key.pem").stat().st_mode) == 0o600
    status, again, _ = run_cli(capsys, "ca", "export", "--data-dir", str(data))
    assert status == 0
    assert again == out  # loaded, never replaced
    target = tmp_path / "exported.pem"
    status, _, err = run_cli(capsys, "ca", "export", "--data-dir", str(data), "--out", str(target))
    assert status == 0
    assert target.read_text() == out
    assert "sha256=" in err


def test_ca_export_of_an_operator_ca(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca = CertificateAuthority.generate(common_name="operator CA")
    (tmp_path / "op.pem").write_bytes(ca.cert_pem())
    key = tmp_path / "op-key.pem"
    key.touch(mode=0o600)
    key.write_bytes(ca._ca_key_pem())
    config = write_config(tmp_path, {"intercept": {"ca_cert": str(tmp_path / "op.pem"), "ca_key": str(key)}})
    status, out, _ = run_cli(capsys, "ca", "export", "--config", str(config))
    assert status == 0
    assert out.encode() == ca.cert_pem()
    assert not (tmp_path / "data" / "ca.pem").exists()


def test_ca_export_refuses_a_key_others_can_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    assert run_cli(capsys, "ca", "export", "--data-dir", str(data))[0] == 0
    (data / "ca-key.pem").chmod(0o640)
    status, out, err = run_cli(capsys, "ca", "export", "--data-dir", str(data))
    assert status == 2
    assert out == ""
    assert "interception CA" in err
    assert "chmod 600" in err
    assert "PRIVATE KEY" not in err


# --- signing-proxy env ----------------------------------------------------------------------------


def test_env_prints_proxy_and_trust_variables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    status, out, _ = run_cli(capsys, "env", "--data-dir", str(data), "--listen", "127.0.0.1:8080")
    assert status == 0
    env = exports(out)
    assert list(env) == [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "NODE_USE_ENV_PROXY",
    ]
    assert {env[n] for n in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")} == {
        "http://127.0.0.1:8080"
    }
    bundle = data / "ca-bundle.pem"
    assert {env[n] for n in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")} == {str(bundle)}
    assert env["NODE_EXTRA_CA_CERTS"] == str(data / "ca.pem")
    assert env["NODE_USE_ENV_PROXY"] == "1"
    ours = (data / "ca.pem").read_bytes()
    content = bundle.read_bytes()
    assert content.endswith(ours)
    assert content.count(SYSTEM_BUNDLE_MARKER) > 1
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o644
    assert run_cli(capsys, "env", "--data-dir", str(data), "--listen", "127.0.0.1:8080")[0] == 0
    assert bundle.read_bytes() == content  # rewriting is idempotent: our CA appears once


def test_env_bundle_path_can_be_chosen(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = tmp_path / "elsewhere" / "bundle.pem"
    bundle.parent.mkdir()
    status, out, _ = run_cli(
        capsys,
        "env",
        "--data-dir",
        str(tmp_path / "data"),
        "--listen",
        "127.0.0.1:8080",
        "--bundle",
        str(bundle),
    )
    assert status == 0
    assert exports(out)["SSL_CERT_FILE"] == str(bundle)
    assert bundle.read_bytes().endswith((tmp_path / "data" / "ca.pem").read_bytes())


@pytest.mark.parametrize(
    ("listen", "url"),
    [
        ("127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("localhost:8080", "http://localhost:8080"),
        ("[::1]:8080", "http://[::1]:8080"),
        ("0.0.0.0:9000", "http://127.0.0.1:9000"),
        ("[::]:9000", "http://[::1]:9000"),
    ],
)
def test_env_proxy_url_follows_the_listen_address(
    listen: str, url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, {"listen": listen, "access": {"allow_clients": ["10.0.0.0/8"]}})
    status, out, _ = run_cli(capsys, "env", "--config", str(config))
    assert status == 0
    assert exports(out)["HTTPS_PROXY"] == url


def test_env_with_proxy_auth_prints_placeholders_never_the_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    users = tmp_path / "proxy-users"
    users.write_text("agent-name:hunter2-secret\n")
    users.chmod(0o600)
    config = write_config(
        tmp_path,
        {
            "listen": "127.0.0.1:9000",
            "access": {"proxy_auth_file": str(users)},
            "intercept": {"no_proxy": ["localhost", ".internal.example"]},
        },
    )
    status, out, _ = run_cli(capsys, "env", "--config", str(config))
    assert status == 0
    assert "hunter2" not in out
    assert "agent-name" not in out
    assert "SIGNING_PROXY_USER" in out.splitlines()[0]  # the comment says what to set
    env = exports(out)
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,.internal.example"
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash to evaluate the output with")
    shell = subprocess.run(
        [bash, "-c", 'eval "$LINES"; printf "%s\\n" "$HTTPS_PROXY" "$no_proxy"'],
        env={
            "LINES": out,
            "SIGNING_PROXY_USER": "me",
            "SIGNING_PROXY_PASSWORD": "p%40ss",
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    assert shell.stdout.splitlines() == ["http://me:p%40ss@127.0.0.1:9000", "localhost,.internal.example"]


def test_env_output_survives_paths_with_spaces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data dir"
    status, out, _ = run_cli(capsys, "env", "--data-dir", str(data), "--listen", "127.0.0.1:8080")
    assert status == 0
    line = next(line for line in out.splitlines() if line.startswith("export SSL_CERT_FILE="))
    assert shlex.split(line.partition("=")[2]) == [str(data / "ca-bundle.pem")]


def test_env_needs_a_fixed_port(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(capsys, "env", "--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:0")
    assert status == 2
    assert out == ""
    assert "--listen" in err


def test_env_with_interception_off_prints_no_ca_variables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, {"intercept": {"enabled": False}})
    status, out, _ = run_cli(capsys, "env", "--config", str(config))
    assert status == 0
    env = exports(out)
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:8080"
    assert not {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"} & set(env)
    assert not (tmp_path / "data" / "ca.pem").exists()


@pytest.mark.parametrize("command", [["ca", "export"], ["env"]])
def test_new_commands_have_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    assert "usage: signing-proxy" in capsys.readouterr().out
