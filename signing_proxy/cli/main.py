"""The ``signing-proxy`` command: the only place that starts an event loop.

Exit status: 0 success, 1 runtime failure, 2 bad input (configuration, key file, arguments).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from .. import __version__
from ..config.schema import Config, ConfigError, load_config, parse_host_port, redacted
from ..core.jwk import SigningKey
from ..errors import CliError
from ..storage.keyfile import KeyFileError, load_key_file, write_private_file

if TYPE_CHECKING:
    from ..core.keys import KeyProvider
    from ..service.app import ProxyApp
    from ..storage.ca import CertificateAuthority

__all__ = ["main"]

log = logging.getLogger("signing_proxy")


EPILOG = """\
examples:
  signing-proxy run                                  # embedded default config, key generated on first run
  signing-proxy run --config config/agent-laptop.yaml --signature-agent https://agent.example
  signing-proxy config check config/sidecar.yaml     # validate and print the effective config
  signing-proxy keys generate --out agent-key.pem    # new Ed25519 key (0600), prints its thumbprint
  signing-proxy keys rotate --grace 48h              # new signing key; the old one retires after 48 h
  signing-proxy publish --out public/                # directory, svc.json, revocation list as files
  signing-proxy ca export --out ca.pem               # the interception CA certificate, for trust stores

Point an agent at it (HTTP and HTTPS, with the CA bundle):  eval "$(signing-proxy env)"
"""


def _configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("signing_proxy")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if message.startswith("{"):  # access lines are already JSON objects
            return message
        return json.dumps(
            {
                "time": self.formatTime(record),
                "level": record.levelname.lower(),
                "logger": record.name,
                "message": message,
            }
        )


def _load(args: argparse.Namespace) -> Config:
    """File (``--config`` or ``$SIGNING_PROXY_CONFIG``), then ``SIGNING_PROXY_*`` variables, then flags."""
    from ..config.env import ENV_CONFIG_FILE, apply_env_overrides

    try:
        path = getattr(args, "config", None) or os.environ.get(ENV_CONFIG_FILE)
        config = apply_env_overrides(load_config(Path(path) if path else None), os.environ)
        overrides = {}
        if getattr(args, "listen", None):
            overrides["listen"] = args.listen
        if getattr(args, "key", None):
            overrides["signing.key"] = args.key
        if getattr(args, "signature_agent", None) is not None:
            overrides["signing.signature_agent"] = args.signature_agent
        if getattr(args, "data_dir", None):
            overrides["data_dir"] = args.data_dir
        return config.with_overrides(**overrides) if overrides else config
    except ConfigError as exc:
        raise CliError(f"configuration error: {exc}") from None


def load_signing_key(config: Config) -> SigningKey:
    """The static key named by ``signing.key`` (the key store serves otherwise)."""
    assert config.signing.key
    path = Path(config.signing.key).expanduser()
    try:
        return load_key_file(path)
    except KeyFileError as exc:
        raise CliError(f"signing key: {exc}") from None


# --- commands --------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    config = _load(args)
    _configure_logging(config.log.level, config.log.format)
    from .keys import key_provider_for

    keys = key_provider_for(config)  # signing.key, else the key store (created on first run)
    workers = getattr(args, "workers", 1)
    if workers < 1:
        raise CliError(f"--workers: must be at least 1, got {workers}")
    if workers > 1:
        return _run_workers(config, keys, args, workers)
    _use_uvloop()
    try:
        return asyncio.run(_serve(config, keys, args))
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def _use_uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop  # optional extra "fast"

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _run_workers(config: Config, keys: KeyProvider, args: argparse.Namespace, workers: int) -> int:
    """``--workers N``: resolve the port once, create the CA once, then fork N event loops."""
    from ..proxy.connect import load_interception_ca
    from ..service.workers import MAX_WORKERS, reserve_port, run_workers

    if not 1 < workers <= MAX_WORKERS:
        raise CliError(f"--workers: must be from 1 to {MAX_WORKERS}")
    for name, listen in (("publish.listen", config.publish.listen), ("admin.listen", config.admin.listen)):
        if listen is not None and listen.endswith(":0"):
            raise CliError(f"{name}: with --workers, give a fixed port (every worker binds it)")
    host, port = parse_host_port(config.listen, "listen")
    try:
        reserved, port = reserve_port(host, port)
    except OSError as exc:
        raise CliError(f"listen: cannot bind {config.listen}: {exc.strerror or exc}") from None
    shown = f"[{host}]" if ":" in host else host
    config = config.with_overrides(listen=f"{shown}:{port}")
    if config.intercept.enabled:
        from ..storage.ca import CAError

        try:
            load_interception_ca(config)  # created here, once, before the workers load it
        except CAError as exc:
            raise CliError(f"interception CA: {exc.detail or exc.reason}") from None

    def worker(index: int) -> int:
        _use_uvloop()
        try:
            return asyncio.run(_serve(config, keys, args, reuse_port=True, worker=index))
        except CliError as exc:
            print(f"signing-proxy: {exc}", file=sys.stderr)
            return 2

    try:
        return run_workers(workers, worker)
    finally:
        reserved.close()


async def _serve(
    config: Config,
    keys: KeyProvider,
    args: argparse.Namespace | None = None,
    *,
    reuse_port: bool = False,
    worker: int | None = None,
) -> int:
    from ..errors import ProxyError
    from ..service.app import ProxyApp
    from .keys import start_key_services

    try:
        app = ProxyApp(config, keys)
    except ProxyError as exc:
        raise CliError(exc.detail) from None
    app.reuse_port = reuse_port
    try:
        addresses = await app.start()
    except OSError as exc:
        raise CliError(f"listen: cannot bind {config.listen}: {exc.strerror or exc}") from None
    try:
        services = await start_key_services(
            config, keys, reuse_port=reuse_port
        )  # publish.listen, SIGHUP reload
    except BaseException:
        await app.stop()
        raise
    key = keys.current(app.clock())
    if app.admin_address is not None:
        host, port = app.admin_address
        print(f"signing-proxy {__version__} admin on http://{host}:{port}", file=sys.stderr, flush=True)
    for host, port in addresses:
        shown = f"[{host}]" if ":" in host else host
        print(
            f"signing-proxy {__version__} listening on http://{shown}:{port} "
            f"keyid={key.thumbprint if key is not None else 'none'}"
            + (f" worker={worker}" if worker is not None else ""),
            file=sys.stderr,
            flush=True,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def on_sighup() -> None:
        services.reload()  # key stores
        if args is not None:
            _reload_config(app, args)

    loop.add_signal_handler(signal.SIGHUP, on_sighup)
    await stop.wait()
    log.info("shutting down: draining in-flight requests for up to %g s", app.config.timeouts.drain_s)
    await services.stop()
    await app.stop(drain_s=app.config.timeouts.drain_s)
    return 0


def _reload_config(app: ProxyApp, args: argparse.Namespace) -> None:
    """SIGHUP: re-read the configuration; a bad one is refused and the running one keeps serving."""
    from ..errors import ProxyError

    try:
        pending = app.reload(_load(args))
    except (CliError, ProxyError) as exc:
        reason = exc.detail if isinstance(exc, ProxyError) else str(exc)
        log.error("SIGHUP: new configuration refused, the running one keeps serving: %s", reason)
        return
    suffix = f"; not applied until restart: {', '.join(pending)}" if pending else ""
    log.info("SIGHUP: configuration reloaded%s", suffix)


def cmd_config_check(args: argparse.Namespace) -> int:
    config = _load(args)
    print(f"# {args.config or 'embedded default configuration'}: OK")
    print(yaml.safe_dump(redacted(config), sort_keys=False), end="")
    return 0


def cmd_keys_generate(args: argparse.Namespace) -> int:
    path = Path(args.out).expanduser()
    key = SigningKey.generate()
    data = json.dumps(key.to_jwk()).encode() + b"\n" if args.format == "jwk" else key.to_pem()
    try:
        write_private_file(path, data, overwrite=args.force)
    except FileExistsError:
        raise CliError(f"{path} exists; use --force to replace it") from None
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
    _print_key(key, path)
    return 0


def cmd_keys_show(args: argparse.Namespace) -> int:
    path = Path(args.path).expanduser()
    try:
        key = load_key_file(path)
    except KeyFileError as exc:
        raise CliError(str(exc)) from None
    _print_key(key, path)
    return 0


def _print_key(key: SigningKey, path: Path) -> None:
    print(f"thumbprint: {key.thumbprint}")
    print(f"file:       {path}")
    print(f"public jwk: {json.dumps(key.public.jwk())}")


def _interception_ca(config: Config) -> CertificateAuthority:
    from ..proxy.connect import load_interception_ca
    from ..storage.ca import CAError

    try:
        return load_interception_ca(config)
    except CAError as exc:
        raise CliError(f"interception CA: {exc.detail or exc.reason}") from None


def cmd_ca_export(args: argparse.Namespace) -> int:
    config = _load(args)
    ca = _interception_ca(config)
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
    from ..config.schema import parse_host_port
    from ..proxy.connect import ca_cert_path
    from ..storage.ca import write_ca_bundle

    config = _load(args)
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
        proxy = f'"http://${{SIGNING_PROXY_USER}}:${{SIGNING_PROXY_PASSWORD}}@{authority}"'
    else:
        proxy = shlex.quote(f"http://{authority}")
    lines += [f"export {name}={proxy}" for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")]
    if config.intercept.no_proxy:
        no_proxy = shlex.quote(",".join(config.intercept.no_proxy))
        lines += [f"export NO_PROXY={no_proxy}", f"export no_proxy={no_proxy}"]
    if config.intercept.enabled:
        ca = _interception_ca(config)
        bundle = Path(args.bundle).expanduser() if args.bundle else config.data_path / "ca-bundle.pem"
        try:
            write_ca_bundle(ca, bundle)
        except OSError as exc:
            raise CliError(f"cannot write the CA bundle {bundle}: {exc.strerror or exc}") from None
        quoted = shlex.quote(str(bundle.absolute()))
        for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
            lines.append(f"export {name}={quoted}")
        lines.append(f"export NODE_EXTRA_CA_CERTS={shlex.quote(str(ca_cert_path(config).absolute()))}")
    else:
        lines.append("# intercept.enabled is false: HTTPS is not intercepted, no CA is needed")
    lines.append("export NODE_USE_ENV_PROXY=1")
    print("\n".join(lines))
    return 0


# --- parser ----------------------------------------------------------------------------------------


def _add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="FILE", help="YAML configuration (default: the embedded defaults)"
    )


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

    run = sub.add_parser("run", help="run the proxy", description="Run the signing proxy in the foreground.")
    _add_config_flag(run)
    run.add_argument("--listen", metavar="HOST:PORT", help="address to listen on (default 127.0.0.1:8080)")
    run.add_argument("--key", metavar="PATH", help="signing key: PKCS#8 PEM or private JWK, mode 0600")
    run.add_argument(
        "--signature-agent", metavar="URL", help="directory base URL sent in Signature-Agent (default: empty)"
    )
    run.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="N processes sharing the port (SO_REUSEPORT), one event loop each (default 1)",
    )
    run.add_argument(
        "--data-dir", metavar="DIR", help="where generated keys live (default ~/.local/share/signing-proxy)"
    )
    run.set_defaults(func=cmd_run)

    cfg = sub.add_parser("config", help="configuration tools").add_subparsers(
        dest="config_command", metavar="ACTION"
    )
    check = cfg.add_parser(
        "check",
        help="validate a config file and print the effective configuration",
        description="Validate FILE and print the effective configuration (secrets redacted).",
    )
    check.add_argument("config", metavar="FILE", nargs="?", help="YAML file (default: the embedded defaults)")
    check.set_defaults(func=cmd_config_check)

    keys = sub.add_parser("keys", help="signing keys").add_subparsers(dest="keys_command", metavar="ACTION")
    gen = keys.add_parser(
        "generate",
        help="generate an Ed25519 signing key",
        description="Generate an Ed25519 key, written owner-only (0600).",
    )
    gen.add_argument("--out", required=True, metavar="PATH", help="file to write")
    gen.add_argument(
        "--format", choices=("pem", "jwk"), default="pem", help="PKCS#8 PEM (default) or private JWK"
    )
    gen.add_argument("--force", action="store_true", help="replace an existing file")
    gen.set_defaults(func=cmd_keys_generate)
    show = keys.add_parser(
        "show",
        help="print a key's thumbprint and public JWK",
        description="Print the RFC 7638 thumbprint (the keyid) and the public JWK of a key file.",
    )
    show.add_argument("path", metavar="PATH")
    show.set_defaults(func=cmd_keys_show)
    from .keys import add_parsers  # keys list|rotate|revoke|prune, publish

    add_parsers(sub, keys)
    from .delegate import add_parsers as add_delegate_parsers  # delegate issue|extend|inspect|verify

    add_delegate_parsers(sub)
    from .verify import add_parsers as add_verify_parsers  # verify-origin

    add_verify_parsers(sub)
    from .discover import add_parser as add_discover_parser  # discover URL

    add_discover_parser(sub)

    ca = sub.add_parser("ca", help="the interception CA").add_subparsers(dest="ca_command", metavar="ACTION")
    export = ca.add_parser(
        "export",
        help="print or write the interception CA certificate (PEM)",
        description="Write the interception CA certificate (PEM) to stdout or --out; the CA is created "
        "in the data directory on first use, like `run` does.",
    )
    _add_config_flag(export)
    export.add_argument("--data-dir", metavar="DIR", help="data directory (default: from the config)")
    export.add_argument("--out", metavar="FILE", help="write here instead of stdout")
    export.set_defaults(func=cmd_ca_export)

    env = sub.add_parser(
        "env",
        help="print the shell lines that point an agent at the proxy",
        description="Print `export` lines for HTTP(S)_PROXY, NO_PROXY, the CA bundle (written by this "
        'command: system CAs plus the interception CA) and Node. Use: eval "$(signing-proxy env)"',
    )
    _add_config_flag(env)
    env.add_argument("--listen", metavar="HOST:PORT", help="the proxy's address (default: from the config)")
    env.add_argument("--data-dir", metavar="DIR", help="data directory (default: from the config)")
    env.add_argument(
        "--bundle", metavar="PATH", help="where to write the CA bundle (default <data_dir>/ca-bundle.pem)"
    )
    env.set_defaults(func=cmd_env)
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
    except CliError as exc:
        print(f"signing-proxy: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
