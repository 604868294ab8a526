"""The ``signing-proxy`` command: the only place that starts an event loop.

Exit status: 0 success, 1 runtime failure, 2 bad input (configuration, key file, arguments).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from . import __version__
from .config import Config, ConfigError, load_config, redacted
from .core.jwk import SigningKey
from .keyfile import KeyFileError, load_key_file, write_private_file

__all__ = ["main"]

log = logging.getLogger("signing_proxy")

DEFAULT_KEY_NAME = "agent-key.pem"

EPILOG = """\
examples:
  signing-proxy run                                  # embedded default config, key generated on first run
  signing-proxy run --config config/agent-laptop.yaml --signature-agent https://agent.example
  signing-proxy config check config/sidecar.yaml     # validate and print the effective config
  signing-proxy keys generate --out agent-key.pem    # new Ed25519 key (0600), prints its thumbprint

Point an agent at it:  export HTTP_PROXY=http://127.0.0.1:8080 http_proxy=http://127.0.0.1:8080
"""


class CliError(Exception):
    """Bad input from the operator: printed as one line, exit status 2."""


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
    try:
        config = load_config(Path(args.config) if args.config else None)
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


def resolve_signing_key(config: Config) -> tuple[SigningKey, Path, bool]:
    """The configured key, or ``<data_dir>/agent-key.pem`` generated (0600) on first run."""
    if config.signing.key:
        path = Path(config.signing.key).expanduser()
        try:
            return load_key_file(path), path, False
        except KeyFileError as exc:
            raise CliError(f"signing key: {exc}") from None
    path = config.data_path / DEFAULT_KEY_NAME
    if path.exists():
        try:
            return load_key_file(path), path, False
        except KeyFileError as exc:
            raise CliError(f"signing key: {exc}") from None
    key = SigningKey.generate()
    try:
        write_private_file(path, key.to_pem())
    except OSError as exc:
        raise CliError(f"cannot create signing key in {config.data_path}: {exc.strerror or exc}") from None
    return key, path, True


# --- commands --------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    config = _load(args)
    _configure_logging(config.log.level, config.log.format)
    key, path, created = resolve_signing_key(config)
    if created:
        log.info("generated a new signing key %s at %s (first run)", key.thumbprint, path)
    with contextlib.suppress(ImportError):
        import uvloop  # optional extra "fast"

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        return asyncio.run(_serve(config, key))
    except ConfigError as exc:
        raise CliError(str(exc)) from None


async def _serve(config: Config, key: SigningKey) -> int:
    from .proxy.app import ProxyApp
    from .proxy.pipeline import StaticKeyProvider
    from .proxy.problems import ProxyError

    try:
        app = ProxyApp(config, StaticKeyProvider(key))
    except ProxyError as exc:
        raise CliError(exc.detail) from None
    try:
        addresses = await app.start()
    except OSError as exc:
        raise CliError(f"listen: cannot bind {config.listen}: {exc.strerror or exc}") from None
    for host, port in addresses:
        shown = f"[{host}]" if ":" in host else host
        print(
            f"signing-proxy {__version__} listening on http://{shown}:{port} keyid={key.thumbprint}",
            file=sys.stderr,
            flush=True,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await app.stop()
    return 0


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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args))
    except CliError as exc:
        print(f"signing-proxy: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
