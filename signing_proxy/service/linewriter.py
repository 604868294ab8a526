"""A buffered line writer: the event loop gathers finished lines, one thread writes them out.

Built for the access log (issue 21). A line costs the event loop one list append; a producer that
formats its lines in batches asks ``later`` to be called back before the next flush or close, so
nothing it holds is left behind. Every
``interval_s`` (at once past ``flush_bytes``) the loop joins what has gathered into one block and
hands it to a thread, the only one to make system calls, so no request waits on the disk or the pipe.
The thread does nothing but write, and wakes once per block: each wake-up takes the GIL from the
event loop, so the thread neither gathers nor formats. When the sink stalls, about ``max_bytes``
wait; later lines are dropped and counted (``dropped``), never blocking anyone. ``aclose``/``close``
write what is queued (bounded in time) and stop the thread; an ``atexit`` hook does the same for a
process that ends without them. It knows nothing of HTTP: lines go to a file descriptor.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import queue
import select
import stat
import threading
from collections.abc import Callable

__all__ = ["CLOSE_WAIT_S", "LineWriter", "LineWriterHandler", "route_logging"]

log = logging.getLogger("signing_proxy.service.linewriter")

# A line is out ~100 ms after it is queued (or sooner, at FLUSH_BYTES). Each flush wakes the thread,
# which takes the GIL from a busy loop: at 12,000 requests/s, 5 ms cost the thread 0.7-0.8 us per
# request and the loop ~3 context switches per flush; 20 ms, 0.3 us. (The access log formats its
# records in batches of its own, ``proxy.accesslog.MAX_PENDING``, whatever the interval.)
FLUSH_INTERVAL_S = 0.1
FLUSH_BYTES = 64 * 1024  # ... or as soon as this much has gathered
MAX_PENDING_BYTES = 1 << 20  # what a stalled sink may hold back: ~4,000 lines of ~250 characters
CLOSE_WAIT_S = 2.0  # how long closing waits for a slow sink before giving up on what is queued
# To a pipe or a socket, one write(2) per chunk of whole lines of at most PIPE_BUF bytes: POSIX keeps
# such a write to a pipe in one piece, so another writer of stderr (the logging handler) never lands
# inside a line. A write to a regular file or a terminal is not split by other writers (Linux holds
# the file position or terminal write lock for the whole call): a block goes out in one call.
CHUNK_BYTES = select.PIPE_BUF


class LineWriter:
    """Lines (each ending in a newline) for file descriptor ``fd``, written in order by one thread.

    ``write`` and ``wake`` run on the event loop's thread (or on one thread, without a loop: each
    line is then handed over at once). ``close`` blocks, bounded; ``aclose`` awaits.
    """

    def __init__(
        self,
        fd: int,
        *,
        interval_s: float = FLUSH_INTERVAL_S,
        flush_bytes: int = FLUSH_BYTES,
        max_bytes: int = MAX_PENDING_BYTES,
    ) -> None:
        self.fd = fd
        self.interval_s = interval_s
        self.flush_bytes = flush_bytes
        self.max_bytes = max_bytes
        self._pending: list[str] = []
        self._producers: list[Callable[[], None]] = []  # asked by later(): called before a flush
        self._size = 0  # characters in _pending
        # each counter has one writer (no lock): the loop, or the thread
        self._handed = 0  # bytes handed to the thread (loop)
        self._written = 0  # bytes the thread is done with, written or lost (thread)
        self._refused = 0  # lines write() dropped: too much waiting, or closed (loop)
        self._lost = 0  # lines the sink refused: EPIPE, ENOSPC... (thread)
        self._blocks: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()  # None: the end
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0  # the thread write() runs on, once started on a loop
        self._timer: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None
        self._chunk: int | None = CHUNK_BYTES  # None: a block in one call
        self._closed = False

    @property
    def dropped(self) -> int:
        """Lines not written: too much was waiting, written after close, or the sink failed."""
        return self._refused + self._lost

    @property
    def backlog_bytes(self) -> int:
        """About how much is queued and not yet written (characters gathered + bytes handed over)."""
        return self._size + self._handed - self._written

    def start(self) -> None:
        """Start the writing thread; flushes are timed on the running event loop, if there is one."""
        if self._thread is not None:
            return
        with contextlib.suppress(RuntimeError):
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
        with contextlib.suppress(OSError):  # unknown: chunked, the safe way
            mode = os.fstat(self.fd).st_mode
            if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
                self._chunk = None
        self._thread = threading.Thread(target=self._run, name="signing-proxy-lines", daemon=True)
        self._thread.start()
        atexit.register(self.close)
        self.wake()

    def write(self, line: str) -> None:
        """Queue ``line`` (one or more whole lines). Past ``max_bytes`` waiting, or after close, the
        lines that do not fit are dropped and counted."""
        waiting = self.backlog_bytes
        if self._closed or waiting + len(line) > self.max_bytes:
            room = 0 if self._closed else max(0, self.max_bytes - waiting)  # encoded, a block may grow
            cut = line.rfind("\n", 0, room) + 1  # the whole lines that fit
            self._refused += line.count("\n", cut) or 1
            if not cut:
                return
            line = line[:cut]
        self._pending.append(line)
        self._size += len(line)
        if self._size >= self.flush_bytes or self._loop is None:
            self.wake()
        elif self._timer is None:
            self._timer = self._loop.call_later(self.interval_s, self.wake)

    def write_now(self, line: str) -> None:
        """``line`` handed to the writing thread at once (a log record: seldom, and awaited by whoever
        reads the log), from any thread: on the loop's thread directly, from another through the loop
        (a thread never touches what the loop gathers)."""
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread:
            self._write_and_wake(line)
            return
        try:
            loop.call_soon_threadsafe(self._write_and_wake, line)
        except RuntimeError:  # the loop has closed: nothing will gather it
            self._lost += line.count("\n") or 1

    def _write_and_wake(self, line: str) -> None:
        self.write(line)
        if not self._closed:
            self.wake()

    def later(self, produce: Callable[[], None]) -> None:
        """Call ``produce`` (which writes lines) at the next flush or close: within ``interval_s``
        from now, like a line written now; without a loop or after close, at once."""
        self._producers.append(produce)
        if self._loop is None or self._closed:
            self._produce()
        elif self._timer is None:
            self._timer = self._loop.call_later(self.interval_s, self.wake)

    def _produce(self) -> None:
        producers, self._producers = self._producers, []
        for produce in producers:
            try:
                produce()
            except Exception:  # a bug in one producer: the others still write, the flush goes on
                log.exception("a producer of lines failed")

    def wake(self) -> None:
        """Hand what has gathered to the thread now (SIGHUP's reload, a size reached, the timer)."""
        self._timer = None  # a timer still armed only flushes early: cheaper than cancelling it
        if self._producers:
            self._produce()
        if not self._pending:
            return
        block = "".join(self._pending).encode("utf-8", "backslashreplace")
        self._pending.clear()
        self._size = 0
        self._handed += len(block)
        self._blocks.put(block)

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Write what is queued (waiting up to ``timeout_s``) and stop the thread; idempotent."""
        if self._closed:
            return
        self._seal()
        self._stop(timeout_s)

    async def aclose(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """``close`` for the event loop: later lines are refused at once, the wait runs off the loop."""
        if self._closed:
            return
        self._seal()
        await asyncio.to_thread(self._stop, timeout_s)

    def _seal(self) -> None:
        self._produce()  # what the producers hold is written before the door shuts
        self._closed = True  # write() refuses from here on: nothing touches _pending after wake()
        self.wake()

    def _stop(self, timeout_s: float) -> None:
        if self._thread is None:
            if not self._handed:
                return
            self.start()  # lines queued before start() are still written
        assert self._thread is not None
        self._blocks.put(None)
        self._thread.join(timeout_s)
        atexit.unregister(self.close)

    def _run(self) -> None:
        get = self._blocks.get
        while (block := get()) is not None:
            self._lost += self._write_out(block)
            self._written += len(block)

    def _write_out(self, data: bytes) -> int:
        """Write ``data`` (whole lines), in chunks ending at a line; return how many lines were lost."""
        view = memoryview(data)
        pos, end, chunk = 0, len(data), self._chunk
        while pos < end:
            stop = end
            if chunk is not None and end - pos > chunk:
                stop = data.rfind(b"\n", pos, pos + chunk) + 1
                if stop <= pos:  # one line longer than a chunk: written alone
                    stop = data.find(b"\n", pos + chunk) + 1 or end
            try:
                while pos < stop:
                    pos += os.write(self.fd, view[pos:stop])
            except OSError:  # EPIPE, EBADF, ENOSPC: the rest of this block is lost, and counted
                return data.count(b"\n", pos) or 1
        return 0


class LineWriterHandler(logging.Handler):
    """A ``logging`` handler writing each record, formatted, through a ``LineWriter``: a sink that
    stalls drops lines (counted) and never blocks the thread that logs, the event loop's above all."""

    def __init__(self, writer: LineWriter, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.writer.write_now(self.format(record) + "\n")
        except Exception:  # as logging.StreamHandler does: a record that cannot be written is reported
            self.handleError(record)


def route_logging(logger: logging.Logger, writer: LineWriter) -> Callable[[], None]:
    """Send what ``logger``'s stream handlers write to ``writer``'s file descriptor through it (with
    their formatters and levels); return what puts them back. A record written straight to a pipe
    nobody reads blocked the event loop at the first log line, and SIGTERM with it."""
    saved = logger.handlers[:]
    routed = [_routed(handler, writer) for handler in saved]
    logger.handlers[:] = routed

    def restore() -> None:
        if logger.handlers == routed:  # unless someone (another app in this process) set others since
            logger.handlers[:] = saved

    return restore


def _routed(handler: logging.Handler, writer: LineWriter) -> logging.Handler:
    stream = getattr(handler, "stream", None)
    if type(handler) is not logging.StreamHandler or stream is None:
        return handler
    try:
        if stream.fileno() != writer.fd:
            return handler
    except (OSError, ValueError):  # no file descriptor (a test's StringIO): left as it is
        return handler
    routed = LineWriterHandler(writer, handler.level)
    routed.setFormatter(handler.formatter)
    return routed
