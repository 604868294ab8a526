"""``run --workers N``: N processes, each with its own event loop, sharing one port (SO_REUSEPORT).

The kernel spreads new connections across the workers' listening sockets. Nothing is shared in
memory: keys and the interception CA live in the data directory (created once, under a lock),
each worker watches the key store itself, and the parent only forwards signals — SIGHUP (reload)
and SIGTERM/SIGINT (drain) — and restarts a worker that dies. A port of 0 is resolved once by the
parent, which keeps a bound (not listening) SO_REUSEPORT socket on it so every worker gets the same.

A SIGHUP also has the parent re-read the configuration (``on_sighup``): a worker it restarts later
starts from the last copy accepted, as its siblings serve, not from the one read at start. Until a
process's event loop takes SIGHUP, one is recorded rather than left to its default action (which
ends the process without a line): ``hold_sighup``, ``take_held_sighup``.

The parent counts the stop signals, since it gets each one once: a signal sent to the whole process
group (a terminal's Ctrl-C, systemd stopping the service) reaches every worker directly as well,
so a worker takes SIGTERM/SIGINT only as "drain" however often it comes. A second SIGTERM/SIGINT
to the parent sends the workers ``CUT_SIGNAL`` (their drain is cut short), and the parent then
exits 128 + that second signal's number.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable

__all__ = [
    "CUT_SIGNAL",
    "MAX_WORKERS",
    "SIGNALS",
    "hold_sighup",
    "reserve_port",
    "run_workers",
    "start_masked",
    "take_held_sighup",
]

log = logging.getLogger("signing_proxy")

MAX_WORKERS = 64
RESTART_BACKOFF_S = 1.0  # a worker that keeps dying is restarted at most once a second
CUT_SIGNAL = signal.SIGUSR1  # to a worker: a second stop signal reached the parent, cut the drain
# what the parent handles: blocked around each fork, and in every thread the parent starts before one
# (a signal is delivered to any thread that has it unblocked, and its handler then runs at once)
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, CUT_SIGNAL)


class _Held:
    sighup = False  # a SIGHUP came since hold_sighup()


def start_masked(start: Callable[[], None]) -> None:
    """``start()`` (a thread's start) with ``SIGNALS`` blocked, so the thread never takes the parent's
    signals: one landing there during a fork ran the handler before the child was recorded (a SIGTERM
    the new worker never got, a SIGHUP it never applied)."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def hold_sighup() -> None:
    """Until the event loop installs its own handler, a SIGHUP is recorded instead of ending the
    process (its default action, without a line): a supervisor's reload during start-up, or the
    parent's SIGHUP forwarded to a worker it has just forked. The loop applies it once it takes
    SIGHUP (``take_held_sighup``): the configuration read at start may predate the edit it announced.
    Holding again keeps one already held (the entry point holds before ``run`` does: ``cli.launch``)."""
    if signal.getsignal(signal.SIGHUP) is not _record_sighup:
        _Held.sighup = False
        signal.signal(signal.SIGHUP, _record_sighup)


def _record_sighup(_sig: int, _frame: object) -> None:
    _Held.sighup = True


def take_held_sighup() -> bool:
    """Whether a SIGHUP came since ``hold_sighup`` (forgotten once asked)."""
    held, _Held.sighup = _Held.sighup, False
    return held


def reserve_port(host: str, port: int) -> tuple[socket.socket, int]:
    """Bind (without listening) a SO_REUSEPORT socket; workers bind the same port beside it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock, int(sock.getsockname()[1])


def run_workers(count: int, worker: Callable[[int], int], on_sighup: Callable[[], None] | None = None) -> int:
    """Fork ``count`` workers running ``worker(index)``; forward signals; return when all have exited.

    ``on_sighup`` runs in the parent on each SIGHUP, once the workers were sent theirs (and once at
    the start when a SIGHUP came before: ``hold_sighup``), so what it reads is there for the workers
    forked after it."""
    children: dict[int, int] = {}  # pid -> worker index
    stopping = False
    asked: list[int] = []  # the stop signals the parent got: the first drains, the second cuts
    last_start: dict[int, float] = {}

    parent = os.getpid()

    def spawn(index: int) -> None:
        now = time.monotonic()
        if now - last_start.get(index, 0.0) < RESTART_BACKOFF_S:
            time.sleep(RESTART_BACKOFF_S)
        last_start[index] = time.monotonic()
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)  # none lands before the child is recorded
        if stopping:  # a SIGTERM came during the wait, or just before the block: its children were
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)  # told, a new one would not be
            return
        try:
            pid = os.fork()
        except OSError:  # no child: the parent takes its signals again
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
            raise
        if pid:
            children[pid] = index
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        else:  # the worker: default signal handling; its own loop installs handlers
            for sig in (signal.SIGTERM, signal.SIGINT, CUT_SIGNAL):
                signal.signal(sig, signal.SIG_DFL)
            # a SIGHUP forwarded before the worker's loop takes it ended the worker (default action)
            hold_sighup()  # while the signals are still blocked: nothing of the parent's is inherited
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
            _end_with(parent)
            code = 1
            try:
                code = worker(index)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                log.exception("worker %d failed", index)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)

    def send(sig: int) -> None:
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def forward(sig: int, _frame: object) -> None:
        nonlocal stopping
        if sig in (signal.SIGTERM, signal.SIGINT):
            stopping = True
            asked.append(sig)
            if len(asked) >= 2:
                sig = CUT_SIGNAL  # a worker takes any number of SIGTERM/SIGINT as "drain"
        send(sig)
        if sig == signal.SIGHUP and on_sighup is not None:
            on_sighup()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    if take_held_sighup() and on_sighup is not None:  # it came before the handler above: no worker yet
        on_sighup()
    for index in range(count):
        spawn(index)
    status = 0
    while children:
        try:
            pid, raw = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid not in children:
            continue
        index = children.pop(pid)
        code = os.waitstatus_to_exitcode(raw)
        if stopping:
            status = status or (code if code > 0 else 0)
            continue
        if code == 2:  # bad input (config, key): restarting cannot help
            log.error("worker %d refused to start (exit 2); stopping", index)
            stopping = True
            status = 2
            send(signal.SIGTERM)
            continue
        log.error("worker %d exited unexpectedly (status %d); restarting it", index, code)
        spawn(index)
    if len(asked) >= 2:
        second = signal.Signals(asked[1])
        log.warning("%s during the drain: drain cut short, the requests still in flight closed", second.name)
        return 128 + int(second)
    return status


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _end_with(parent: int) -> None:
    """Have the kernel send this worker SIGTERM when its parent dies (it would serve on, on the
    shared port, with the old configuration); a parent already gone ends it now."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # it died between the fork and the prctl
        os.kill(os.getpid(), signal.SIGTERM)
