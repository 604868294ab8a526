"""The `signing-proxy` command through real subprocesses."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from signing_proxy import __version__
from signing_proxy.core.jwk import SigningKey, load_private_key
from tests.harness import run_cli, started_run


def test_version() -> None:
    done = run_cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"signing-proxy {__version__}"


@pytest.mark.parametrize(
    "command", [[], ["run"], ["config", "check"], ["keys", "generate"], ["keys", "show"]]
)
def test_every_command_has_help(command: list[str]) -> None:
    done = run_cli(*command, "--help")
    assert done.returncode == 0
    assert "usage: signing-proxy" in done.stdout
    assert len(done.stdout.splitlines()) > 3


@pytest.mark.parametrize("fmt", ["pem", "jwk"])
def test_keys_generate_writes_an_owner_only_key_and_prints_its_thumbprint(tmp_path: Path, fmt: str) -> None:
    out = tmp_path / f"key.{fmt}"
    done = run_cli("keys", "generate", "--out", str(out), "--format", fmt)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    key = load_private_key(out.read_bytes())
    assert f"thumbprint: {key.thumbprint}" in done.stdout
    assert json.loads(done.stdout.split("public jwk: ", 1)[1]) == key.public.jwk()
    assert key.to_jwk()["d"] not in done.stdout
    again = run_cli("keys", "generate", "--out", str(out))
    assert again.returncode == 2
    assert "exists" in again.stderr


@pytest.mark.parametrize("out", [".", "", "/", "..", "sub/..", "{tmp}"])
@pytest.mark.parametrize("force", [True, False])
def test_keys_generate_refuses_a_directory_even_with_force(tmp_path: Path, out: str, force: bool) -> None:
    """``--out . --force`` (and "", /) died with "ValueError: PosixPath('.') has an empty name"."""
    out = out.format(tmp=tmp_path)
    args = ["keys", "generate", "--out", out, *(["--force"] if force else [])]
    done = subprocess.run(
        [sys.executable, "-m", "signing_proxy", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=tmp_path,  # relative --out values name this folder
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"signing-proxy: --out {out!r} is a directory; name the key file, e.g. ")
    assert done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary left


def test_keys_show_prints_thumbprint_and_public_jwk(tmp_path: Path) -> None:
    key = SigningKey.generate()
    path = tmp_path / "k.pem"
    path.write_bytes(key.to_pem())
    path.chmod(0o600)
    done = run_cli("keys", "show", str(path))
    assert done.returncode == 0
    assert key.thumbprint in done.stdout


@pytest.mark.parametrize(
    ("content", "mode", "message"),
    [
        (SigningKey.generate().to_pem(), 0o644, "must be readable by its owner only"),
        (SigningKey.generate().to_pem(), 0o640, "must be readable by its owner only"),
        (b"-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n", 0o600, "not a usable Ed25519"),
        (b"{}", 0o600, "not a usable Ed25519"),
        (None, 0o600, "does not exist"),
    ],
)
def test_run_refuses_a_bad_key_file(tmp_path: Path, content: bytes | None, mode: int, message: str) -> None:
    path = tmp_path / "key.pem"
    if content is not None:
        path.write_bytes(content)
        path.chmod(mode)
    done = run_cli("run", "--listen", "127.0.0.1:0", "--key", str(path), "--data-dir", str(tmp_path / "d"))
    assert done.returncode == 2
    assert message in done.stderr
    assert str(path) in done.stderr


def test_run_refuses_a_bad_config_with_the_key_path(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("limits:\n  max_body_bytes: -5\n")
    done = run_cli("run", "--config", str(config))
    assert done.returncode == 2
    assert "limits.max_body_bytes: must be a positive integer" in done.stderr


def test_config_check_prints_the_effective_config(tmp_path: Path) -> None:
    # sidecar.yaml names the key a Secret mounts (/run/secrets/...); config check reads it as run does
    key = tmp_path / "agent-key.pem"
    key.write_bytes(SigningKey.generate().to_pem())
    key.chmod(0o600)
    missing = run_cli("config", "check", "config/sidecar.yaml")
    assert missing.returncode == 2
    assert "signing.key: /run/secrets/signing-proxy/agent-key.pem" in missing.stderr
    done = run_cli("config", "check", "config/sidecar.yaml", env={"SIGNING_PROXY_KEY": str(key)})
    assert done.returncode == 0, done.stderr
    assert "OK" in done.stdout
    assert "/exchange/" in done.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("lisen: 1\n")
    done = run_cli("config", "check", str(bad))
    assert done.returncode == 2
    assert "lisen: unknown key" in done.stderr


def test_config_check_reads_the_token_files_run_reads(tmp_path: Path) -> None:
    """``config check`` said OK for a configuration ``run`` then refused: a bearer file missing."""
    config = tmp_path / "c.yaml"
    config.write_text(f"credentials:\n  - hosts: [a.example]\n    bearer_file: {tmp_path / 'missing'}\n")
    done = run_cli("config", "check", str(config))
    assert done.returncode == 2
    assert done.stderr.startswith("signing-proxy: configuration error: credentials[0].bearer_file:")
    assert "OK" not in done.stdout


def test_config_check_reads_the_delegation_token_file_run_reads(tmp_path: Path) -> None:
    """``config check`` said OK for a requester.delegation.token_file that is missing; run exited 2."""
    missing = tmp_path / "missing.jwt"
    config = tmp_path / "c.yaml"
    config.write_text(
        f"data_dir: {tmp_path / 'data'}\nlisten: 127.0.0.1:0\nrequester:\n  id: agent-7\n"
        "  domain: agent.example\n  type: REQUESTER_TYPE_AGENT\n  exchanges: [https://exchange.example/v1]\n"
        f"  delegation:\n    token_file: {missing}\n    principal_domain: corp.example\n"
        "    principal_id: alice@corp.example\n"
    )
    message = f"requester.delegation.token_file: cannot read {missing}: No such file or directory\n"
    run = run_cli("run", "--config", str(config))
    assert run.returncode == 2
    assert run.stderr.endswith(f"\nsigning-proxy: {message}")  # after the first run's key is made
    done = run_cli("config", "check", str(config))
    assert done.returncode == 2
    assert done.stderr == f"signing-proxy: configuration error: {message}"
    assert "OK" not in done.stdout
    missing.write_text("not-a-chain\n")  # read now, and checked as run checks it before its keys
    done = run_cli("config", "check", str(config))
    assert done.returncode == 2
    assert f"requester.delegation.token_file {missing}: DENIAL_REASON_DELEGATION_INVALID:" in done.stderr


def test_config_check_names_the_file_signing_proxy_config_named(tmp_path: Path) -> None:
    """It checked the file the variable names and said it had checked the embedded defaults."""
    config = tmp_path / "from-env.yaml"
    config.write_text("listen: 127.0.0.1:8181\n")
    done = run_cli("config", "check", env={"SIGNING_PROXY_CONFIG": str(config)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"# {config}: OK"
    assert "127.0.0.1:8181" in done.stdout


def test_first_run_generates_an_owner_only_key(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with started_run("--listen", "127.0.0.1:0", "--data-dir", str(data)) as lines:
        (key_path,) = (data / "keys" / "default").glob("*.pem")  # the key store, named by thumbprint
        key = load_private_key(key_path.read_bytes())
        assert key_path.name == f"{key.thumbprint}.pem"
        assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
        assert any("generated a new signing key" in ln and key.thumbprint in ln for ln in lines)
        assert f"keyid={key.thumbprint}" in lines[-1]


@pytest.mark.parametrize("group", ["keys", "config", "ca", "delegate"])
def test_a_group_without_its_action_shows_the_group_help(group: str) -> None:
    done = run_cli(group)
    assert done.returncode == 2
    assert done.stdout.startswith(f"usage: signing-proxy {group} ")


def test_run_refuses_a_worker_count_below_one(tmp_path: Path) -> None:
    done = run_cli("run", "--workers", "0", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path))
    assert done.returncode == 2
    assert "--workers: must be at least 1" in done.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--skew", "-30"], "--skew: seconds from 0 to 300, got -30"),
        (["--skew", "301"], "--skew: seconds from 0 to 300, got 301"),
        (["--max-hops", "0"], "--max-hops: signatures from 1 to 16 (no longer stack), got 0"),
        (["--max-hops", "17"], "--max-hops: signatures from 1 to 16 (no longer stack), got 17"),
        (["--broker-directory", "https://u:s3cret@broker.example"], "--broker-directory: an http(s) URL"),
        (["--broker-directory", "ftp://u:s3cret@broker.example"], "--broker-directory: must be an absolute"),
        (["--external-origin", "exchange.example"], "--external-origin: must be an absolute http(s) URL"),
        (["--external-origin", "https://u:s3cret@exchange.example"], "--external-origin: an http(s) URL"),
        (["--external-origin", "https://exchange.example:abc"], "--external-origin: an http(s) origin"),
        (
            ["--external-origin", "https://exchange.example/v1"],
            "--external-origin: an origin, without a path",
        ),
    ],
)
def test_verify_origin_refuses_the_bounds_its_configuration_refuses(flags: list[str], message: str) -> None:
    """A negative skew refused every signature as not yet valid, and --max-hops 0 every stack."""
    done = run_cli("verify-origin", "--listen", "127.0.0.1:0", *flags)
    assert done.returncode == 2
    assert message in done.stderr
    assert "s3cret" not in done.stderr
