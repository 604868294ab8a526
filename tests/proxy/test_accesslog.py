"""The access log (issue 21): the same bytes as the ``logging`` path it replaced, written by a buffered
line writer that keeps order, loses nothing on stop and drops (counted) instead of blocking."""

from __future__ import annotations

import asyncio
import enum
import fcntl
import gc
import io
import json
import logging
import math
import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypedDict

import pytest
import requests

from signing_proxy.cli.common import configure_logging
from signing_proxy.config import Config, parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.metrics import Metrics
from signing_proxy.proxy.accesslog import MAX_PENDING, AccessLog, Pending
from signing_proxy.service.app import ProxyApp
from signing_proxy.service.linewriter import LineWriter, LineWriterHandler, route_logging
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin, wait_for

KEY = SigningKey.generate()


class RequestFields(TypedDict):
    """The keyword arguments of ``AccessLog.request``."""

    client: str
    method: str
    host: str
    status: int | None
    duration_10us: int
    bytes_in: int
    bytes_out: int
    keyid: str | None
    profile: str | None
    outcome: str


REQUEST: RequestFields = {
    "client": "127.0.0.1",
    "method": "POST",
    "host": "origin.example",
    "status": 200,
    "duration_10us": 125,  # written duration_ms=1.25
    "bytes_in": 1024,
    "bytes_out": 17,
    "keyid": None,
    "profile": None,
    "outcome": "unsigned",
}
TUNNEL = {"client": "::1", "host": "h.example:443", "duration_ms": 3.0, "bytes_up": 5, "outcome": None}


# --- the bytes: identical to a logging record formatted by configure_logging -------------------------


@pytest.fixture
def logged() -> Iterator[io.StringIO]:
    """Where ``configure_logging``'s handler writes (instead of stderr); the loggers restored after."""
    root = logging.getLogger("signing_proxy")
    saved = root.handlers[:], root.level, root.propagate
    yield io.StringIO()
    root.handlers[:], root.level, root.propagate = saved


def configure(level: str, fmt: str, stream: io.StringIO) -> None:
    configure_logging(level, fmt)
    handler = logging.getLogger("signing_proxy").handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)


def as_logged(call: RequestFields) -> dict[str, object]:
    """The fields a line carries for ``AccessLog.request(**call)``: the duration in milliseconds."""
    fields: dict[str, object] = {}
    for name, value in call.items():
        if name == "duration_10us":
            fields["duration_ms"] = call["duration_10us"] / 100
        else:
            fields[name] = value
    return fields


def old_line(fmt: str, event: str, fields: dict[str, object]) -> str:
    """The message the access log used to hand to ``logging`` (before issue 21)."""
    if fmt == "json":
        return json.dumps({"event": event, **fields}, separators=(",", ":"))
    if event == "request":
        return " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
    return " ".join([f"event={event}", *(f"{k}={v}" for k, v in fields.items())])


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("now", [1_700_000_000.0, 1_700_000_000.0005, 1_700_000_059.999, 1_700_003_600.5])
def test_lines_are_the_bytes_the_log_formatter_made(
    fmt: str, now: float, logged: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure("info", fmt, logged)
    monkeypatch.setattr(time, "time", lambda: now)
    written: list[str] = []
    access = AccessLog(enabled=True, fmt=fmt, write=written.append)
    access.request(**REQUEST)
    access.event("tunnel", **TUNNEL)
    access.request(**(REQUEST | {"host": 'quote"back\\slash', "keyid": "kid"}))
    access_logger = logging.getLogger("signing_proxy.access")
    access_logger.info(old_line(fmt, "request", as_logged(REQUEST)))
    access_logger.info(old_line(fmt, "tunnel", TUNNEL))
    access_logger.info(
        old_line(fmt, "request", as_logged(REQUEST | {"host": 'quote"back\\slash', "keyid": "kid"}))
    )
    assert "".join(written) == logged.getvalue()


class Kind(enum.IntEnum):
    ONE = 1


class Name(str):
    pass


NUMBERS = (0, -7, 2**70, 0.1, 1e-7, 1e300, -0.0, math.nan, math.inf, -math.inf, True, False, Kind.ONE)
OTHERS = (None, "", "é", "日本", "\x00\x1f\x7f", '"\\/', "\U0001f600", Name("sub"), [1, "a"], {"k": None})


@pytest.mark.parametrize("value", [*NUMBERS, *OTHERS])
def test_json_lines_are_what_json_dumps_writes_for_any_value(value: object) -> None:
    written: list[str] = []
    access = AccessLog(enabled=True, fmt="json", write=written.append)
    access.event("request", a=value, b="x")
    access.event("tunnel", c=value)
    assert written == [
        json.dumps({"event": "request", "a": value, "b": "x"}, separators=(",", ":")) + "\n",
        json.dumps({"event": "tunnel", "c": value}, separators=(",", ":")) + "\n",
    ]


REQUEST_SHAPES: list[RequestFields] = [
    REQUEST,
    {
        **REQUEST,
        "keyid": "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs",
        "profile": "svc",
        "outcome": "signed",
    },
    {**REQUEST, "keyid": "kid", "profile": "web-bot-auth", "outcome": "signed"},
    {**REQUEST, "status": None, "outcome": "aborted"},  # no answer was written
    {**REQUEST, "host": "日本.example", "client": "::1", "method": "GET"},
    {**REQUEST, "host": 'quote"back\\slash\x00', "duration_10us": 30},
    {**REQUEST, "duration_10us": 0, "bytes_in": 2**70, "bytes_out": 0},
    {**REQUEST, "duration_10us": 1_234_500},
    {**REQUEST, "duration_10us": 7},
    {**REQUEST, "duration_10us": 10**15 - 1},  # the last the fast paths write
    {**REQUEST, "duration_10us": 10**16 - 1},  # repr() writes 99999999999999.98: the general path's
    {**REQUEST, "duration_10us": 2**70},  # an exponent
    {**REQUEST, "duration_10us": -1},  # no clock goes back, but were it to: written as it is
    {**REQUEST, "status": Kind.ONE},  # an int subclass: written as json.dumps writes it
    {**REQUEST, "bytes_in": True},
]


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("fields", REQUEST_SHAPES)
def test_the_request_fast_paths_write_what_the_general_writer_writes(
    fmt: str, fields: RequestFields, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``request`` formats the usual shapes with one f-string: byte for byte the general line."""
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.25)
    written: list[str] = []
    access = AccessLog(enabled=True, fmt=fmt, write=written.append)
    access.request(**fields)
    if fmt == "json":
        expected = json.dumps({"event": "request", **as_logged(fields)}, separators=(",", ":"))
    else:
        pairs = " ".join(f"{k}={v}" for k, v in as_logged(fields).items() if v is not None)
        expected = access._prefix(time.time()) + pairs
    assert written == [expected + "\n"]


def durations() -> list[int]:
    """Every duration up to 20 ms, a spread over each magnitude (past the fast paths' too: there a
    shorter decimal can read back as the same float), and the last the fast paths write."""
    spread = random.Random(21)
    return [
        *range(2_000),
        *(spread.randrange(10**k, 10 ** (k + 1)) for k in range(3, 17) for _ in range(300)),
        *range(10**15 - 300, 10**15 + 300),
    ]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_duration_is_written_as_the_float_of_its_milliseconds_was(fmt: str) -> None:
    """The fast paths write hundredths of a millisecond without a float: byte for byte ``repr``."""
    written: list[str] = []
    access = AccessLog(enabled=True, fmt=fmt, write=written.append)
    wanted = durations()
    for duration in wanted:
        access.request(**(REQUEST | {"duration_10us": duration}))
    if fmt == "json":
        got = [line.split('"duration_ms":')[1].split(",")[0] for line in written]
    else:
        got = [line.split(" duration_ms=")[1].split(" ")[0] for line in written]
    assert got == [repr(duration / 100) for duration in wanted]


def test_off_nothing_is_formatted() -> None:
    written: list[str] = []
    access = AccessLog(enabled=False, fmt="text", write=written.append)
    access.request(**REQUEST)
    access.event("tunnel", **TUNNEL)
    assert (written, access.records) == ([], None)


async def test_the_level_decides_at_start_and_at_each_reload(tmp_path: Path) -> None:
    """Above ``info`` no line is written, as when the access logger decided; a reload's level
    counts for its own log, which is made before the level is set."""

    def config(level: str) -> Config:
        return parse_config(
            {"data_dir": str(tmp_path), "intercept": {"enabled": False}, "log": {"level": level}}
        )

    app = ProxyApp(config("warning"), StaticKeyProvider(SigningKey.generate()))
    try:
        assert app.handler.policy.access_log.records is None
        for level, writes in (("info", True), ("error", False), ("debug", True)):
            app.reload(config(level))
            assert (app.handler.policy.access_log.records is not None) is writes, level
    finally:
        await app.stop(drain_s=0)


# --- the writer: order, stop, a sink that never reads ----------------------------------------------


class PipeReader:
    """The read end of a real pipe, drained by a thread into ``data``."""

    def __init__(self) -> None:
        self.fd, self.write_fd = os.pipe()
        self.data = bytearray()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while chunk := os.read(self.fd, 1 << 16):
            self.data += chunk

    def close_writer_and_join(self) -> bytes:
        os.close(self.write_fd)
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive()
        os.close(self.fd)
        return bytes(self.data)


class LoopThread:
    """An event loop on its own thread, so the test thread can wait with ``wait_for``."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the loop and wait for it (a writer's write/wake belong on the loop)."""

        async def run() -> None:
            fn()

        asyncio.run_coroutine_threadsafe(run(), self.loop).result(WAIT_S)

    def aclose(self, writer: LineWriter) -> None:
        asyncio.run_coroutine_threadsafe(writer.aclose(WAIT_S), self.loop).result(WAIT_S)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(WAIT_S)
        self.loop.close()


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    running = LoopThread()
    yield running
    running.stop()


@pytest.mark.parametrize("sink", ["pipe", "file"])
@pytest.mark.parametrize("on_loop", [True, False])
def test_lines_arrive_complete_and_in_order(
    sink: str, on_loop: bool, tmp_path: Path, loop: LoopThread
) -> None:
    lines = [f"line={i} {'x' * (i % 700)} é\n" for i in range(20_000)]
    lines.append("y" * 10_000 + "\n")  # longer than a chunk (PIPE_BUF, 4 KiB on Linux)
    pipe = PipeReader() if sink == "pipe" else None
    fd = pipe.write_fd if pipe else os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT, 0o600)
    writer = LineWriter(fd, max_bytes=64 << 20)  # room for all: this test is about order

    def write_all() -> None:
        writer.start()
        for line in lines:
            writer.write(line)

    if on_loop:  # gathered into blocks (by size here: the loop never idles to fire the timer)
        loop.call(write_all)
        loop.aclose(writer)
    else:  # no loop: each line handed over at once
        write_all()
        writer.close(WAIT_S)
    if pipe is None:
        os.close(fd)
    written = pipe.close_writer_and_join() if pipe else (tmp_path / "log").read_bytes()
    assert written == "".join(lines).encode()
    assert writer.dropped == 0


def test_a_line_goes_out_after_the_interval_and_wake_hands_it_over_at_once(loop: LoopThread) -> None:
    pipe = PipeReader()
    prompt = LineWriter(pipe.write_fd)
    lazy = LineWriter(pipe.write_fd, interval_s=3600.0)  # only wake (SIGHUP's reload) gets it out

    def start_and_write(writer: LineWriter, line: str) -> None:
        writer.start()
        writer.write(line)

    loop.call(lambda: start_and_write(prompt, "soon\n"))
    wait_for(lambda: bytes(pipe.data) == b"soon\n", "the line, after the flush interval")
    loop.call(lambda: start_and_write(lazy, "reload\n"))
    assert lazy.backlog_bytes == len("reload\n")
    loop.call(lazy.wake)
    wait_for(lambda: bytes(pipe.data) == b"soon\nreload\n", "the line after wake()")
    loop.aclose(prompt)
    loop.aclose(lazy)
    pipe.close_writer_and_join()


def test_nothing_queued_is_lost_on_close(loop: LoopThread) -> None:
    pipe = PipeReader()
    writer = LineWriter(pipe.write_fd, interval_s=3600.0)  # nothing would go out before close

    def write_lines() -> None:
        writer.start()
        for i in range(1000):
            writer.write(f"{i}\n")

    loop.call(write_lines)
    loop.aclose(writer)
    unstarted = LineWriter(pipe.write_fd)  # queued, never started: close still writes it
    unstarted.write("last\n")
    unstarted.close(WAIT_S)
    loop.call(lambda: writer.write("after close\n"))  # nothing runs after stop(): counted, not queued
    assert pipe.close_writer_and_join() == "".join(f"{i}\n" for i in range(1000)).encode() + b"last\n"
    assert (writer.dropped, writer.backlog_bytes) == (1, 0)


def test_a_pipe_nobody_reads_drops_lines_with_a_counter_and_never_blocks() -> None:
    read_fd, write_fd = os.pipe()  # the reader never reads: the pipe fills (64 KiB on Linux), then stalls
    capacity = fcntl.fcntl(write_fd, fcntl.F_GETPIPE_SZ)
    writer = LineWriter(write_fd, max_bytes=256 * 1024)
    writer.start()
    metrics = Metrics()
    metrics.callbacks.access_log_dropped = lambda: writer.dropped
    line = "x" * 99 + "\n"
    total = 20_000  # 2 MB: far more than the pipe and the queue hold together

    def produce() -> None:
        for _ in range(total):
            writer.write(line)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    producer.join(WAIT_S)
    assert not producer.is_alive(), "write() blocked on a stalled sink"
    assert writer.dropped > 0
    assert writer.backlog_bytes <= 256 * 1024
    assert f"signing_proxy_access_log_dropped_total {float(writer.dropped)}" in metrics.render().decode()
    writer.close(0.05)  # bounded: the thread is stuck in write(2) and close gives up waiting
    os.close(read_fd)  # the reader goes away: EPIPE ends the stuck write, the rest is counted lost
    assert writer._thread is not None
    writer._thread.join(WAIT_S)
    assert not writer._thread.is_alive()
    os.close(write_fd)
    assert writer.backlog_bytes == 0
    assert total - writer.dropped <= capacity // len(line)  # every line: in the pipe, or counted


# --- deferred formatting: a request records, the writer's flush formats ---------------------------


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_recorded_lines_are_formatted_at_the_flush_with_the_same_bytes_in_order(
    fmt: str, loop: LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipe = PipeReader()
    writer = LineWriter(pipe.write_fd, interval_s=3600.0)  # only wake() flushes
    deferred = AccessLog(enabled=True, fmt=fmt, write=writer.write, later=writer.later)
    at_once: list[str] = []
    reference = AccessLog(enabled=True, fmt=fmt, write=at_once.append)

    def log_both() -> None:
        writer.start()
        for access in (deferred, reference):
            ticks = iter([1_700_000_000.0 + i * 0.37 for i in range(100)])  # the same clock, across seconds
            monkeypatch.setattr(time, "time", lambda: next(ticks))  # noqa: B023 - read before the next loop
            for i, shape in enumerate(REQUEST_SHAPES):
                access.request(**shape)
                if i % 4 == 0:
                    access.event("tunnel", **TUNNEL)

    try:
        loop.call(log_both)
        assert writer.backlog_bytes == 0  # recorded, not yet formatted
        loop.call(writer.wake)  # SIGHUP's reload, or the timer: what was recorded goes out
        wait_for(lambda: bytes(pipe.data) == "".join(at_once).encode(), "the recorded lines, formatted")
    finally:
        loop.aclose(writer)
        pipe.close_writer_and_join()


def test_lines_recorded_before_close_are_written(loop: LoopThread) -> None:
    pipe = PipeReader()
    writer = LineWriter(pipe.write_fd, interval_s=3600.0)  # nothing would go out before close
    access = AccessLog(enabled=True, fmt="json", write=writer.write, later=writer.later)

    def log_both() -> None:
        writer.start()
        access.request(**REQUEST)
        access.event("tunnel", **TUNNEL)

    loop.call(log_both)
    loop.aclose(writer)
    docs = [json.loads(line) for line in pipe.close_writer_and_join().splitlines()]
    assert [doc["event"] for doc in docs] == ["request", "tunnel"]
    assert writer.dropped == 0


def test_past_max_pending_records_are_formatted_at_once() -> None:
    written: list[str] = []
    asked: list[Callable[[], None]] = []  # a writer whose flush never comes
    access = AccessLog(enabled=True, fmt="text", write=written.append, later=asked.append)
    for _ in range(MAX_PENDING - 1):
        access.request(**REQUEST)
    assert (written, len(asked)) == ([], 1)  # held, the flush asked for once
    access.request(**REQUEST)
    assert len(written) == 1  # one block
    assert written[0].count("\n") == MAX_PENDING
    asked[0]()  # the flush that was asked for finds nothing left: idempotent
    assert len(written) == 1


def test_logs_of_successive_reloads_share_one_queue_and_keep_the_order_of_their_lines() -> None:
    """A request in flight across a SIGHUP logs to the log it started with: its line still comes
    out between the lines logged before and after it, each in its own log's format."""
    written: list[str] = []
    asked: list[Callable[[], None]] = []
    shared: Pending = []
    old = AccessLog(enabled=True, fmt="text", write=written.append, later=asked.append, pending=shared)
    new = AccessLog(enabled=True, fmt="json", write=written.append, later=asked.append, pending=shared)
    new.request(**(REQUEST | {"host": "a.example"}))
    old.request(**(REQUEST | {"host": "b.example"}))  # began before the reload, ended after it
    new.event("tunnel", **TUNNEL)
    new.request(**(REQUEST | {"host": "c.example"}))
    assert len(asked) == 1  # one flush asked for, by the first line
    asked[0]()
    [block] = written
    lines = block.splitlines()
    assert [json.loads(lines[i])["host"] for i in (0, 3)] == ["a.example", "c.example"]
    assert " host=b.example " in lines[1]  # the old log's format: text
    assert not lines[1].startswith("{")
    assert json.loads(lines[2])["event"] == "tunnel"
    assert shared == []


def test_a_waiting_record_holds_only_atoms_so_the_collector_lets_it_go_at_its_first_pass() -> None:
    """Records wait up to a flush interval, ~200 of them under load: one that held a tracked object
    (the log itself, as it once did) stayed tracked, was promoted and walked by every later pass."""
    waiting: Pending = []
    for fmt in ("text", "json"):
        access = AccessLog(enabled=True, fmt=fmt, write=lambda _: None, later=lambda _: None, pending=waiting)
        access.request(**REQUEST)
        access.request(**(REQUEST | {"status": None, "keyid": "kid"}))
    assert len(waiting) == 4
    gc.collect(0)
    assert [gc.is_tracked(record) for record in waiting] == [False] * 4


def test_a_line_that_cannot_be_formatted_does_not_take_the_others_with_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    written: list[str] = []
    asked: list[Callable[[], None]] = []
    access = AccessLog(enabled=True, fmt="json", write=written.append, later=asked.append)
    access.request(**REQUEST)
    # bytes where a str belongs, on purpose: the checker would (rightly) refuse it
    not_text: RequestFields = {**REQUEST, "host": b"not text"}  # type: ignore[typeddict-item]
    access.request(**not_text)  # a bug upstream of the log
    access.request(**(REQUEST | {"host": "after.example"}))
    asked[0]()
    assert [json.loads(line)["host"] for line in written[0].splitlines()] == [
        "origin.example",
        "after.example",
    ]
    assert "an access-log line could not be formatted" in caplog.text


def test_a_block_past_the_bound_keeps_the_whole_lines_that_fit() -> None:
    writer = LineWriter(1, max_bytes=100)
    writer.write("".join(f"{i}{'x' * 28}\n" for i in range(5)))  # 5 lines of 30: 3 fit
    assert (writer.backlog_bytes, writer.dropped) == (90, 2)
    writer.write("y\n")
    assert (writer.backlog_bytes, writer.dropped) == (92, 2)


def test_a_failing_producer_does_not_hold_back_the_others(loop: LoopThread) -> None:
    pipe = PipeReader()
    writer = LineWriter(pipe.write_fd, interval_s=3600.0)

    def broken() -> None:
        raise RuntimeError("a bug")

    def start_and_ask() -> None:
        writer.start()
        writer.later(broken)
        writer.later(lambda: writer.write("after\n"))

    loop.call(start_and_ask)
    loop.call(writer.wake)
    wait_for(lambda: bytes(pipe.data) == b"after\n", "the second producer's line")
    loop.aclose(writer)
    pipe.close_writer_and_join()


def test_a_line_asked_for_after_close_is_counted_not_kept(loop: LoopThread) -> None:
    pipe = PipeReader()
    writer = LineWriter(pipe.write_fd)
    loop.call(writer.start)
    loop.aclose(writer)
    produced: list[bool] = []

    def produce() -> None:
        produced.append(True)
        writer.write("late\n")

    loop.call(lambda: writer.later(produce))
    assert (produced, writer.dropped) == ([True], 1)  # called at once, its line counted
    assert pipe.close_writer_and_join() == b""


def test_a_refused_block_counts_each_of_its_lines() -> None:
    writer = LineWriter(1, max_bytes=10)
    writer.write("a line too long for the bound\nand another\n")
    assert writer.dropped == 2


# --- the real process: lines of requests served before SIGTERM are all written --------------------


@pytest.mark.integration
def test_every_request_served_before_sighup_and_sigterm_is_in_the_log(tmp_path: Path) -> None:
    with (
        VerifyingOrigin() as origin,
        ProxyProcess(tmp_path, {"log": {"format": "json"}}, key=KEY) as proxy,
    ):
        origin.trust(KEY)
        assert proxy.proc is not None
        metrics = requests.get(f"{proxy.url}/metrics", timeout=WAIT_S).text
        assert "signing_proxy_access_log_dropped_total 0.0" in metrics
        session = requests.Session()
        for i in range(100):
            if i == 50:  # a reload between requests: nothing queued is lost or reordered
                proxy.proc.send_signal(signal.SIGHUP)
            resp = session.get(origin.url(f"/{i}"), proxies={"http": proxy.url}, timeout=WAIT_S)
            assert resp.status_code == 200
        proxy.proc.send_signal(signal.SIGTERM)  # at once: lines still queued are written on stop
        assert proxy.proc.wait(WAIT_S) == 0
    wait_for(
        lambda: any("configuration reloaded" in line for line in proxy.stderr_lines), "the reload's line"
    )
    paths = [doc for doc in proxy.access_lines() if doc["host"] == "127.0.0.1"]
    assert len(paths) == 100
    assert all(doc["outcome"] == "signed" for doc in paths)


def test_log_records_do_not_block_the_loop_when_stderr_stalls(tmp_path: Path) -> None:
    """stderr a pipe nobody reads once the proxy has started: the access log drops (counted), and
    the log records went straight to the pipe from the event loop, so the first one blocked it:
    SIGTERM's "shutting down" line, and the proxy with it, never ended."""
    key = tmp_path / "agent-key.pem"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, SigningKey.generate().to_pem())
    os.close(fd)
    config = {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "data"), "signing": {"key": str(key)}}
    (tmp_path / "config.yaml").write_text(json.dumps({**config, "timeouts": {"drain_s": 1}}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "signing_proxy", "run", "--config", str(tmp_path / "config.yaml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        port = 0
        while not port:  # read until it listens; from then on nobody reads its stderr
            line = proc.stderr.readline().decode()
            assert line, "the proxy ended before it listened"
            if "listening on http://" in line:
                port = int(line.split("listening on http://")[1].split()[0].rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
            for _ in range(3000):  # ~440 KiB of access lines: far past a pipe's 64 KiB
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = b""
                while not answer.endswith(b"}"):
                    answer += sock.recv(4096)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_records_from_any_thread_reach_the_writer_in_order_and_the_handlers_come_back(
    loop: LoopThread,
) -> None:
    """route_logging swaps a logger's stderr handler for one writing through the LineWriter (a record
    goes to the writing thread at once: from the loop's thread directly, from another through the
    loop), and puts it back."""
    read_end, write_end = os.pipe()
    logger = logging.getLogger("signing_proxy.test-routing")
    original = logging.StreamHandler(os.fdopen(write_end, "w", closefd=False))  # the writer's descriptor
    original.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.handlers[:] = [original]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    writer = LineWriter(write_end, interval_s=3600.0)
    try:
        restores: list[Callable[[], None]] = []

        def start_and_route() -> None:
            writer.start()
            restores.append(route_logging(logger, writer))

        loop.call(start_and_route)
        assert isinstance(logger.handlers[0], LineWriterHandler)
        loop.call(lambda: logger.info("from the loop"))
        worker = threading.Thread(target=logger.warning, args=("from a thread",))
        worker.start()
        worker.join(WAIT_S)
        wanted = b"INFO from the loop\nWARNING from a thread\n"
        read = b""

        def arrived() -> bool:  # written at once: no flush interval waited for (3600 s here)
            nonlocal read
            if select.select([read_end], [], [], 0)[0]:
                read += os.read(read_end, 4096)
            return len(read) >= len(wanted)

        wait_for(arrived, "both records written")
        assert read == wanted
        restores[0]()
        assert logger.handlers == [original]
    finally:
        loop.aclose(writer)
        original.close()
        logger.handlers[:] = []
        os.close(read_end)
        os.close(write_end)
