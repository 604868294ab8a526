"""An ``upstream.ca_file`` or ``upstream.pin_ca_files`` entry that cannot be used is configuration.

The pool builds its TLS contexts from these files at start-up; a missing, unreadable or non-PEM file
raised a bare ``FileNotFoundError`` (naming no file) or ``ssl.SSLError`` out of ``run``: a traceback
and exit status 1. It is a ``ConfigError`` naming the key and the path, which ``run`` reports in one
line with exit status 2, as it does every refused configuration.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from signing_proxy.config import ConfigError, UpstreamConfig
from signing_proxy.net.dial import MAX_CA_FILE_BYTES
from signing_proxy.net.upstream import UpstreamPool
from signing_proxy.storage.ca import CertificateAuthority
from tests.harness import WAIT_S


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    good = tmp_path / "ca.pem"
    good.write_bytes(CertificateAuthority.generate().cert_pem())
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    fifo = tmp_path / "fifo.pem"
    os.mkfifo(fifo)  # OpenSSL read it until a writer ended it: start-up hung
    large = tmp_path / "large.pem"
    large.write_bytes(b"#" * (MAX_CA_FILE_BYTES + 1))
    return {
        "good": str(good),
        "missing": str(tmp_path / "missing.pem"),
        "junk": str(junk),
        "dir": str(tmp_path),
        "fifo": str(fifo),
        "large": str(large),
    }


def pool(config: UpstreamConfig) -> UpstreamPool:
    return UpstreamPool(config, connect_timeout_s=1, read_timeout_s=1)


@pytest.mark.parametrize(
    ("which", "said"),
    [
        ("missing", "no such file or directory"),
        ("junk", "no PEM certificate could be read"),
        ("dir", "not a regular file"),
        ("fifo", "not a regular file"),
        ("large", f"larger than {MAX_CA_FILE_BYTES} bytes"),
    ],
)
def test_a_pin_file_that_cannot_be_used_is_a_config_error_naming_key_and_path(
    files: dict[str, str], which: str, said: str
) -> None:
    path = files[which]
    config = UpstreamConfig(pin_ca_files={"good.example": files["good"], "api.example": path})
    with pytest.raises(ConfigError) as refused:
        pool(config)
    assert str(refused.value).startswith(f"upstream.pin_ca_files['api.example']: {path}: ")
    assert said in str(refused.value)


@pytest.mark.parametrize("which", ["missing", "junk", "fifo"])
def test_a_ca_file_that_cannot_be_used_is_a_config_error_naming_key_and_path(
    files: dict[str, str], which: str
) -> None:
    with pytest.raises(ConfigError, match=rf"^upstream\.ca_file: {files[which]}: "):
        pool(UpstreamConfig(ca_file=files[which]))


def test_usable_files_still_make_a_pool(files: dict[str, str]) -> None:
    made = pool(UpstreamConfig(ca_file=files["good"], pin_ca_files={"api.example": files["good"]}))
    assert made._tls_for("API.example.") is not made._tls_for("other.example")


@pytest.mark.parametrize(
    ("field", "which", "key"),
    [
        ("pin_ca_files", "missing", "upstream.pin_ca_files['api.example']"),
        ("ca_file", "junk", "upstream.ca_file"),
        ("ca_file", "fifo", "upstream.ca_file"),
    ],
)
@pytest.mark.parametrize("command", [["run", "--config"], ["config", "check"]], ids=["run", "config-check"])
def test_run_refuses_the_file_in_one_line_with_exit_status_2(
    tmp_path: Path, files: dict[str, str], *, field: str, which: str, key: str, command: list[str]
) -> None:
    """``run`` stops at start, and ``config check`` (which reads the files as ``run`` does) refuses."""
    path = files[which]
    upstream = {"pin_ca_files": {"api.example": path}} if field == "pin_ca_files" else {"ca_file": path}
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": "127.0.0.1:0",
                "data_dir": str(tmp_path / "data"),
                "intercept": {"enabled": False},
                "upstream": upstream,
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNING_PROXY_")}
    done = subprocess.run(
        [sys.executable, "-m", "signing_proxy", *command, str(config)],
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.splitlines()[-1]  # run logs its start before it (a key generated)
    assert last.startswith("signing-proxy: ")  # "configuration error: " follows for config check
    assert f"{key}: {path}: " in last
