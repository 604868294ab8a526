"""``run --workers N``: N processes, each with its own event loop, sharing one port (SO_REUSEPORT).

The kernel spreads new connections across the workers' listening sockets. Nothing is shared in
memory: keys and the interception CA live in the data directory (created once, under a lock),
each worker watches the key store itself, and the parent forwards signals — SIGHUP (reload)
and SIGTERM/SIGINT (drain) — restarts a worker that dies, and runs its ``tick`` every ``TICK_S``
(``cli.run``: the revocations no worker it starts may go below). A port of 0 is resolved once by the
parent, which keeps a bound (not listening) SO_REUSEPORT socket on each address for its life, so every
worker gets the same port and no other instance binds it while none listens (``service.ports``).

A SIGHUP also has the parent re-read the configuration (``on_sighup``): a worker it restarts later
starts from the last copy accepted, as its siblings serve, not from the one read at start; whatever
fails there is one line, and the workers are sent the SIGHUP all the same. Until a process's event
loop takes SIGHUP, one is recorded rather than left to its default action (which ends the process
without a line): ``hold_sighup``, ``take_held_sighup``.

The parent counts the stop signals, since it gets each one once: a signal sent to the whole process
group (a terminal's Ctrl-C, systemd stopping the service) reaches every worker directly as well,
so a worker takes SIGTERM/SIGINT only as "drain" however often it comes. A second SIGTERM/SIGINT
to the parent sends the workers ``CUT_SIGNAL`` (their drain is cut short), and the parent then
exits 128 + that second signal's number.

A worker restarted later that cannot serve (a refusal, exit 2, or its key store not loaded, exit 1)
is started again after the back-off while its siblings serve: only a worker of the first start that
exits 2 stops them all (bad input at start-up). It tells the parent why (``tell_parent``, through a
pipe of its own), and the parent says it once per reason, not every second
(``REFUSAL_REPEAT_S``). Two instances on one port never share it: ``service.ports``. What the
parent must know of a worker's build without loading what it loads (private keys, credentials)
runs in a child of its own (``run_check``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Collection, Iterator

from ..logline import exception_kind
from .ports import refuse_shared, reserve_addresses, reserve_port

__all__ = [
    "CUT_SIGNAL",
    "MAX_WORKERS",
    "SIGNALS",
    "hold_sighup",
    "refuse_shared",
    "reserve_addresses",
    "reserve_port",
    "restarted",
    "run_check",
    "run_workers",
    "start_masked",
    "take_held_sighup",
    "tell_parent",
]

log = logging.getLogger("signing_proxy")

MAX_WORKERS = 64
RESTART_BACKOFF_S = 1.0  # a worker that keeps dying is restarted at most once a second
CUT_SIGNAL = signal.SIGUSR1  # to a worker: a second stop signal reached the parent, cut the drain
# what the parent handles: blocked around each fork, and in every thread the parent starts before one
# (a signal is delivered to any thread that has it unblocked, and its handler then runs at once)
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, CUT_SIGNAL)
# our choice: a restart refused for the same reason is said once, then again at most this often
# (with the number of tries since): every second, it filled the log
REFUSAL_REPEAT_S = 300.0
MAX_TOLD_BYTES = 2048  # what the parent reads of a worker's reason: one line, never more
CHECK_LIMIT_S = 10.0  # our choice: how long the parent waits for a check's child (killed after)
TICK_S = 1.0  # our choice: how often the parent runs its ``tick`` (as often as a worker checks its keys)
_CHECK_POLL_S = 0.01


class _Held:
    sighup = False  # a SIGHUP came since hold_sighup()


class _Worker:
    """In a worker: what its parent set up for it at the fork."""

    restarted = False  # started again after one of its index exited (not in the first start)
    told: int | None = None  # the pipe's write end to the parent (tell_parent)


def restarted() -> bool:
    """In a worker: whether the parent started it again after one of its index exited. Its refusal
    is then the parent's to report (``tell_parent``); in the first start it ends the command (exit 2)."""
    return _Worker.restarted


def tell_parent(why: str) -> None:
    """In a worker about to exit without serving: why, for the parent to log (``run_workers``: once
    per reason, as it is started again every second). One line; nothing outside a worker."""
    fd = _Worker.told
    if fd is None:
        return
    line = " ".join(why.split()).encode("utf-8", "backslashreplace")[: MAX_TOLD_BYTES - 1]
    with contextlib.suppress(OSError):  # the parent has gone: nobody to tell
        os.write(fd, line + b"\n")


def _told(fd: int | None) -> str:
    """What a worker that has exited told its parent (its last line), '' if nothing; closes ``fd``."""
    if fd is None:
        return ""
    try:
        os.set_blocking(fd, False)  # a process the worker started may hold the write end still
        data = os.read(fd, MAX_TOLD_BYTES * 2)
    except OSError:
        data = b""
    finally:
        os.close(fd)
    lines = data.decode("utf-8", "backslashreplace").splitlines()
    return lines[-1].strip() if lines else ""


class _Said:
    """Per worker index, the refusal said last, when, and the tries since: a restart refused for the
    same reason is logged once, then every ``REFUSAL_REPEAT_S`` (a worker's exit without a reason
    forgets it: the next refusal is new)."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[str, float, int]] = {}  # index -> (reason, when said, tries since)

    def due(self, index: int, why: str) -> int | None:
        """The tries of ``why`` since it was last said (this one included) when a line is due."""
        now = time.monotonic()
        last = self._last.get(index)
        if last is not None and last[0] == why and 0 <= now - last[1] < REFUSAL_REPEAT_S:
            self._last[index] = (why, last[1], last[2] + 1)
            return None
        self._last[index] = (why, now, 0)
        return 1 if last is None or last[0] != why else last[2] + 1

    def forget(self, index: int) -> None:
        self._last.pop(index, None)


@contextlib.contextmanager
def _signals_blocked() -> Iterator[set[int | signal.Signals]]:
    """``SIGNALS`` blocked inside, the mask before (what the ``with`` gives) put back after. A child
    forked inside never leaves it: ``_fork_child`` ends it through ``os._exit``."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield before
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def start_masked(start: Callable[[], None]) -> None:
    """``start()`` (a thread's start) with ``SIGNALS`` blocked, so the thread never takes the parent's
    signals: one landing there during a fork ran the handler before the child was recorded (a SIGTERM
    the new worker never got, a SIGHUP it never applied)."""
    with _signals_blocked():
        start()


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


def run_workers(
    count: int,
    worker: Callable[[int], int],
    on_sighup: Callable[[], None] | None = None,
    tick: Callable[[], object] | None = None,
) -> int:
    """Fork ``count`` workers running ``worker(index)``; forward signals; return when all have exited.

    ``on_sighup`` runs in the parent on each SIGHUP, before the workers are sent theirs (and once at
    the start when a SIGHUP came before: ``hold_sighup``), so what it reads is there for the workers
    forked after it, and the child a check of it runs in (``run_check``) has ended once they reload;
    what it raises is one line, and they are sent the SIGHUP all the same (``_run_on_sighup``).
    ``tick`` runs in the parent every ``TICK_S`` (never in a signal handler). A worker of the first
    start that exits 2 stops the others (exit 2); any other exit is followed by a restart, after the
    back-off when it comes within ``RESTART_BACKOFF_S`` of the last."""
    children: dict[int, int] = {}  # pid -> worker index
    first: set[int] = set()  # the pids of the first start: exit 2 from one of them ends the command
    told: dict[int, int] = {}  # pid -> the read end of the pipe it tells its parent why through
    pidfds: dict[int, int] = {}  # pid -> its pidfd, readable once it exits: the wait with a tick
    ticked = time.monotonic()
    said = _Said()
    stopping = False
    asked: list[int] = []  # the stop signals the parent got: the first drains, the second cuts
    last_start: dict[int, float] = {}

    def spawn(index: int) -> None:
        again = index in last_start
        now = time.monotonic()
        if now - last_start.get(index, 0.0) < RESTART_BACKOFF_S:
            time.sleep(RESTART_BACKOFF_S)
        last_start[index] = time.monotonic()
        with _signals_blocked():  # none lands before the child is recorded
            if stopping:  # a SIGTERM came during the wait, or just before the block: its children
                return  # were told, a new one would not be
            pid, read_end = _fork_child(lambda: in_worker(index, again))
            children[pid] = index
            told[pid] = read_end
            # without a pidfd (or a tick), it is reaped at the next tick
            if tick is not None and (pidfd := _pidfd(pid)) is not None:
                pidfds[pid] = pidfd
            if not again:
                first.add(pid)

    def in_worker(index: int, again: bool) -> int:
        """In the worker (``_fork_child``): default signal handling; its own loop installs handlers."""
        for sig in (signal.SIGTERM, signal.SIGINT, CUT_SIGNAL):
            signal.signal(sig, signal.SIG_DFL)
        # a SIGHUP forwarded before the worker's loop takes it ended the worker (default action)
        hold_sighup()  # while the signals are still blocked: nothing of the parent's is inherited
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        for fd in (*told.values(), *pidfds.values()):  # its siblings' are not its own
            os.close(fd)
        _Worker.restarted = again
        try:
            return worker(index)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            log.exception("worker %d failed", index)
            return 1

    def wait() -> tuple[int, int]:
        """The next child to exit (pid, status), ``tick`` run every ``TICK_S`` until then."""
        nonlocal ticked
        if tick is None:
            return os.wait()
        while True:
            exited = _wait_exit(-1, pidfds.values(), ticked + TICK_S)  # no pidfd: not before the tick
            if exited is not None:
                return exited
            ticked = time.monotonic()
            try:
                tick()
            except Exception as exc:  # the parent goes on: restarting workers matters more
                log.error("the parent's periodic check failed (%s)", exception_kind(exc))

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
        if sig == signal.SIGHUP and on_sighup is not None:
            _run_on_sighup(on_sighup)  # first: a check it runs in a child is over before the workers reload
        send(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    if take_held_sighup() and on_sighup is not None:  # it came before the handler above: no worker yet
        _run_on_sighup(on_sighup)
    status = 0
    try:
        for index in range(count):
            spawn(index)
        while children:
            try:
                pid, raw = wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            if pid not in children:
                continue
            index = children.pop(pid)
            at_start = pid in first
            first.discard(pid)
            reason = _told(told.pop(pid, None))
            with contextlib.suppress(KeyError):
                os.close(pidfds.pop(pid))
            code = os.waitstatus_to_exitcode(raw)
            if stopping:
                status = status or (code if code > 0 else 0)
                continue
            if code == 2 and at_start:  # bad input (config, key) at start-up: restarting cannot help
                log.error("worker %d refused to start (exit 2); stopping", index)
                stopping = True
                status = 2
                send(signal.SIGTERM)
                continue
            if not reason:
                said.forget(index)
                log.error("worker %d exited unexpectedly (status %d); restarting it", index, code)
            elif (tries := said.due(index, reason)) is not None:
                # a restart refused: what it refuses may be mended (a file put back, a SIGHUP); its
                # siblings serve meanwhile, and the same reason is said once, not every second
                since = f" ({tries} tries since this was last said)" if tries > 1 else ""
                log.error(
                    "worker %d not started (exit %d): %s; trying again every %g s%s",
                    index,
                    code,
                    reason,
                    RESTART_BACKOFF_S,
                    since,
                )
            spawn(index)
    finally:
        for fd in (*told.values(), *pidfds.values()):
            os.close(fd)
    if len(asked) >= 2:
        second = signal.Signals(asked[1])
        log.warning("%s during the drain: drain cut short, the requests still in flight closed", second.name)
        return 128 + int(second)
    return status


def _run_on_sighup(on_sighup: Callable[[], None]) -> None:
    """The parent's ``on_sighup``, whatever it raises logged by its type only (its text may quote the
    file): raised out of the signal handler, it unwound ``run_workers``, the parent exited and every
    worker with it (``_end_with``), and the SIGHUP never reached them."""
    try:
        on_sighup()
    except Exception as exc:
        kind = exception_kind(exc)
        log.error("SIGHUP: the parent's work for restarted workers failed (%s); the workers reload", kind)


def run_check(check: Callable[[], int], limit_s: float = CHECK_LIMIT_S) -> tuple[int | None, str]:
    """``check()``'s exit status and what it told (``tell_parent``), run in a child of its own forked
    as a worker is (the parent's signals blocked around the fork, their defaults in the child, ended
    with its parent): what the parent must know of a worker's build without loading what the build
    loads (private keys, credentials, a token's module). None when it ends on a signal or runs past
    ``limit_s`` (killed then). What it raises exits 1 (``_fork_child``)."""

    def child() -> int:
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        return check()

    with _signals_blocked() as before:
        pid, read_end = _fork_child(child)
    try:
        raw = _exit_status(pid, limit_s)
    finally:
        said = _told(read_end)
    status = None if raw is None else os.waitstatus_to_exitcode(raw)
    return (status if status is not None and status >= 0 else None), said


def _exit_status(pid: int, limit_s: float) -> int | None:
    """Child ``pid``'s wait status once it exits within ``limit_s``; else None, and it is killed. It
    runs in the parent's SIGHUP handler: the wait is bounded, and woken by the child's pidfd as it
    exits (or looked at every ``_CHECK_POLL_S`` where there is none)."""
    deadline = time.monotonic() + limit_s
    pidfd = _pidfd(pid)
    try:
        exited = _wait_exit(pid, () if pidfd is None else (pidfd,), deadline, _CHECK_POLL_S)
        if exited is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        return exited[1]
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _fork_child(run: Callable[[], int]) -> tuple[int, int]:
    """Fork a child that runs ``run()`` and exits with what it returns, always through ``os._exit``
    (its stdout and stderr flushed first): nothing escapes the child into its parent's code (what it
    raises, or a return that is no exit status, exits 1 without a line: ``run`` logs what it logs).
    The child tells its parent through a pipe (``tell_parent``) and ends with it (``_end_with``). In
    the parent: (the child's pid, the pipe's read end), the write end closed; a fork that fails closes
    both ends and raises. The signals are the caller's: it blocks its own."""
    parent = os.getpid()
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        raise
    if not pid:
        code = 1
        try:
            os.close(read_end)
            _Worker.told = write_end
            _end_with(parent)
            code = run()
        finally:
            for stream in (sys.stdout, sys.stderr):  # os._exit skips the interpreter's flush
                with contextlib.suppress(Exception):
                    stream.flush()
            with contextlib.suppress(Exception):  # not an exit status: TypeError, OverflowError
                os._exit(code)
            os._exit(1)
    os.close(write_end)
    return pid, read_end


def _pidfd(pid: int) -> int | None:
    """A pidfd of child ``pid`` (readable once it exits), or None where the system has none."""
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


def _wait_exit(
    pid: int, pidfds: Collection[int], deadline: float, poll_s: float | None = None
) -> tuple[int, int] | None:
    """The child ``pid`` names (as ``os.waitpid`` does: -1 is any) that exits by ``deadline`` (of
    ``time.monotonic``): (its pid, wait status), reaped; else None, the child left as it is. Woken
    as it exits by ``pidfds`` (any one's exit wakes it), without one looked at every ``poll_s``
    (None: at the deadline only). ``ChildProcessError`` when there is no such child."""
    while True:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            return done, raw
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if pidfds:
            exited = select.poll()
            for fd in pidfds:
                exited.register(fd, select.POLLIN)
            exited.poll(left * 1000)
        else:
            time.sleep(left if poll_s is None else min(left, poll_s))


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _end_with(parent: int) -> None:
    """Have the kernel send this worker SIGTERM when its parent dies (it would serve on, on the
    shared port, with the old configuration); a parent already gone ends it now."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # it died between the fork and the prctl
        os.kill(os.getpid(), signal.SIGTERM)
