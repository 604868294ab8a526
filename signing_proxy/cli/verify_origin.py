"""``signing-proxy verify-origin``: run an origin that answers each request with its verification verdict.

The origin is ``verify.build_verify_origin`` (the public verifier) on an aiohttp runner, stopped by
SIGTERM/SIGINT. Whoever reaches ``--listen`` may connect, so its connections pass the gate of the
other listeners that face strangers (``service/gate.py``), every client allowed: at most
``VERIFY_ORIGIN_MAX_CONNECTIONS`` open at once (more are closed unanswered), each sending a request
head within ``VERIFY_ORIGIN_IDLE_S`` of connecting or of its last answer.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import ConfigError, parse_host_port
from ..config.checks import check_origin, check_url
from ..core.signature_verify import MAX_HOPS, MAX_SKEW_S
from ..errors import CliError
from ..net.egress import EgressPolicy
from ..verify import VerifierPolicy
from .common import public_key_file

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["VERIFY_ORIGIN_IDLE_S", "VERIFY_ORIGIN_MAX_CONNECTIONS", "add_parsers", "start_verify_origin"]

# our choice: a proxy's or a relay chain's pool needs far fewer; idle connections beyond it would
# hold descriptors without bound (the excess is closed unanswered)
VERIFY_ORIGIN_MAX_CONNECTIONS = 256
VERIFY_ORIGIN_IDLE_S = 10.0  # our choice: a client sends its head at once; a pooled one reconnects


def cmd_verify_origin(args: argparse.Namespace) -> int:
    try:
        host, port = parse_host_port(args.listen, "--listen")
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    # a public key file, or a private one (owner-only) whose public half is taken, as delegate takes them
    pinned = tuple(public_key_file(Path(p).expanduser(), "--pinned-key") for p in args.pinned_key)
    brokers = tuple(
        public_key_file(Path(b).expanduser(), "--pinned-broker-key") for b in args.pinned_broker_key
    )
    for cidr in args.allow_private:
        try:
            EgressPolicy((cidr,))
        except ConfigError:
            raise CliError(f"--allow-private: {cidr!r} is not an address or CIDR") from None
    egress = EgressPolicy(args.allow_private)
    try:  # as relay.broker_directories: never fetched with user:password@, never quoted with it
        for url in args.broker_directory:
            check_url(url, "--broker-directory")
        check_origin(args.external_origin, "--external-origin")  # as gateway.external_origin
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if not 0 <= args.skew <= MAX_SKEW_S:  # the bounds of verify.skew_s
        raise CliError(f"--skew: seconds from 0 to {MAX_SKEW_S}, got {args.skew}")
    if args.max_hops is not None and not 1 <= args.max_hops <= MAX_HOPS:
        raise CliError(f"--max-hops: signatures from 1 to {MAX_HOPS} (no longer stack), got {args.max_hops}")
    policy = VerifierPolicy(
        skew_s=args.skew,
        max_hops=args.max_hops,
        broker_directories=tuple(args.broker_directory),
        pinned_agent_keys=pinned,
        pinned_broker_keys=brokers,
    )
    return asyncio.run(_serve(host, port, policy, args.external_origin, egress))


async def start_verify_origin(
    host: str,
    port: int,
    policy: VerifierPolicy,
    external_origin: str | None,
    egress: EgressPolicy,
    *,
    max_connections: int = VERIFY_ORIGIN_MAX_CONNECTIONS,
    idle_s: float = VERIFY_ORIGIN_IDLE_S,
) -> tuple[web.AppRunner, tuple[str, int]]:
    """Serve the verifying origin on ``host:port`` through the gate; the runner (``cleanup()`` stops
    it) and the bound address. ``max_connections``, ``idle_s``: the gate's bounds (for tests)."""
    # aiohttp only when this command runs: every other command's process stays without it
    from ..service.gate import Gate, start_gated  # noqa: PLC0415
    from ..verify.origin import build_verify_origin  # noqa: PLC0415

    app = build_verify_origin(policy, external_origin=external_origin, egress=egress)
    gate = Gate(max_connections=max_connections, idle_s=idle_s)  # every client allowed
    try:
        runner = await start_gated(
            app,
            gate,
            host,
            port,
            reuse_port=False,
            auto_decompress=False,  # a Content-Digest covers the bytes sent, content coding included
        )
    except OSError as exc:
        raise CliError(f"--listen: cannot bind {host}:{port}: {exc.strerror or exc}") from None
    addresses = runner.addresses
    bound = addresses[0][:2] if addresses else (host, port)
    return runner, (str(bound[0]), int(bound[1]))


async def _serve(
    host: str, port: int, policy: VerifierPolicy, external_origin: str | None, egress: EgressPolicy
) -> int:
    runner, bound = await start_verify_origin(host, port, policy, external_origin, egress)
    print(f"verify-origin listening on http://{bound[0]}:{bound[1]}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    return 0


def add_parsers(sub: Any) -> None:
    """Register ``verify-origin`` on the top-level subparsers."""
    p = sub.add_parser(
        "verify-origin",
        help="run an origin that verifies every request and answers the verdict as JSON",
        description="Verify each request's RFC 9421 signature stack per the spec (keys from the "
        "Signature-Agent directory, brokers' keys from --broker-directory) and answer 200 with the "
        "labels, keyids, key sources and signature bases, or 401 problem+json with the refusal reason "
        "(503 when it may not fetch another new key directory this second: verify.fetches_per_s). "
        "Point a proxy or a chain of relays at it to debug a deployment end to end.",
    )
    p.add_argument("--listen", default="127.0.0.1:8090", metavar="HOST:PORT", help="default 127.0.0.1:8090")
    p.add_argument(
        "--broker-directory",
        action="append",
        default=[],
        metavar="URL",
        help="directory base URL of a broker whose labels may appear (repeatable)",
    )
    p.add_argument(
        "--pinned-key",
        action="append",
        default=[],
        metavar="FILE",
        help="an agent's key trusted when its request's Signature-Agent is empty (no directory to fetch "
        "it from; the quick-start proxy's requests): a public PEM or JWK, or its private key file (0600), "
        "whose public half is used (repeatable)",
    )
    p.add_argument(
        "--pinned-broker-key",
        action="append",
        default=[],
        metavar="FILE",
        help="a broker's key, trusted for later labels without a directory: a public PEM or JWK, or its "
        "private key file (0600) (repeatable)",
    )
    p.add_argument(
        "--external-origin",
        metavar="URL",
        help="origin clients used, when a TLS-terminating proxy sits in front (e.g. https://x.example)",
    )
    p.add_argument(
        "--allow-private",
        action="append",
        default=[],
        metavar="CIDR",
        help="let directories and revocation lists be fetched from these loopback, private or link-local "
        "addresses, also over plain http (local development and tests; repeatable)",
    )
    p.add_argument(
        "--max-hops",
        type=int,
        metavar="N",
        help="refuse stacks with more than N signatures, 1 to 16 (default: no cap but the 16 every "
        "verifier holds to)",
    )
    p.add_argument("--skew", type=int, default=5, metavar="SECONDS", help="clock skew tolerated (default 5)")
    p.set_defaults(func=cmd_verify_origin)
