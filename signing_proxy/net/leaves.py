"""TLS contexts for intercepted CONNECT tunnels: one server ``ssl.SSLContext`` per host, in a bounded LRU.

``LeafContextCache`` turns the interception CA's leaves (``storage/ca.py``) into server-side contexts.
Every context it hands out carries ``sni_callback = cache.sni_callback``: use
``cache.get(connect_host)`` as the server context of an intercepted CONNECT tunnel and the leaf
follows the SNI the client sends, while clients that send no SNI (IP-literal targets) get the leaf of
the CONNECT host. The stdlib has no API that loads a certificate chain or private key from memory
(``cadata`` exists only for trust anchors), so the PEM reaches OpenSSL through a path: an anonymous
``memfd`` (Linux; nothing touches a disk) or, where that is unavailable, 0600 files in a private 0700
temporary directory removed by ``close()``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import ssl
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Final

from ..errors import CAError
from ..storage.ca import CertificateAuthority
from ..storage.certs import as_utc, normalize_host
from ..storage.files import write_all, write_new

__all__ = ["LEAF_CACHE_MAX_ENTRIES", "LeafContextCache"]

log = logging.getLogger(__name__)

LEAF_CACHE_MAX_ENTRIES: Final = 1024


class _PemPaths:
    """Hands PEM bytes to OpenSSL by path: memfd (``/proc/self/fd/N``) or files in a 0700 temp dir."""

    def __init__(self, key_pem: bytes, *, use_memfd: bool | None) -> None:
        self._key_fd: int | None = None
        self._dir: str | None = None
        self._finalizer: Callable[[], object]
        if use_memfd is not False and hasattr(os, "memfd_create"):
            fd = os.memfd_create("signing-proxy-leaf-key", os.MFD_CLOEXEC)
            write_all(fd, key_pem)
            path = f"/proc/self/fd/{fd}"
            if _readable_as(path, key_pem):
                self._key_fd, self.key_path = fd, path
                self._finalizer = weakref.finalize(self, os.close, fd)
                return
            os.close(fd)
            if use_memfd:
                raise OSError("memfd paths are not readable here (is /proc mounted?)")
        elif use_memfd:
            raise OSError("memfd_create is not available on this platform")
        directory = tempfile.mkdtemp(prefix="signing-proxy-leaf-")  # created 0700
        self._dir = directory
        self._finalizer = weakref.finalize(self, _remove_tree, directory)
        self.key_path = os.path.join(directory, "leaf-key.pem")
        write_new(self.key_path, key_pem)

    @property
    def kind(self) -> str:
        return "memfd" if self._key_fd is not None else "tempdir"

    @property
    def directory(self) -> str | None:
        return self._dir

    @contextlib.contextmanager
    def temporary(self, data: bytes) -> Iterator[str]:
        """A path holding ``data`` for the duration of the block, gone afterwards."""
        if self._key_fd is not None:
            fd = os.memfd_create("signing-proxy-leaf-chain", os.MFD_CLOEXEC)
            try:
                write_all(fd, data)
                yield f"/proc/self/fd/{fd}"
            finally:
                os.close(fd)
            return
        assert self._dir is not None
        fd, path = tempfile.mkstemp(suffix=".pem", dir=self._dir)  # created 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            yield path
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def close(self) -> None:
        self._finalizer()


def _remove_tree(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def _readable_as(path: str, expected: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read() == expected
    except OSError:
        return False


class LeafContextCache:
    """Server-side ``ssl.SSLContext`` per host, minted on demand, kept in a bounded LRU.

    Each context is TLS >= 1.2, ALPN ``http/1.1``, loaded with leaf + CA chain and the CA's shared
    leaf key, and carries ``sni_callback = self.sni_callback``. A cached context is re-minted once
    half its leaf's lifetime has passed. ``hits``, ``misses`` and ``evictions`` count lookups; a
    re-mint counts as a miss. Safe to use from several threads; minting happens outside the lock.
    """

    def __init__(
        self,
        ca: CertificateAuthority,
        max_entries: int = LEAF_CACHE_MAX_ENTRIES,
        *,
        alpn_protocols: Sequence[str] = ("http/1.1",),
        clock: Callable[[], datetime] | None = None,
        use_memfd: bool | None = None,
    ) -> None:
        """``use_memfd``: None picks memfd when it works, else a temp dir; True/False force one."""
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._ca = ca
        self.max_entries = max_entries
        self._alpn = list(alpn_protocols)
        self._clock = clock or (lambda: datetime.now(UTC))
        self._entries: OrderedDict[str, tuple[ssl.SSLContext, datetime]] = OrderedDict()
        self._lock = threading.Lock()
        self._pem = _PemPaths(ca.leaf_key_pem(), use_memfd=use_memfd)
        self._closed = False
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @property
    def storage(self) -> str:
        """How PEM reaches OpenSSL: ``"memfd"`` or ``"tempdir"``."""
        return self._pem.kind

    @property
    def temp_dir(self) -> str | None:
        """The private temp dir holding the leaf key, or None with memfd storage."""
        return self._pem.directory

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, host: object) -> bool:
        if not isinstance(host, str):
            return False
        try:
            key = normalize_host(host)
        except CAError:
            return False
        return key in self._entries

    def get(self, host: str) -> ssl.SSLContext:
        """The server context for ``host`` (a DNS name or IP literal); raises ``CAError``."""
        if self._closed:
            raise RuntimeError("LeafContextCache is closed")
        # Keys are normalised and normalising is idempotent: a host found as-is needs no parsing.
        key = host if host in self._entries else normalize_host(host)
        now = as_utc(self._clock())
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and now < entry[1]:
                self._entries.move_to_end(key)
                self.hits += 1
                return entry[0]
            self.misses += 1
        context, refresh_at = self._new_context(key, now)
        with self._lock:
            self._entries[key] = (context, refresh_at)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
                self.evictions += 1
        return context

    def new_base_context(self) -> ssl.SSLContext:
        """A server context with no certificate that picks the leaf from SNI alone.

        Handshakes without SNI (clients connecting to an IP literal) fail on it; prefer
        ``get(connect_host)``, which also selects by SNI but falls back to the CONNECT host.
        """
        return self._configured_context()

    def sni_callback(
        self, ssl_object: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext
    ) -> int | None:
        """``SSLContext.sni_callback``: switch the handshake to the leaf for ``server_name``."""
        if server_name is None:
            return None  # keep the context the connection started with
        try:
            leaf_context = self.get(server_name)
        except CAError as exc:
            log.warning("TLS interception refused SNI %r: %s", server_name, exc)
            return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
        except Exception:
            log.exception("TLS interception failed for SNI %r", server_name)
            return ssl.ALERT_DESCRIPTION_INTERNAL_ERROR
        if leaf_context is not context:
            ssl_object.context = leaf_context
        return None

    def close(self) -> None:
        """Forget every context and remove the leaf key's temp files (or memfd)."""
        self._closed = True
        with self._lock:
            self._entries.clear()
        self._pem.close()

    def __enter__(self) -> LeafContextCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _configured_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.options |= ssl.OP_NO_RENEGOTIATION
        # A client's TCP half-close without close_notify ends its side like close_notify does, not
        # the session: HTTP framing says whether a request is whole, and the answer still goes back
        context.options |= ssl.OP_IGNORE_UNEXPECTED_EOF
        context.set_alpn_protocols(self._alpn)
        context.sni_callback = self.sni_callback
        return context

    def _new_context(self, host: str, now: datetime) -> tuple[ssl.SSLContext, datetime]:
        leaf_pem, not_after = self._ca.mint_leaf_with_expiry(host, now)
        context = self._configured_context()
        with self._pem.temporary(leaf_pem + self._ca.cert_pem()) as chain_path:
            context.load_cert_chain(chain_path, self._pem.key_path)
        return context, now + (not_after - now) / 2
