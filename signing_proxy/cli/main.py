"""The ``signing-proxy`` command: assembles the parser from the command groups, dispatches, and prints
a refusal as one line. The only place that starts an event loop (through ``run``, ``discover`` and
``verify-origin``).

Exit status: 0 success, 1 runtime failure, 2 bad input (configuration, key file, arguments).
Imports flow main -> one module per command group -> ``common``; never back.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__
from . import ca, config, delegate, discover, gateway, keys, run, verify_origin
from .common import REFUSALS, error_line

__all__ = ["build_parser", "main"]


EPILOG = """\
examples:
  signing-proxy run                                  # embedded default config, key generated on first run
  signing-proxy run --config config/agent-laptop.yaml --signature-agent https://agent.example
  signing-proxy gateway --upstream http://127.0.0.1:9000   # verify, then forward to the backend
  signing-proxy config check config/sidecar.yaml     # validate and print the effective config
  signing-proxy keys generate --out agent-key.pem    # new Ed25519 key (0600), prints its thumbprint
  signing-proxy keys rotate --grace 48h              # new key, signing after max-age + 30 s; the old one
                                                     # retires then and expires 48 h later
  signing-proxy publish --out public/ --domain agent.example   # directory, svc.json, revocation list
  signing-proxy ca export --out ca.pem               # the interception CA certificate, for trust stores

Point an agent at it (HTTP and HTTPS, with the CA bundle):  eval "$(signing-proxy env)"
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="signing-proxy",
        description="A forward proxy that signs every request an agent sends: Content-Digest, Authorization, "
        "Signature-Agent and an RFC 9421 Ed25519 signature.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"signing-proxy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run.add_parsers(sub)  # run
    gateway.add_parsers(sub)  # gateway (run in mode gateway)
    config.add_parsers(sub)  # config check
    keys.add_parsers(sub)  # keys generate|show|list|rotate|revoke|prune, publish
    delegate.add_parsers(sub)  # delegate issue|extend|inspect|verify
    verify_origin.add_parsers(sub)  # verify-origin
    discover.add_parsers(sub)  # discover URL
    ca.add_parsers(sub)  # ca export, env
    return parser


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            chosen: argparse.ArgumentParser = action.choices[command]
            return chosen
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:  # no command, or a group without its action: show the help of what was typed
        _subparser(parser, getattr(args, "command", None)).print_help()
        return 2
    try:
        return int(func(args))
    except REFUSALS as exc:
        print(f"signing-proxy: {error_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
