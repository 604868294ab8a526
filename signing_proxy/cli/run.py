"""``signing-proxy run``: the proxy in the foreground, one event loop or ``--workers N``.

Prints one line per listener on start (publication, admin, proxy), drains in-flight requests on
SIGTERM/SIGINT (a second one during the drain ends it at once, exit status 128 + its number), and on
SIGHUP re-reads the key stores and the configuration (a bad one is refused and the running one keeps
serving); a SIGHUP during start-up is applied once the proxy is up. With ``--workers N`` the parent
counts the stop signals (``service.workers``): a worker takes SIGTERM/SIGINT as "drain" however often
it comes, and the parent's ``CUT_SIGNAL`` as "cut". The parent re-reads the configuration on SIGHUP
too, and a worker it restarts serves the last copy accepted, as its siblings do: kept back only when
a restarted worker's build refuses it, tried in a child, as the parent holds no private key nor
credential (``cli.restart_copy``). Every worker loads the key store itself, never below the
revocations the parent read. Status lines and the parent's log lines go through a ``LineWriter``: a
stderr nobody reads drops them, never blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import logging
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import __version__
from ..config import Config, parse_host_port
from ..config.loading import reloading
from ..core.keys import KeyProvider
from ..errors import CliError, Error
from ..logline import exception_kind
from ..proxy.connect import load_interception_ca
from ..proxy.gateway import gateway_upstream
from ..service.app import STDERR_FD, ProxyApp, restart_merge
from ..service.keys import KeyServices, key_provider_for, start_key_services
from ..service.linewriter import LineWriter, route_logging
from ..service.workers import (
    CUT_SIGNAL,
    MAX_WORKERS,
    hold_sighup,
    refuse_shared,
    reserve_addresses,
    reserve_port,
    restarted,
    run_workers,
    start_masked,
    take_held_sighup,
    tell_parent,
)
from ..storage.keystore import StoreWatcher
from ..storage.storewatch import RevocationFloor
from .common import (
    REFUSALS,
    HelpFormatter,
    add_config_flag,
    config_from,
    configure_logging,
    environment_epilog,
    error_line,
    show_host,
)
from .restart_copy import RestartCopy

__all__ = ["add_parsers", "cmd_run"]

log = logging.getLogger("signing_proxy")


def add_parsers(sub: Any) -> None:
    """Add ``run`` to the top-level subcommands."""
    run = sub.add_parser(
        "run",
        help="run the proxy",
        description="Run the signing proxy in the foreground.",
        epilog=environment_epilog(),
        formatter_class=HelpFormatter,
    )
    add_config_flag(run)
    run.add_argument("--listen", metavar="HOST:PORT", help="address to listen on (default 127.0.0.1:8080)")
    run.add_argument(
        "--key",
        metavar="PATH",
        help="signing key: a PKCS#8 PEM or private JWK file (mode 0600), or a pkcs11: URI "
        "(pkcs11:token=...;object=..., module and PIN from signing.pkcs11) (default: signing.key; "
        "unset, the key store in <data_dir>/keys/<agent>/, its first key generated on first run)",
    )
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


def cmd_run(args: argparse.Namespace) -> int:
    hold_sighup()  # until the loop takes it: a SIGHUP during start-up ended the proxy without a line
    config = config_from(args)
    configure_logging(config.log.level, config.log.format)
    _return_large_buffers_to_the_os()
    keys = key_provider_for(config)  # signing.key, else the key store (created on first run)
    workers = getattr(args, "workers", 1)
    if workers < 1:
        raise CliError(f"--workers: must be at least 1, got {workers}")
    if workers > 1 and keys.blocking:  # a PKCS#11 session does not survive fork()
        raise CliError("--workers: a key on a PKCS#11 token serves one process; run one replica per process")
    if workers > 1:
        return _run_workers(config, keys, args, workers)
    _use_uvloop()
    return asyncio.run(_serve(config, keys, lambda: config_from(args)))


MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's initial M_MMAP_THRESHOLD, kept fixed
_M_MMAP_THRESHOLD = -3  # mallopt parameter number (glibc malloc.h)


def _return_large_buffers_to_the_os() -> None:
    """Request bodies are buffered whole (up to 10 MiB each): glibc raises its mmap threshold after the
    first such buffer is freed, and later ones then stay in the heap after use. A fixed threshold gives
    each large buffer back when it is freed (measured: peak RSS of 64 concurrent 10 MiB uploads 217 ->
    192 MiB, `bench/uploads.py`). Nothing happens on another C library."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def _announce(app: ProxyApp, line: str) -> None:
    """One status line on stderr in one write (``print`` wrote the line and its newline apart, and
    the lines of ``--workers`` processes sharing stderr ran together), through the app's writer with
    its log lines: written straight to a stderr nobody reads, it blocked past the signal handlers
    installed just before, and the process never ended on SIGTERM."""
    app.access_writer.write_now(line + "\n")


def _use_uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop  # noqa: PLC0415 (optional extra "fast": the stdlib loop serves without it)

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _run_workers(config: Config, keys: KeyProvider, args: argparse.Namespace, workers: int) -> int:
    """``--workers N``: resolve the port once, create the CA once, then fork N event loops."""
    if not 1 < workers <= MAX_WORKERS:
        raise CliError(f"--workers: must be from 1 to {MAX_WORKERS}")
    addresses = _addresses(config)
    for other in addresses[1:]:  # listen's port 0 is resolved once, below; another's would not be
        if other.port == 0:
            raise CliError(f"{other.name}: with --workers, give a fixed port (every worker binds it)")
    _refuse_shared(addresses)
    given, host = config.listen, addresses[0].host
    reserved, port = _reserve(addresses)
    resolved = f"{show_host(host)}:{port}"
    config = config.with_overrides(listen=resolved)
    if config.intercept.enabled and config.mode != "gateway":  # a gateway has no CA
        load_interception_ca(config)  # created here, once, before the workers load it; CAError
    # a worker loads the store itself (its copy of the parent's is the start-up one: keys revoked
    # since, and when keys.json could not be read at its start, it signed with them), never below
    # the revocations the parent has read (every second: an older keys.json put back is refused);
    # the parent signs nothing and holds no private key
    floor: RevocationFloor | None = None
    if isinstance(keys, StoreWatcher):
        floor = RevocationFloor(keys.store, keys.state().revocations)
        keys.forget_private_keys()

    def reread() -> Config:
        """The configuration as SIGHUP reads it, a ``listen`` unchanged in the file being the port
        resolved here: the file's ``:0`` was reported as a change to ``listen`` on every reload."""
        fresh = config_from(args)
        return fresh.with_overrides(listen=resolved) if fresh.listen == given else fresh

    copy = RestartCopy(config, keys, floor, reread)  # what a worker started after a SIGHUP serves

    # the parent's log lines ("worker 1 exited unexpectedly") through a writer thread, started before
    # the first fork: a stderr nobody reads held the parent in a write, no worker restarted, and
    # SIGTERM never brought it back to wait() for its workers
    writer = LineWriter(STDERR_FD)
    start_masked(writer.start)  # its thread never takes the parent's signals
    unroute = route_logging(logging.getLogger("signing_proxy"), writer)

    def worker(index: int) -> int:
        # the parent's writer has no thread here: stderr directly, until this worker's app routes it
        unroute()
        _use_uvloop()
        if floor is not None and isinstance(keys, StoreWatcher):
            try:
                keys.load_afresh(floor.floor)
            except Error as exc:  # the parent starts it again after the back-off, and says why
                tell_parent(error_line(exc))
                return 1
        try:
            slot = (index, workers)
            serve = _serve(config, keys, reread, reuse_port=True, worker=slot, reloaded=copy.accepted)
            return asyncio.run(serve)
        except REFUSALS as exc:
            if restarted():  # its siblings serve: the parent starts it again, and says why once
                tell_parent(error_line(exc))
            else:
                print(f"signing-proxy: {error_line(exc)}", file=sys.stderr)
            return 2

    try:
        return run_workers(workers, worker, copy.on_sighup, floor.check if floor is not None else None)
    finally:
        for sock in reserved:
            sock.close()
        unroute()
        writer.close()


class _Address(NamedTuple):
    """An address the workers bind: the name of its setting, its value, and the value read."""

    name: str
    listen: str
    host: str
    port: int


def _addresses(config: Config) -> list[_Address]:
    """The addresses the workers bind, each read once: ``listen`` first, then ``publish.listen`` and
    ``admin.listen`` where set."""
    named = (
        ("listen", config.listen),
        ("publish.listen", config.publish.listen),
        ("admin.listen", config.admin.listen),
    )
    return [_Address(name, listen, *parse_host_port(listen, name)) for name, listen in named if listen]


def _refuse_shared(addresses: list[_Address]) -> None:
    """Each address the workers will bind (``_addresses``), once without SO_REUSEPORT: with it, a
    second ``--workers`` instance bound beside the first without an error, and the kernel balanced
    clients between two configurations and key stores (a single process was refused EADDRINUSE)."""
    for name, listen, host, port in addresses:
        try:
            refuse_shared(host, port)
        except OSError as exc:
            raise CliError(
                f"{name}: cannot bind {listen}: {exc.strerror or exc} (another process listens there: "
                "a second --workers instance is refused, not given a share of its port)"
            ) from None


def _reserve(addresses: list[_Address]) -> tuple[list[socket.socket], int]:
    """Each address the workers bind (``_addresses``), held by the parent for its life
    (``service.ports``), and the port of ``listen``, the first (a port of 0 resolved once): with
    ``listen`` alone held, and that so another instance's probe bound beside it, a second instance
    started while no worker of the first listened (starting, or every one restarting) served the
    same ports."""
    held: list[socket.socket] = []
    at = addresses[0]  # the address being bound: named if it fails
    try:
        sock, port = reserve_port(at.host, at.port)
        held.append(sock)
        for at in addresses[1:]:
            held.extend(reserve_addresses(at.host, at.port))
    except OSError as exc:
        for sock in held:
            sock.close()
        raise CliError(f"{at.name}: cannot bind {at.listen}: {exc.strerror or exc}") from None
    return held, port


async def _serve(
    config: Config,
    keys: KeyProvider,
    reread: Callable[[], Config] | None = None,
    *,
    reuse_port: bool = False,
    worker: tuple[int, int] | None = None,
    reloaded: Config | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT. ``worker``: its index and the number of workers. ``reloaded``: a
    worker (re)started after a SIGHUP is built from that configuration, as its siblings run it (what
    applies only at a restart as ``config`` has it: ``restart_merge``), before it serves anything."""
    if reloaded is not None:  # built from it (restart-only parts as at start), never the start-up copy
        try:
            app = ProxyApp(restart_merge(config, reloaded)[0], keys)
        except Error as exc:  # nor the start-up copy instead: what it admits may be revoked since
            # the parent says why (once), and starts it again after the back-off: once a SIGHUP
            # reads a good file, or what it names is there again, it starts
            tell_parent(f"the configuration of the last SIGHUP is refused now: {error_line(exc)}")
            return 1
    else:
        try:
            app = ProxyApp(config, keys)
        except Error as exc:  # a delegation, CA, pinned key or credentials file refused at start-up
            raise CliError(error_line(exc)) from None
    app.reuse_port = reuse_port
    if worker is not None:  # no two workers sign the same base in one second
        app.repeats.spread(*worker)
    try:
        addresses = await app.start()
    except OSError as exc:
        raise CliError(f"listen: cannot bind {config.listen}: {exc.strerror or exc}") from None
    try:
        services = await start_key_services(config, keys, reuse_port=reuse_port)
    except OSError as exc:
        await app.stop()
        reason = exc.strerror or exc
        raise CliError(f"publish.listen: cannot bind {config.publish.listen}: {reason}") from None
    except BaseException:
        await app.stop()
        raise
    # signals first: a supervisor may act on the lines below at once
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    cut_asked: asyncio.Event | None = None
    if worker is not None:  # the parent got a second stop signal: this worker's drain is cut short
        cut = cut_asked = asyncio.Event()

        def on_cut() -> None:
            cut.set()
            stop.set()

        loop.add_signal_handler(CUT_SIGNAL, on_cut)

    def on_sighup() -> None:
        if stop.is_set():  # draining: nothing is reloaded any more
            return
        services.reload()  # key stores, re-read off the loop
        if reread is not None:
            _reload_config(app, reread)

    loop.add_signal_handler(signal.SIGHUP, on_sighup)
    if take_held_sighup():  # one came during start-up (hold_sighup): what was read may predate it
        on_sighup()
    _settle_heap()
    for host, port in services.publish_addresses:
        _announce(app, f"signing-proxy {__version__} publishing on http://{show_host(host)}:{port}")
    key = keys.current(app.clock())
    if app.admin_address is not None:
        host, port = app.admin_address
        _announce(app, f"signing-proxy {__version__} admin on http://{host}:{port}")
    for host, port in addresses:
        # a gateway signs nothing: its line names what it is in front of, not a keyid
        role, after = (
            ("gateway ", f"-> upstream {gateway_upstream(config.gateway)}")
            if config.mode == "gateway"
            else ("", f"keyid={key.thumbprint if key is not None else 'none'}")
        )
        _announce(
            app,
            f"signing-proxy {__version__} {role}listening on http://{show_host(host)}:{port} {after}"
            + (f" worker={worker[0]}" if worker is not None else ""),
        )
    await stop.wait()
    return await _drain(app, services, cut_asked)


async def _drain(app: ProxyApp, services: KeyServices, cut_asked: asyncio.Event | None = None) -> int:
    """The first SIGTERM/SIGINT: let in-flight requests finish for up to ``timeouts.drain_s``, exit
    status 0. A second one while requests are still awaited cuts that wait short
    (``ProxyApp.cut_drain``): they are closed at once, one line says so, and the exit status is
    128 + the signal's number (130 for SIGINT). A worker's (``cut_asked``) is cut by its parent
    only, which counts the signals: SIGTERM/SIGINT reach a worker again from the process group."""
    drain_s = app.config.timeouts.drain_s
    log.info("shutting down: draining in-flight requests for up to %g s", drain_s)
    loop = asyncio.get_running_loop()
    cut: list[int] = []

    def cut_short(number: int, said: str) -> None:
        if not cut and app.cut_drain():
            cut.append(number)
            log.warning("%s", said)

    closing = "closing the requests still in flight"
    if cut_asked is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            said = f"{sig.name} during the drain: drain cut short, {closing}"
            loop.add_signal_handler(sig, cut_short, sig, said)
    else:
        said = f"the parent got a second stop signal: {closing}"
        loop.add_signal_handler(CUT_SIGNAL, cut_short, CUT_SIGNAL, said)
        if cut_asked.is_set():  # it came before the drain began
            cut_short(CUT_SIGNAL, said)
    await services.stop()
    await app.stop(drain_s=drain_s)
    return 128 + int(cut[0]) if cut else 0


def _settle_heap() -> None:
    """Before the first request: what start-up made (modules, configuration, keys; about 40,000
    objects) is collected once and frozen, so no later full collection walks it again (such a pass
    took about 15 ms here: a pause every request in flight would wait out). A young pass then runs
    every ``_YOUNG_PASS_EVERY`` allocations of containers instead of 700 (see there)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(_YOUNG_PASS_EVERY, *gc.get_threshold()[1:])
    _keep_tls_reads_on_the_heap()


# A young pass of the cycle collector walks the young objects still alive, which under load are
# those of the requests in flight: at 64 connections 130 us a pass for plain HTTP, 150 us for
# intercepted HTTPS, about the same at 700 allocations as at 10,000 (a request's objects die by
# reference counting, not by the collector). At Python's 700 the passes cost 0.6 us per plain
# request and 2.1 us per HTTPS request; at 10,000, 0.06 and 0.09 us (issue 21: one proxy under load,
# timed with gc.callbacks). Garbage in cycles waits at most 10,000 allocations.
_YOUNG_PASS_EVERY = 10_000

# glibc mallopt(3) parameters
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_HEAP_MMAP_THRESHOLD = 1024 * 1024  # above uvloop's 256 KiB TLS read buffer
_HEAP_TRIM_THRESHOLD = 4 * 1024 * 1024  # free memory kept at the top of the heap before it is returned


def _keep_tls_reads_on_the_heap() -> bool:
    """uvloop reads each upstream TLS record into a fresh 256 KiB buffer, which glibc's default
    threshold (128 KiB) maps and unmaps: three system calls and fresh zeroed pages per response
    on every intercepted or https request (strace under load: one mmap, mremap and munmap each per
    request). With the thresholds above, such buffers come from the heap and go back to it. False
    where there is no glibc ``mallopt`` (musl, macOS): nothing changes there."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (AttributeError, OSError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _HEAP_MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _HEAP_TRIM_THRESHOLD)
    )


def _reload_config(app: ProxyApp, reread: Callable[[], Config]) -> None:
    """SIGHUP: re-read the configuration; a bad one is refused and the running one keeps serving.

    Whatever fails is one line, never a traceback: an exception that is not ours is named by its type
    only, as its text and a traceback's may quote the file (asyncio printed one, a PIN in it, past the
    log's format). On the serving loop, a path that is not a regular file is refused (``reloading``)."""
    refused = "SIGHUP: new configuration refused, the running one keeps serving"
    try:
        with reloading():
            fresh = reread()
        pending = app.reload(fresh)
    except Error as exc:
        log.error("%s: %s", refused, error_line(exc))
        return
    except Exception as exc:
        log.error("%s: it could not be read or applied (%s)", refused, exception_kind(exc))
        return
    suffix = f"; not applied until restart: {', '.join(pending)}" if pending else ""
    log.info("SIGHUP: configuration reloaded%s", suffix)
