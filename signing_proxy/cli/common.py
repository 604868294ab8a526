"""What every command group shares: the configuration from flags and environment, logging, the
shared flags, the duration argument type, key files named by a flag and the one-line text of a refusal.

Command modules import this; it imports no command module.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from pathlib import Path

from ..config import ENV_CONFIG_FILE, ENV_OVERRIDES, Config, apply_env_overrides, load_config
from ..core.durations import parse_duration
from ..core.jwk import PublicKey, SigningKey
from ..errors import (
    CAError,
    CliError,
    ConfigError,
    Error,
    KeyFileError,
    KeyStoreError,
    ProxyError,
    StorageError,
)
from ..logline import exception_kind, line_of, say_only
from ..storage.keyfile import load_key_file, load_public_key_file

__all__ = [
    "REFUSALS",
    "HelpFormatter",
    "add_config_flag",
    "add_data_dir_flag",
    "config_from",
    "configure_logging",
    "duration",
    "environment_epilog",
    "error_line",
    "public_key_file",
    "show_host",
    "signing_key_file",
]


def config_from(args: argparse.Namespace) -> Config:
    """File (``--config`` or ``$SIGNING_PROXY_CONFIG``), then ``SIGNING_PROXY_*`` variables, then flags."""
    try:
        path = config_path(args)
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
        if getattr(args, "mode", None):  # `signing-proxy gateway`
            overrides["mode"] = args.mode
        if getattr(args, "gateway_upstream", None):
            overrides["gateway.upstream"] = args.gateway_upstream
        if getattr(args, "gateway_hosts", None):
            overrides["gateway.hosts"] = list(args.gateway_hosts)
        return config.with_overrides(**overrides) if overrides else config
    except ConfigError as exc:
        raise config_refused(exc) from None


def config_path(args: argparse.Namespace) -> str | None:
    """The configuration file a command reads: ``--config``, else ``$SIGNING_PROXY_CONFIG``."""
    return getattr(args, "config", None) or os.environ.get(ENV_CONFIG_FILE)


def config_refused(exc: ConfigError) -> CliError:
    """A refused configuration as the command line says it (``configuration error: ...``)."""
    return CliError(f"configuration error: {_naming_variables(str(exc))}")


def _naming_variables(message: str) -> str:
    """A refusal that says ``set KEY`` also names the ``SIGNING_PROXY_*`` variable that sets KEY: a
    command given only flags (``gateway``) may have no config file to set it in."""
    for name, (key, is_list) in ENV_OVERRIDES.items():
        if name not in message and re.search(rf"\bset {re.escape(key)}\b", message):
            message += f", or the variable {name}" + (" (comma-separated)" if is_list else "")
    return message


def configure_logging(level: str, fmt: str) -> None:
    """Log ``signing_proxy.*`` to stderr at ``level``, as text or one JSON object a line, and what
    asyncio and aiohttp log (``LIBRARY_LOGGERS``) through the same handlers, one line each."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("signing_proxy")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    sys.unraisablehook = _log_unraisable
    for name in LIBRARY_LOGGERS:  # their records reach our handlers too, one line each
        library = logging.getLogger(name)
        library.handlers[:] = [h for h in library.handlers if not isinstance(h, _Forwarded)]
        library.addHandler(_Forwarded(root))


# The libraries under us that log: asyncio ("Task exception was never retrieved", "Exception in
# callback ..."), aiohttp (a listener of its own, a client). Nobody configured their loggers, so
# Python's last-resort handler wrote their records to stderr: tracebacks over many lines, past
# ``log.format: json``, quoting an exception's text (a stranger's bytes, a token in a header line),
# in a blocking write that a stderr nobody reads held, the event loop with it.
LIBRARY_LOGGERS = ("asyncio", "aiohttp")
_QUOTED = re.compile(r"[(<\[{'\"=]")  # where a library's line starts to quote a value (a repr, arguments)


def _unquoted(text: str) -> str:
    """A library's first line up to any quoted value (at most 200 characters), never empty."""
    return _QUOTED.split(text, 1)[0].strip()[:200] or "(details not shown)"


class _Forwarded(logging.Handler):
    """A library's record handed to ``target``'s handlers (read as they are then: routed through the
    app's writer while it runs) as one line: its first line up to any quoted value, then the type of
    the exception it carries; no traceback, no exception text. At ``target``'s level, not the
    library's. Its own propagation is left alone: a handler set on the root logger still sees it."""

    def __init__(self, target: logging.Logger) -> None:
        super().__init__()
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < self.target.getEffectiveLevel():
            return
        line = logging.makeLogRecord(record.__dict__)  # a copy: the library's own handlers see theirs
        say_only(line, line_of(record, _unquoted))
        for handler in self.target.handlers:
            if line.levelno >= handler.level:
                handler.handle(line)


def _log_unraisable(unraisable: sys.UnraisableHookArgs) -> None:
    """An error Python cannot raise (in a callback of C code, a finalizer): one line in the log's
    format, not a traceback written to stderr past it (``log.format: json`` stays one object a line)."""
    exc, where = unraisable.exc_value, unraisable.object
    log = logging.getLogger("signing_proxy")
    if isinstance(exc, UnicodeDecodeError) and isinstance(where, bytes):
        # ssl decodes a ClientHello's server name as ASCII before our SNI callback runs; the
        # handshake then fails, and is logged as that (proxy.connect)
        log.debug("a TLS server name that is not ASCII: %.80r", where)
        return
    # where it happened by name (a function's, a coroutine's) or type, the exception by its kind: their
    # reprs may quote what they hold (a stranger's bytes, a token)
    place = getattr(where, "__qualname__", None) or type(where).__name__
    kind = exception_kind(exc) if exc is not None else "-"
    log.warning("%s: %.120s: %s", unraisable.err_msg or "Exception ignored", place, kind)


class _JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and the traceback (``exc``) when the
    record carries one (``log.exception``)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.name == _ACCESS and message.startswith("{"):  # an access line, already a JSON object
            return message  # (only that logger's: any other message is quoted, whoever wrote it)
        line = {
            "time": self.formatTime(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line)


_ACCESS = "signing_proxy.access"  # where access lines were logged before they had their own writer


# What ends a command with one line and exit status 2: bad input (arguments, configuration, files).
REFUSALS: tuple[type[Error], ...] = (CliError, ConfigError, StorageError)


def error_line(exc: Error) -> str:
    """The one line printed for a refusal that ends a command (after ``signing-proxy: ``)."""
    if isinstance(exc, CAError):
        return f"interception CA: {exc.detail or exc.reason}"
    if isinstance(exc, KeyStoreError):
        return f"key store: {exc}"
    if isinstance(exc, ProxyError):
        return exc.detail or exc.reason
    if isinstance(exc, KeyFileError):  # a mistyped pkcs11: URI taken for a key path: its PIN not shown
        return exc.shown()
    return str(exc)


def show_host(host: str) -> str:
    """``host`` as written in a URL: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def duration(text: str) -> int:
    """An argparse ``type``: ``30m``, ``48h``, ``90d``, ``3600s`` -> seconds."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, except that a text with line breaks of its own (a list, as in
    ``environment_epilog``) is kept as written instead of being wrapped into one paragraph."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def environment_epilog() -> str:
    """The ``SIGNING_PROXY_*`` variables ``config_from`` reads, as a ``--help`` epilog (``HelpFormatter``)."""
    width = max(len(name) for name in (ENV_CONFIG_FILE, *ENV_OVERRIDES))
    lines = [
        "environment (a variable overrides the file, a flag overrides both):",
        f"  {ENV_CONFIG_FILE:<{width}}  the YAML file, when none is given on the command line",
    ]
    for name, (key, is_list) in ENV_OVERRIDES.items():
        lines.append(f"  {name:<{width}}  {key}" + (" (comma-separated)" if is_list else ""))
    return "\n".join(lines) + "\n"


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="FILE", help="YAML configuration (default: the embedded defaults)"
    )


def add_data_dir_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", metavar="DIR", help="data directory (default: from the config)")


# --- key files named by a flag ---------------------------------------------------------------------


def store_refused(exc: Exception) -> CliError:
    """A refusal as one line; the key store's ends with its stable reason (``rotation-pending``, ...)."""
    return CliError(f"{exc} ({exc.reason})" if isinstance(exc, KeyStoreError) else str(exc))


def signing_key_file(path: str, flag: str) -> SigningKey:
    try:
        return load_key_file(Path(path).expanduser())
    except KeyFileError as exc:  # a mistyped pkcs11: URI is taken for a path: its PIN is not shown
        raise CliError(f"{flag}: {exc.shown()}") from None


def public_key_file(path: Path, flag: str) -> PublicKey:
    """A public key from a file: SPKI PEM, public JWK, or a private key file (owner-only) whose public
    half is taken (``storage.keyfile.load_public_key_file``)."""
    try:
        return load_public_key_file(path)
    except KeyFileError as exc:  # a pkcs11: URI given where a file is read: its PIN is not shown
        raise CliError(f"{flag}: {exc.shown()}") from None
