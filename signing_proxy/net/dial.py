"""Reaching an upstream: a verifying TLS client context, and a connection opened within a bound.

Every failure to connect is a ``ProxyError`` naming its cause (``upstream-connect-timeout``,
``-certificate-invalid``, ``-tls-failed``, ``-dns-failed``, ``-connect-failed``); a connection to an
address vetted by ``net.egress`` never resolves the host again.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import ssl
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..config import UpstreamConfig
from ..errors import ConfigError, ProxyError

__all__ = ["client_tls_context", "open_upstream", "upstream_tls_contexts"]


@functools.lru_cache(maxsize=32)
def client_tls_context(ca_file: str | None = None, *, only: str | None = None) -> ssl.SSLContext:
    """Verifying client context: system store plus ``ca_file``; or ``only`` that CA (pinned).

    One per CA choice and process: the proxy's pool and the package's own client share it (a context
    holding the system store costs about 0.8 MiB, and upstream settings change only on restart).
    """
    if only is not None:
        ctx = ssl.create_default_context(cafile=str(Path(only).expanduser()))
    else:
        ctx = ssl.create_default_context()
        if ca_file:
            ctx.load_verify_locations(cafile=str(Path(ca_file).expanduser()))
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def upstream_tls_contexts(config: UpstreamConfig) -> tuple[ssl.SSLContext, dict[str, ssl.SSLContext]]:
    """The default context (``ca_file``) and the pinned ones keyed by ``host_form``; ``ConfigError``.

    A CA file that cannot be read, or holds no PEM certificate, is refused here, at start-up, naming
    its key and path: it is configuration (exit status 2), not a traceback.
    """
    pinned = config.pinned()  # first: a key it refuses is not one to show
    default = _loaded("upstream.ca_file", config.ca_file, lambda: client_tls_context(config.ca_file))
    for key, path in config.pin_ca_files.items():
        where = f"upstream.pin_ca_files[{key!r}]"
        _loaded(where, path, functools.partial(client_tls_context, only=path))  # cached: used below
    return default, {host: client_tls_context(only=path) for host, path in pinned.items()}


MAX_CA_FILE_BYTES = 4 * 1024 * 1024  # our choice: a system bundle is about 200 KiB


def _loaded(key: str, path: str | None, build: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    try:
        if path:
            _regular(key, path)
        return build()
    except ssl.SSLError as exc:
        raise ConfigError(f"{key}: {path}: no PEM certificate could be read ({exc.reason or exc})") from None
    except OSError as exc:
        raise ConfigError(f"{key}: {path}: {(exc.strerror or str(exc)).lower()}") from None


_P = TypeVar("_P", bound=asyncio.Protocol)


async def open_upstream(
    factory: Callable[[], _P],
    host: str,
    port: int,
    *,
    tls: ssl.SSLContext | None,
    timeout_s: float,
    address: str | None = None,
) -> _P:
    """Connect (and handshake) within ``timeout_s``; every failure is a ProxyError naming its cause.

    With ``address`` (vetted by ``net.egress``) the socket goes to that address, never resolving
    ``host`` again, while TLS SNI and certificate checks stay with ``host``.
    """
    authority = f"{host}:{port}"
    bare = host.strip("[]")
    loop = asyncio.get_running_loop()
    try:
        _transport, protocol = await asyncio.wait_for(
            loop.create_connection(
                factory,
                bare if address is None else address,
                port,
                ssl=tls,
                server_hostname=bare if tls else None,
                flags=0 if address is None else socket.AI_NUMERICHOST,  # a vetted address: no DNS at all
            ),
            timeout_s,
        )
    except TimeoutError:
        raise ProxyError(
            504, "upstream-connect-timeout", f"connecting to {authority} took over {timeout_s:g} s"
        ) from None
    except ssl.SSLCertVerificationError as exc:
        detail = exc.verify_message or "certificate verification failed"
        raise ProxyError(502, "upstream-certificate-invalid", f"{authority}: {detail}") from None
    except ssl.SSLError as exc:
        raise ProxyError(
            502, "upstream-tls-failed", f"{authority}: TLS handshake failed ({exc.reason})"
        ) from None
    except socket.gaierror:
        raise ProxyError(502, "upstream-dns-failed", f"cannot resolve {bare}") from None
    except OSError as exc:
        if address is not None:  # asyncio's text names the address: callers may show details to strangers
            cause = os.strerror(exc.errno) if exc.errno else "connection failed"
            raise ProxyError(502, "upstream-connect-failed", f"{authority}: {cause}") from None
        raise ProxyError(502, "upstream-connect-failed", f"{authority}: {exc.strerror or exc}") from None
    return protocol


def _regular(key: str, path: str) -> None:
    """A CA file is a regular file of at most ``MAX_CA_FILE_BYTES``: OpenSSL read a FIFO or a device
    until it ended, and start-up (or ``config check``) hung on it. Opened without waiting, never read."""
    fd = os.open(Path(path).expanduser(), os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{key}: {path}: not a regular file")
    if info.st_size > MAX_CA_FILE_BYTES:
        raise ConfigError(f"{key}: {path}: larger than {MAX_CA_FILE_BYTES} bytes; not a CA file")
