"""``signing-proxy gateway``: ``run`` in ``mode: gateway``, a verifying reverse proxy before a backend."""

from __future__ import annotations

from typing import Any

from .common import HelpFormatter, add_config_flag, environment_epilog
from .run import cmd_run

__all__ = ["add_parsers"]


def add_parsers(sub: Any) -> None:
    """Add ``gateway`` to the top-level subcommands."""
    gateway = sub.add_parser(
        "gateway",
        help="run the verifying gateway in front of a backend",
        description="Verify every request (signatures, requester, delegation, quota, replay) and forward "
        "only verified ones to the backend, with X-Verified-* headers it may trust.",
        epilog=environment_epilog(),
        formatter_class=HelpFormatter,
    )
    add_config_flag(gateway)
    gateway.add_argument(
        "--listen", metavar="HOST:PORT", help="address to listen on (default 127.0.0.1:8080)"
    )
    gateway.add_argument(
        "--upstream", dest="gateway_upstream", metavar="URL", help="the backend's origin (gateway.upstream)"
    )
    gateway.add_argument(
        "--host",
        dest="gateway_hosts",
        action="append",
        metavar="NAME",
        help="a name clients send in Host, without a port (repeatable; gateway.hosts, default the "
        "loopback names): a request for any other is 421, since a signature covers the origin",
    )
    gateway.add_argument(
        "--workers", type=int, default=1, metavar="N", help="N processes sharing the port (default 1)"
    )
    gateway.add_argument(
        "--data-dir",
        metavar="DIR",
        help="data directory, for the embedded counter store "
        "(default: data_dir from the config, ~/.local/share/signing-proxy)",
    )
    gateway.set_defaults(func=cmd_run, mode="gateway")
