"""``--help`` says what a flag takes and what it defaults to, names the positionals, and lists the
``SIGNING_PROXY_*`` variables where the configuration is read."""

from __future__ import annotations

import argparse

import pytest

from signing_proxy.cli.main import build_parser
from signing_proxy.config import ENV_CONFIG_FILE, ENV_OVERRIDES
from tests.harness import run_cli


def _parser(*command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in command:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def _help(command: tuple[str, ...], argument: str) -> str:
    """The help text of ``argument`` (an option, or a positional's metavar) of ``command``."""
    for action in _parser(*command)._actions:
        if argument in action.option_strings or argument == action.metavar:
            return action.help or ""
    raise AssertionError(f"{' '.join(command)} has no {argument}")


@pytest.mark.parametrize("command", [("run",), ("gateway",), ("config", "check")])
def test_help_lists_every_environment_variable(command: tuple[str, ...]) -> None:
    done = run_cli(*command, "--help")
    assert done.returncode == 0
    for name in (ENV_CONFIG_FILE, *ENV_OVERRIDES):
        assert f"\n  {name} " in done.stdout, name  # one variable a line, as written
    assert "SIGNING_PROXY_ALLOW_CLIENTS        access.allow_clients (comma-separated)" in done.stdout


@pytest.mark.parametrize(
    ("command", "argument", "says"),
    [
        (("run",), "--key", "pkcs11:"),
        (("run",), "--key", "default: signing.key"),
        (("gateway",), "--data-dir", "default: data_dir"),
        (("verify-origin",), "--max-hops", "default: no cap"),
        (("delegate", "verify"), "--leeway", "default 0"),
        (("delegate", "inspect"), "--issuer-grace", "not_after"),
        (("delegate", "inspect"), "--issuer-grace", "default 0s"),
        (("keys", "show"), "PATH", "key file"),
        (("delegate", "extend"), "CHAIN|@FILE", "@-"),
        (("delegate", "inspect"), "CHAIN|@FILE", "@FILE"),
        (("delegate", "verify"), "CHAIN|@FILE", "compact JWSs"),
    ],
)
def test_help_says_what_an_argument_takes_and_defaults_to(
    command: tuple[str, ...], argument: str, says: str
) -> None:
    assert says in _help(command, argument)


def test_the_rotation_example_says_when_the_old_key_retires_and_expires() -> None:
    done = run_cli("--help")
    assert done.returncode == 0
    assert "retires after 48 h" not in done.stdout  # it retires at the activation
    assert "retires then and expires 48 h later" in done.stdout


def test_the_publish_example_names_the_domain_it_needs() -> None:
    """The embedded defaults have no publish.domain: the example as printed must run."""
    done = run_cli("--help")
    example = next(line for line in done.stdout.splitlines() if "signing-proxy publish" in line)
    assert "--domain " in example
