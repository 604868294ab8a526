"""Small writes held to the end of the event loop's pass, so that a pass's writes leave together.

A write on loopback runs the receiving side's TCP input in the writer's system call, and when the
reader sleeps (in ``epoll_wait``, on another core) it wakes it there: in a virtual machine an
inter-processor interrupt, which the writer pays. Through the proxy, the origin and the load
generator sleep between bursts, so a write per request found one of them asleep again and again:
about 11 us of the proxy's CPU per request at 64 connections on the benchmark machine (``perf``:
``sock_def_readable`` under ``tcp_sendmsg``). Held until the pass has handled every request it read
and then sent back to back, the first write of a burst wakes a peer and the rest find it awake.

Each connection owns an :class:`Outbox` for its transport. A small write waits in it until the
callback scheduled with the first one runs: after everything the loop had ready when it was
scheduled. A large write, and whatever must come after the held bytes (a close, a half-close,
handing the transport over), flushes first, so bytes leave in the order they were written. Bytes
still held when the transport is closing are dropped: the peer is gone or being cut off; so are
writes after this outbox closed or half-closed its transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import cast

__all__ = ["CLOSE_DRAIN_S", "HOLD_MAX_BYTES", "Outbox", "close_within"]

HOLD_MAX_BYTES = 64 * 1024  # our choice: a write this large goes at once, and so does a fuller outbox
# our choice: how long a closing transport may take to hand its last bytes to a peer that reads
# nothing before it is aborted (asyncio's close waits for them without end, and the connection's
# place among limits.max_connections with it)
CLOSE_DRAIN_S = 30.0


def close_within(transport: asyncio.Transport, limit_s: float = CLOSE_DRAIN_S) -> None:
    """``transport.close()``, aborted after ``limit_s`` if it still holds bytes the peer has not read."""
    transport.close()
    buffered = getattr(transport, "get_write_buffer_size", None)  # uvloop's are not WriteTransports
    if buffered is not None and buffered():
        asyncio.get_running_loop().call_later(limit_s, transport.abort)  # a no-op once it has closed


class Outbox:
    """The writes to ``transport`` held until the end of the loop's pass (or an explicit ``flush``)."""

    __slots__ = ("_ended", "_held", "_loop", "_size", "transport")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None  # set once connected; None when handed over
        self._held: list[bytes] = []
        self._size = 0
        self._ended = False  # closed or half-closed by us: nothing more is written

    def attach(self, transport: asyncio.BaseTransport) -> None:
        """The connection's transport, as it is made; small writes leave at once (no Nagle delay)."""
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @property
    def held_bytes(self) -> int:
        return self._size

    def write(self, data: bytes) -> None:
        """Hold ``data`` until the pass ends; write it now, after what is held, when it is large."""
        if self._ended:
            return
        size = self._size + len(data)
        if size > HOLD_MAX_BYTES:  # what is held goes first, then this alone: written as it is
            self.flush()
            self._held.append(data)
            self.flush()
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)
        self._size = size

    def flush(self) -> None:
        """Write what is held now (in one call); idempotent."""
        held = self._held
        if not held:
            return
        data = held[0] if len(held) == 1 else b"".join(held)
        held.clear()
        self._size = 0
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self, limit_s: float = CLOSE_DRAIN_S) -> None:
        """Close the transport after what is held (which it still writes out, for ``limit_s`` at most)."""
        self.flush()
        self._ended = True
        if self.transport is not None:
            close_within(self.transport, limit_s)

    def abort(self) -> None:
        """Drop what is held and what the transport still buffers, and close it now (a connection
        given up: nothing of it is owed to the peer, and its buffer is memory no budget counts)."""
        self._held.clear()
        self._size = 0
        self._ended = True
        if self.transport is not None:
            self.transport.abort()

    def write_eof(self) -> None:
        """Half-close after what is held."""
        self.flush()
        self._ended = True
        if self.transport is not None:
            self.transport.write_eof()

    def release(self) -> asyncio.Transport | None:
        """Write what is held and hand the transport over: this outbox writes nothing more."""
        self.flush()
        transport, self.transport = self.transport, None
        return transport
