"""URLs the configuration took that the proxy cannot use are refused at start-up, naming the setting.

``signing.signature_agent`` with a port out of range, a query, a ``.`` or ``..`` segment or a bad
``%`` escape passed start-up and went out on every request, and our own verifier refused each one
``malformed-signature-agent``. ``publish.public_url: https://dir.example:99999`` passed
``config check`` (exit 0), then ``run`` died building the listener with a FieldError's traceback
(exit 1). Both are now checked as their readers parse them: a ConfigError, exit 2.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from signing_proxy.config import ConfigError, parse_config
from signing_proxy.core.errors import FieldError
from signing_proxy.core.signature_verify import parse_signature_agent
from signing_proxy.service.publish import PublishServer
from tests.harness import WAIT_S, run_cli

BAD_AGENTS = [
    ("https://agent.example:99999", "invalid port"),
    ("https://agent.example/dir?x=1", "no query"),
    ("https://agent.example/a/../b", "'..' segment"),
    ("https://agent.example/./b", "'..' segment"),
    ("https://agent.example/%zz", "'%' not followed by two hex digits"),
]
GOOD_AGENTS = [
    "https://agent.example",
    "https://agent.example/",
    "https://registry.example/agents/alice",
    "http://127.0.0.1:8080",
    "https://AGENT.example:443/%7ealice",
]
BAD_PUBLISHED = [
    ("https://dir.example:99999", "invalid port"),
    ("https://dir.example:abc", "invalid port"),
    ("https://dir..example", "missing or invalid host"),
    ("https://dir.example/%zz", "'%' not followed by two hex digits"),
]


@pytest.mark.parametrize(("agent", "said"), BAD_AGENTS)
def test_a_signature_agent_no_verifier_accepts_is_refused(agent: str, said: str) -> None:
    with pytest.raises(FieldError, match="malformed-signature-agent"):
        parse_signature_agent(f'"{agent}"')  # what would have gone out on every request
    with pytest.raises(ConfigError, match=r"^signing\.signature_agent: ") as caught:
        parse_config({"signing": {"signature_agent": agent}})
    assert said in str(caught.value)
    with pytest.raises(ConfigError, match=r"^signing\.signature_agent: "):  # --signature-agent
        parse_config({}).with_overrides(**{"signing.signature_agent": agent})


@pytest.mark.parametrize("agent", GOOD_AGENTS)
def test_a_signature_agent_a_verifier_accepts_is_taken(agent: str) -> None:
    assert parse_config({"signing": {"signature_agent": agent}}).signing.signature_agent == agent
    assert parse_signature_agent(f'"{agent}"')


@pytest.mark.parametrize("setting", ["public_url", "revocation_url"])
@pytest.mark.parametrize(("url", "said"), BAD_PUBLISHED)
def test_a_published_url_that_does_not_parse_is_refused(setting: str, url: str, said: str) -> None:
    with pytest.raises(ConfigError, match=rf"^publish\.{setting}: ") as caught:
        parse_config({"publish": {"domain": "dir.example", setting: url}})
    assert said in str(caught.value)
    for good in ("https://dir.example", "https://dir.example:8443/", "http://[::1]:8080/keys"):
        parse_config({"publish": {"domain": "dir.example", setting: good}})


def test_the_listener_names_the_setting_of_a_public_url_that_does_not_parse(tmp_path: Path) -> None:
    """A ``Config`` built around the checks: a ConfigError naming the setting, not a FieldError."""
    config = parse_config({"data_dir": str(tmp_path), "publish": {"domain": "dir.example"}})
    config = replace(config, publish=replace(config.publish, public_url="https://dir.example:99999"))
    with pytest.raises(ConfigError, match=r"^publish\.public_url: .*\(invalid port\)"):
        PublishServer(config, {})  # refused before any agent's keys are looked at


@pytest.mark.parametrize("command", ["check", "run"])
def test_config_check_and_run_exit_2_naming_the_public_url(tmp_path: Path, command: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        f"listen: 127.0.0.1:0\ndata_dir: {tmp_path / 'data'}\n"
        "publish:\n  listen: 127.0.0.1:0\n  domain: dir.example\n  public_url: https://dir.example:99999\n"
    )
    args = ("config", "check", str(config)) if command == "check" else ("run", "--config", str(config))
    done = run_cli(*args, timeout_s=WAIT_S)
    assert (done.returncode, "Traceback" in done.stderr) == (2, False), done.stderr
    assert "publish.public_url: an http(s) URL that parses" in done.stderr


def test_run_exits_2_naming_a_signature_agent_flag_no_verifier_accepts(tmp_path: Path) -> None:
    done = run_cli(
        "run",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        str(tmp_path / "data"),
        "--signature-agent",
        "https://agent.example:99999",
        timeout_s=WAIT_S,
    )
    assert (done.returncode, "Traceback" in done.stderr) == (2, False), done.stderr
    assert "signing.signature_agent: not a key directory's base URL" in done.stderr
