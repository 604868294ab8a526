"""``signing-proxy config check``: validate a configuration and print the effective one, secrets redacted.

The credentials' token files and variables are read too (never shown), as ``run`` reads them at
start: a check that passed a file ``run`` then refused was no check. So is the delegation token file
(``requester.delegation.token_file``), and its chain checked as far as no key is needed (expiry,
linkage, claims); whether it is bound to the proxy's signing key is left to ``run`` and
``delegate verify``."""

from __future__ import annotations

import argparse
import time
from typing import Any

import yaml

from ..config import redacted
from ..errors import ConfigError
from ..net.dial import upstream_tls_contexts
from ..proxy.credentials import BearerStore
from ..proxy.delegation_file import check_mirrors, read_token_file
from .common import HelpFormatter, config_from, config_path, config_refused, environment_epilog

__all__ = ["add_parsers", "cmd_config_check"]


def cmd_config_check(args: argparse.Namespace) -> int:
    config = config_from(args)
    try:
        BearerStore(config.credentials)  # the tokens' files and variables, read as ``run`` reads them
        if config.requester is not None and config.requester.delegation is not None:
            delegation, now = config.requester.delegation, time.time()
            path, _chain, links, _ = read_token_file(delegation, now)  # as ``run`` reads it at start
            check_mirrors(delegation, config.requester.scopes, path, links, now)  # all but the holder
        upstream_tls_contexts(config.upstream)  # upstream.ca_file and pin_ca_files, as ``run`` loads them
    except ConfigError as exc:
        raise config_refused(exc) from None
    source = config_path(args) or "embedded default configuration"
    print(f"# {source}: OK")
    print(yaml.safe_dump(redacted(config), sort_keys=False), end="")
    return 0


def add_parsers(sub: Any) -> None:
    """Add ``config check`` to the top-level subcommands."""
    cfg = sub.add_parser("config", help="configuration tools").add_subparsers(
        dest="config_command", metavar="ACTION"
    )
    check = cfg.add_parser(
        "check",
        help="validate a config file and print the effective configuration",
        description="Validate FILE (and read the bearer-token files and variables, the delegation "
        "token file and the upstream CA files it names, as run does) and print the effective "
        "configuration, secrets redacted.",
        epilog=environment_epilog(),
        formatter_class=HelpFormatter,
    )
    check.add_argument("config", metavar="FILE", nargs="?", help="YAML file (default: the embedded defaults)")
    check.set_defaults(func=cmd_config_check)
