"""``signing-proxy env`` with proxy authentication on: the proxy URL is double-quoted so that the
shell expands ``${SIGNING_PROXY_USER}`` and ``${SIGNING_PROXY_PASSWORD}``, and the listen address
was put inside those quotes as it was written. A listen host is text from a file, a variable or
``--listen``: ``x$(cmd)y:8080`` ran ``cmd`` on ``eval``. Such a host is refused when the
configuration is read now (``parse_host_port``); beside that, only the two variables are expanded,
the address quoted apart, whatever it holds (checked with the host check switched off)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from signing_proxy.cli.main import main
from signing_proxy.config import checks


def hostile_hosts(marker: Path) -> list[str]:
    return [
        f"x$(touch {marker})y",
        f"x`touch {marker}`y",
        f'x"$(touch {marker})"y',
        f"x';touch {marker};'y",
        f"x\ntouch {marker}\ny",
    ]


def env_lines(tmp_path: Path, listen: str, capsys: pytest.CaptureFixture[str]) -> str:
    users = tmp_path / "proxy-users"
    users.write_text("agent:hunter2\n")
    users.chmod(0o600)
    config = tmp_path / "config.yaml"
    settings = {
        "data_dir": str(tmp_path / "data"),
        "listen": listen,
        "access": {"allow_clients": ["127.0.0.0/8"], "proxy_auth_file": str(users)},
        "intercept": {"enabled": False},
    }
    config.write_text(yaml.safe_dump(settings))
    assert main(["env", "--config", str(config)]) == 0
    out, _ = capsys.readouterr()
    assert "hunter2" not in out
    return out


@pytest.mark.parametrize("index", range(5))
def test_a_listen_host_that_is_no_host_is_refused(
    index: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    host = hostile_hosts(tmp_path / "ran")[index]
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "listen": f"{host}:8080"}))
    assert main(["env", "--config", str(config)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "listen: HOST must be a host name or an IP address" in err


@pytest.mark.parametrize("shell", ["bash", "sh"])
@pytest.mark.parametrize("index", range(5))
def test_evaluating_the_env_lines_runs_nothing_a_listen_host_holds(
    shell: str,
    index: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(checks, "_listen_host", lambda *_args, **_kwargs: True)  # the quoting alone
    program = shutil.which(shell)
    if program is None:
        pytest.skip(f"no {shell} to evaluate the output with")
    marker = tmp_path / "ran"
    host = hostile_hosts(marker)[index]
    lines = env_lines(tmp_path, f"{host}:8080", capsys)
    evaluated = subprocess.run(
        [program, "-c", 'eval "$LINES"; printf "%s" "$HTTPS_PROXY"'],
        env={
            "LINES": lines,
            "SIGNING_PROXY_USER": "me",
            "SIGNING_PROXY_PASSWORD": "p%40ss",
            "PATH": "/usr/bin:/bin",
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert not marker.exists(), lines
    assert evaluated.returncode == 0, evaluated.stderr
    assert evaluated.stdout == f"http://me:p%40ss@{host}:8080"  # the variables expanded, the host as it is


def test_the_user_and_password_are_still_expanded_by_the_shell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = env_lines(tmp_path, "[::1]:9000", capsys)
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash to evaluate the output with")
    evaluated = subprocess.run(
        [bash, "-c", 'eval "$LINES"; printf "%s\\n" "$HTTP_PROXY" "$https_proxy"'],
        env={"LINES": lines, "SIGNING_PROXY_USER": "a b", "SIGNING_PROXY_PASSWORD": "$(x)", "PATH": "/bin"},
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    assert evaluated.stdout.splitlines() == ["http://a b:$(x)@[::1]:9000"] * 2
