"""``signing-proxy ca export`` and ``signing-proxy env``: the interception CA, and the shell lines that
point an agent at the proxy (its address, NO_PROXY, the CA bundle).

The CA is created in the data directory on first use, as ``run`` does; an unusable one ends the
command with ``CAError``.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import shlex
import sys
from pathlib import Path
from typing import Any

from ..config import parse_host_port
from ..errors import CliError
from ..proxy.connect import ca_cert_path, load_interception_ca
from ..storage.ca import write_ca_bundle
from .common import add_config_flag, add_data_dir_flag, config_from

__all__ = ["add_parsers", "cmd_ca_export", "cmd_env"]

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
CA_BUNDLE_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


def cmd_ca_export(args: argparse.Namespace) -> int:
    ca = load_interception_ca(config_from(args))
    if not args.out:
        sys.stdout.write(ca.cert_pem().decode("ascii"))
        return 0
    path = Path(args.out).expanduser()
    try:
        path.write_bytes(ca.cert_pem())
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
    print(f"wrote {path} (interception CA sha256={ca.thumbprint_sha256()})", file=sys.stderr)
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    config = config_from(args)
    host, port = parse_host_port(config.listen, "listen")
    if port == 0:
        raise CliError("listen: port 0 is picked at start; pass --listen HOST:PORT with the bound address")
    with contextlib.suppress(ValueError):
        address = ipaddress.ip_address(host)
        if address.is_unspecified:  # listening on every interface: reach it on loopback
            host = "::1" if address.version == 6 else "127.0.0.1"
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = []
    if config.access.proxy_auth_file:
        lines.append(
            "# proxy authentication is on: set SIGNING_PROXY_USER and SIGNING_PROXY_PASSWORD "
            "(percent-encoded) before evaluating these lines"
        )
        # only the variables are expanded: the address is quoted apart (a listen host is text from a
        # file, a variable or --listen, and "x$(cmd)y" inside the double quotes ran cmd on eval)
        proxy = '"http://${SIGNING_PROXY_USER}:${SIGNING_PROXY_PASSWORD}@"' + shlex.quote(authority)
    else:
        proxy = shlex.quote(f"http://{authority}")
    lines += [f"export {name}={proxy}" for name in PROXY_VARIABLES]
    if config.intercept.no_proxy:
        no_proxy = shlex.quote(",".join(config.intercept.no_proxy))
        lines += [f"export NO_PROXY={no_proxy}", f"export no_proxy={no_proxy}"]
    if config.intercept.enabled:
        ca = load_interception_ca(config)
        bundle = Path(args.bundle).expanduser() if args.bundle else config.data_path / "ca-bundle.pem"
        try:
            write_ca_bundle(ca, bundle)
        except OSError as exc:
            raise CliError(f"cannot write the CA bundle {bundle}: {exc.strerror or exc}") from None
        quoted = shlex.quote(str(bundle.absolute()))
        lines += [f"export {name}={quoted}" for name in CA_BUNDLE_VARIABLES]
        lines.append(f"export NODE_EXTRA_CA_CERTS={shlex.quote(str(ca_cert_path(config).absolute()))}")
    else:
        lines.append("# intercept.enabled is false: HTTPS is not intercepted, no CA is needed")
    lines.append("export NODE_USE_ENV_PROXY=1")
    print("\n".join(lines))
    return 0


def add_parsers(sub: Any) -> None:
    """Add ``ca export`` and ``env`` to the top-level subcommands."""
    ca = sub.add_parser("ca", help="the interception CA").add_subparsers(dest="ca_command", metavar="ACTION")
    export = ca.add_parser(
        "export",
        help="print or write the interception CA certificate (PEM)",
        description="Write the interception CA certificate (PEM) to stdout or --out; the CA is created "
        "in the data directory on first use, like `run` does.",
    )
    add_config_flag(export)
    add_data_dir_flag(export)
    export.add_argument("--out", metavar="FILE", help="write here instead of stdout")
    export.set_defaults(func=cmd_ca_export)

    env = sub.add_parser(
        "env",
        help="print the shell lines that point an agent at the proxy",
        description="Print `export` lines for HTTP(S)_PROXY, NO_PROXY, the CA bundle (written by this "
        'command: system CAs plus the interception CA) and Node. Use: eval "$(signing-proxy env)"',
    )
    add_config_flag(env)
    env.add_argument("--listen", metavar="HOST:PORT", help="the proxy's address (default: from the config)")
    add_data_dir_flag(env)
    env.add_argument(
        "--bundle", metavar="PATH", help="where to write the CA bundle (default <data_dir>/ca-bundle.pem)"
    )
    env.set_defaults(func=cmd_env)
