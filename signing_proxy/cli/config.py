"""``signing-proxy config check``: validate a configuration and print the effective one, secrets redacted.

The credentials' token files and variables are read too (never shown), as ``run`` reads them at
start: a check that passed a file ``run`` then refused was no check. So is the delegation token file
(``requester.delegation.token_file``), and its chain checked as far as no key is needed (expiry,
linkage, claims); whether it is bound to the proxy's signing key is left to ``run`` and
``delegate verify``. So are ``access.proxy_auth_file``, a ``signing.key`` file, the operator's
interception CA (``intercept.ca_cert``/``ca_key``) and a gateway's ``gateway.upstream``, each by the
loader ``run`` uses. Nothing is created: not the key store, not our own CA (``run`` makes both on
first use), and a ``pkcs11:`` key's token is not opened."""

from __future__ import annotations

import argparse
import time
from typing import Any

import yaml

from ..config import Config, redacted
from ..core.pkcs11_uri import is_pkcs11_uri
from ..errors import ConfigError
from ..net.dial import upstream_tls_contexts
from ..proxy.access import AccessControl
from ..proxy.connect import load_interception_ca
from ..proxy.credentials import BearerStore
from ..proxy.delegation_file import check_mirrors, read_token_file
from ..proxy.gateway import gateway_upstream
from ..service.keys import file_key_provider
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
        _check_what_run_reads(config)
    except ConfigError as exc:
        raise config_refused(exc) from None
    source = config_path(args) or "embedded default configuration"
    print(f"# {source}: OK")
    print(yaml.safe_dump(redacted(config), sort_keys=False), end="")
    return 0


def _check_what_run_reads(config: Config) -> None:
    """The files and values ``run`` refuses at start (exit 2), through the loaders it uses; a check
    that passed them was no check. ``ConfigError``; ``CAError`` for the operator's CA. Nothing is
    created, and no secret is shown: the loaders' messages name the file, never what it holds."""
    AccessControl(config.access)  # access.proxy_auth_file: there, owner-only, user:password lines
    if config.mode == "gateway":  # signs nothing and intercepts nothing: neither key nor CA is read
        gateway_upstream(config.gateway)  # an origin only, as the gateway's one route takes it
        return
    if config.signing.key and not is_pkcs11_uri(config.signing.key):
        file_key_provider(config.signing.key)  # there, owner-only, an Ed25519 key
    if config.intercept.enabled and config.intercept.ca_cert and config.intercept.ca_key:
        load_interception_ca(config)  # the operator's: loaded, never created (ours would be)


def add_parsers(sub: Any) -> None:
    """Add ``config check`` to the top-level subcommands."""
    cfg = sub.add_parser("config", help="configuration tools").add_subparsers(
        dest="config_command", metavar="ACTION"
    )
    check = cfg.add_parser(
        "check",
        help="validate a config file and print the effective configuration",
        description="Validate FILE (and read the bearer-token files and variables, the delegation "
        "token file, the upstream CA files, the proxy_auth_file, a signing.key file and the "
        "operator's interception CA it names, as run does; nothing is created) and print the "
        "effective configuration, secrets redacted.",
        epilog=environment_epilog(),
        formatter_class=HelpFormatter,
    )
    check.add_argument("config", metavar="FILE", nargs="?", help="YAML file (default: the embedded defaults)")
    check.set_defaults(func=cmd_config_check)
