"""Malformed-input run: 10,000 generated hostile requests against a real proxy on loopback.

    .venv/bin/python bench/malformed.py [--count 10000] [--concurrency 64] [--quick] [--json FILE]

Starts a fast origin (bench/origin.py) and ``signing-proxy run``, both on 127.0.0.1. The proxy is
pinned to core 1 when there are two cores; this script and the origin use core 0. It then sends
``--count`` generated requests, one connection each and ``--concurrency`` connections at a time.
Eight kinds are mixed evenly: broken request lines, broken header fields, broken chunk framing,
oversized heads, TLS garbage after an intercepted CONNECT, random bytes, mutated valid requests, and
a valid request followed by a broken one on the same connection. Each connection is bounded by
``--timeout-s``. Most connections half-close after sending and some are written in small pieces.
Every URI names 127.0.0.1 (or fails to parse), so nothing leaves the machine.

Prints the requests sent, the answers by status, the connections reset, closed unanswered or given
up on, and the proxy's RSS at start (after a warm-up), at peak (VmHWM) and at the end (once its
connections have closed). Also prints whether the proxy's log holds a traceback. Exits 1 if the proxy
died, a traceback appeared, or the RSS at the end is more than 10 MiB above the start (issue 16).
Bounded in count and time; stops every process it started, by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import ssl
import string
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Required, TypedDict

from procs import (
    CORES,
    PY,
    child,
    pin,
    pin_self,
    settle,
    signing_proxy,
    status_kib,
    tracebacks,
    wait_line,
)

RSS_RETURN_MIB = 10.0  # issue 16: RSS back within 10 MiB of where it started
READ_MAX = 256 * 1024  # what a client reads of the answers before it stops
STATUS = re.compile(rb"HTTP/1\.[01] (\d{3}) ")
KINDS = (
    "request-line",
    "header",
    "chunk-framing",
    "oversized-head",
    "connect-tls-garbage",
    "random-bytes",
    "mutated",
    "valid-then-broken",
)
MAX_BODY = 10 * 1024 * 1024  # limits.max_body_bytes (default): declared lengths above it get 413


@dataclass(frozen=True)
class Case:
    """One connection's worth of hostile bytes."""

    kind: str
    pieces: tuple[bytes, ...]
    half_close: bool  # send FIN after the last piece (else the proxy must answer or wait)


@dataclass
class Outcome:
    statuses: list[int]
    end: str  # eof | reset | timeout | refused


class Generator:
    """Deterministic hostile requests from a seed; every URI names 127.0.0.1 or does not parse."""

    def __init__(self, rng: random.Random, origin_port: int, kinds: tuple[str, ...] = KINDS) -> None:
        self.rng = rng
        self.kinds = kinds
        self.auth = f"127.0.0.1:{origin_port}"
        self.base = f"http://{self.auth}"  # never mutated: no generated request names another host
        self.hello = client_hello()
        self.bad_uris = (
            "http://a..b/",
            "http://[zz]/",
            "http://-bad.example/",
            "http://xn--/",
            "http:///x",
            "http://:80/",
            "http://127.0.0.1:99999/",
            "http://127.0.0.1:0/",
            "ftp://127.0.0.1/",
            "http://[::1/",
            "http://127.0.0.1 x/",
            "http://\xff\xfe/",
            "http://127.0.0.1:1/",  # a closed loopback port: 502
            f"https://{self.auth}/",  # TLS to a plain-text origin: 502
            f"http://user:pw@{self.auth}/",
            "*",
            "//x",
            "/no/route",
        )

    def case(self, index: int) -> Case:
        kind = self.kinds[index % len(self.kinds)]
        make: dict[str, Callable[[int], str | bytes]] = {
            "request-line": self.request_line,
            "header": self.header,
            "chunk-framing": self.chunk_framing,
            "oversized-head": self.oversized,
            "connect-tls-garbage": self.connect_garbage,
            "random-bytes": self.random_bytes,
            "mutated": self.mutated,
            "valid-then-broken": self.valid_then_broken,
        }
        data = as_bytes(make[kind](index))
        rng = self.rng
        if len(data) < 4096 and rng.random() < 0.25:  # small pieces: every parser state sees a boundary
            cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 20))))
            pieces = tuple(data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True))
        else:
            pieces = (data,)
        return Case(kind, pieces, half_close=rng.random() < 0.75)

    # --- the kinds ---
    def valid(self, index: int) -> bytes:
        rng = self.rng
        url = f"{self.base}/m/{index}?q={rng.randint(0, 999)}"
        head = f"Host: {self.auth}\r\nUser-Agent: malformed-bench\r\nAccept: */*\r\n"
        shape = rng.randrange(4)
        if shape == 0:
            return f"GET {url} HTTP/1.1\r\n{head}\r\n".encode()
        if shape == 1:
            return f"HEAD {url} HTTP/1.1\r\n{head}\r\n".encode()
        body = rng.randbytes(rng.randint(0, 300))
        if shape == 2:
            return f"POST {url} HTTP/1.1\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
        chunks = b"".join(
            b"%x\r\n%b\r\n" % (len(body[i : i + 50]), body[i : i + 50]) for i in range(0, len(body), 50)
        )
        return (
            f"POST {url} HTTP/1.1\r\n{head}Transfer-Encoding: chunked\r\n\r\n".encode()
            + chunks
            + b"0\r\n\r\n"
        )

    def request_line(self, index: int) -> str | bytes:
        rng, u, a = self.rng, f"{self.base}/m/{index}", self.auth
        token = "".join(rng.choice(string.ascii_uppercase) for _ in range(rng.randint(1, 12)))
        lines = [
            f"GET {u}\r\n\r\n",
            f"GET {u} HTTP/1.1 extra\r\nHost: {a}\r\n\r\n",
            f"GET  {u}  HTTP/1.1\r\nHost: {a}\r\n\r\n",
            f" GET {u} HTTP/1.1\r\n\r\n",
            f"GET {u} HTTP/2.0\r\n\r\n",
            f"GET {u} HTTP/1.12\r\n\r\n",
            f"GET {u} HTTP/0.9\r\n\r\n",
            f"GET {u} HTTX/1.1\r\n\r\n",
            f"GET {u} http/1.1\r\n\r\n",
            f"get {u} HTTP/1.1\r\n\r\n",
            f"GET {u} HTTP/1.1\n\n",
            f"GET {u} HTTP/1.1\rHost: {a}\r\n\r\n",
            f"GET {u}\x00 HTTP/1.1\r\n\r\n",
            f"GET {u}\x7f HTTP/1.1\r\n\r\n",
            f"GET {u}\t HTTP/1.1\r\n\r\n",
            f"G(T {u} HTTP/1.1\r\n\r\n",
            f"{token} {u} HTTP/1.1\r\nHost: {a}\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            f"GET * HTTP/1.1\r\nHost: {a}\r\n\r\n",
            f"OPTIONS * HTTP/1.1\r\nHost: {a}\r\n\r\n",
            f"GET {u}?{'%' * rng.randint(1, 50)}zz HTTP/1.1\r\nHost: {a}\r\n\r\n",
            f"GET {u}/\xff\xfe\x80 HTTP/1.1\r\nHost: {a}\r\n\r\n",
            f"\r\n\r\nGET {u} HTTP/1.1\r\nHost: {a}\r\n\r\n",
            f"GET {rng.choice(self.bad_uris)} HTTP/1.1\r\nHost: x\r\n\r\n",
            f"GET {rng.choice(self.bad_uris)} HTTP/1.1\r\nHost: x\r\n\r\n",
        ]
        return rng.choice(lines)

    def header(self, index: int) -> str | bytes:
        rng, u, a = self.rng, f"{self.base}/m/{index}", self.auth
        fields = [
            "NoColon\r\n\r\n",
            "Name : v\r\n\r\n",
            "X-A: v\r\n folded\r\n\r\n",
            "X-A: a\x00b\r\n\r\n",
            "X-A: a\rb\r\n\r\n",
            "X-A: v\n\r\n",
            ": empty-name\r\n\r\n",
            "X A: v\r\n\r\n",
            "X-\x01: v\r\n\r\n",
            "X-\xff: v\r\n\r\n",
            "X-Obs: caf\xe9\r\n\r\n",
            "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
            "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            "Content-Length: -1\r\n\r\n",
            "Content-Length: abc\r\n\r\n",
            "Content-Length: +5\r\n\r\nhello",
            "Content-Length: 5 5\r\n\r\nhello",
            "Content-Length: 99999999999999999999999\r\n\r\n",
            f"Content-Length: {MAX_BODY + rng.randint(1, 10**9)}\r\n\r\n",
            "Transfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            "Transfer-Encoding: chunked, gzip\r\n\r\n",
            "Transfer-Encoding: xchunked\r\n\r\n",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "Transfer-Encoding:\r\n\r\n",
            "Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
            "Upgrade: websocket, h2c\r\nConnection: Upgrade\r\n\r\n",
            "Expect: 100-continue\r\nContent-Length: 5\r\n\r\n",
            "Expect: bogus\r\nContent-Length: 1\r\n\r\nx",
            "Proxy-Authorization: Basic !!!\r\n\r\n",
            "Host: a\r\nHost: b\r\n\r\n",
            "Connection: close, close, keep-alive, upgrade, x-a\r\nX-A: dropped\r\n\r\n",
            "Content-Digest: sha-256=:AAAA:, sha-256=:BBBB:\r\nContent-Length: 1\r\n\r\nx",
            "Signature: garbage\r\nSignature-Input: x=(\r\n\r\n",
            "Authorization: " + "A" * rng.randint(1, 8000) + "\r\n\r\n",
        ]
        method = rng.choice(["GET", "POST", "PUT"])
        return f"{method} {u} HTTP/1.1\r\nHost: {a}\r\n{rng.choice(fields)}"

    def chunk_framing(self, index: int) -> str | bytes:
        rng = self.rng
        head = (
            f"POST {self.base}/m/{index} HTTP/1.1\r\nHost: {self.auth}\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        bodies = [
            "zz\r\nabc\r\n0\r\n\r\n",
            "3\r\nabcdef\r\n0\r\n\r\n",
            "3\r\nab\r\n0\r\n\r\n",
            "3abc\r\n0\r\n\r\n",
            "3\r\nabc0\r\n\r\n",
            "-3\r\nabc\r\n0\r\n\r\n",
            "ffffffffffffffffffffffff\r\nabc\r\n0\r\n\r\n",
            "3 \r\nabc\r\n0\r\n\r\n",
            "3;\r\nabc\r\n0\r\n\r\n",
            '3;a="unterminated\r\nabc\r\n0\r\n\r\n',
            "3;" + "x" * rng.randint(100, 20000) + "\r\nabc\r\n0\r\n\r\n",
            "3\nabc\n0\n\n",
            "0\r\nX-T: v\r\nbad trailer\r\n\r\n",
            "0\r\nContent-Length: 5\r\nAuthorization: Bearer trailer\r\n\r\n",
            "0\r\n" + "T: v\r\n" * rng.randint(1, 400) + "\r\n",
            "3\r\nabc\r\n",
            f"{MAX_BODY + 1:x}\r\n" + "a" * 1000,
            "0\r\n",
            "\r\n3\r\nabc\r\n0\r\n\r\n",
            "0x3\r\nabc\r\n0\r\n\r\n",
            "1\r\na\r\n" * rng.randint(1, 3000) + "0\r\n\r\n",
            "3\r\nabc\r\n0\r\n\r\nGARBAGE AFTER\r\n\r\n",
        ]
        return head + rng.choice(bodies)

    def oversized(self, index: int) -> str | bytes:
        rng, u = self.rng, f"{self.base}/m/{index}"
        shapes = [
            lambda: f"GET {u}/{'a' * rng.randint(9_000, 40_000)} HTTP/1.1\r\n\r\n",
            lambda: f"GET {u} HTTP/1.1\r\nX-Big: {'a' * rng.randint(66_000, 120_000)}\r\n\r\n",
            lambda: f"GET {u} HTTP/1.1\r\n" + "A: b\r\n" * rng.randint(257, 3000) + "\r\n",
            lambda: f"GET {u} HTTP/1.1\r\n" + "".join(f"X-{n}: {'v' * 400}\r\n" for n in range(200)) + "\r\n",
            lambda: f"GET {u} HTTP/1.1\r\nX-Big: " + "a" * rng.randint(70_000, 150_000),  # never ends
            lambda: "A" * rng.randint(10_000, 70_000) + f" {u} HTTP/1.1\r\n\r\n",
            lambda: f"GET {u} HTTP/1.1\r\n" + "X" * rng.randint(70_000, 100_000) + ": v\r\n\r\n",
        ]
        return rng.choice(shapes)()

    def connect_garbage(self, index: int) -> str | bytes:
        rng, a = self.rng, self.auth
        hello = self.hello
        cut = rng.randrange(1, len(hello))
        garbage = [
            rng.randbytes(rng.randint(1, 4096)),
            b"\x16\x03\x01" + rng.randint(0, 0xFFFF).to_bytes(2, "big") + rng.randbytes(rng.randint(0, 600)),
            b"\x16\x03\x01\x00\x05hello",
            hello[:cut],  # a real ClientHello, cut short
            hello[:cut] + bytes([hello[cut] ^ 0xFF]) + hello[cut + 1 :],  # one byte flipped
            hello + rng.randbytes(rng.randint(1, 2000)),  # then garbage where a handshake record belongs
            f"GET / HTTP/1.1\r\nHost: {a}\r\n\r\n".encode(),  # plain text where TLS belongs
            b"\x80\x2b\x01\x00\x02" + rng.randbytes(40),  # SSLv2-style hello
            b"\x15\x03\x03\x00\x02\x02\x28",  # a fatal alert first
            b"\x17\x03\x03\x40\x00" + rng.randbytes(100),  # application data before any handshake
        ]
        heads = [f"CONNECT {a} HTTP/1.1\r\nHost: {a}\r\n\r\n"] * 6 + [
            "CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n",  # no port
            "CONNECT 127.0.0.1:1 HTTP/1.1\r\n\r\n",  # a port intercept.allowed_ports does not list
            f"CONNECT user:pw@{a} HTTP/1.1\r\n\r\n",
            "CONNECT [::1 HTTP/1.1\r\n\r\n",
            f"CONNECT {a} HTTP/1.1\r\nContent-Length: 5\r\n\r\n",
            f"CONNECT http://{a}/ HTTP/1.1\r\n\r\n",
        ]
        return rng.choice(heads).encode() + rng.choice(garbage)

    def random_bytes(self, index: int) -> str | bytes:
        rng = self.rng
        shapes: list[Callable[[], str | bytes]] = [
            lambda: rng.randbytes(rng.randint(1, 4096)),
            lambda: "".join(rng.choice(string.printable) for _ in range(rng.randint(1, 2000))),
            lambda: f"GET {self.base}/m/{index} HTTP/1.1\r\n".encode() + rng.randbytes(rng.randint(1, 2000)),
            lambda: (
                f"POST {self.base}/m/{index} HTTP/1.1\r\nContent-Length: 10\r\n\r\n".encode()
                + rng.randbytes(rng.randint(10, 2000))
            ),
        ]
        return rng.choice(shapes)()

    def mutated(self, index: int) -> bytes:
        rng = self.rng
        raw = self.valid(index)
        keep = (self.base + "/").encode()  # the authority is never touched: no mutation names a new host
        at = raw.index(keep)
        parts = [bytearray(raw[:at]), bytearray(raw[at + len(keep) :])]
        specials = b'\r\n\x00 :;,\t"\x7f\xff@/?#%'
        for _ in range(rng.randint(1, 8)):
            part = parts[0] if rng.random() < 0.2 else parts[1]
            if not part:
                continue
            pos = rng.randrange(len(part))
            op = rng.randrange(5)
            if op == 0:
                part[pos] = rng.randrange(256)
            elif op == 1:
                part.insert(pos, rng.choice(specials))
            elif op == 2:
                del part[pos]
            elif op == 3:
                end = min(len(part), pos + rng.randint(1, 40))
                part[pos:pos] = part[pos:end] * rng.randint(1, 50)
            else:
                part[pos] = rng.choice(specials)
        return bytes(parts[0]) + keep + bytes(parts[1])

    def valid_then_broken(self, index: int) -> bytes:
        broken = self.rng.choice([self.request_line, self.header, self.chunk_framing])(index)
        return self.valid(index) + (broken.encode("latin-1") if isinstance(broken, str) else broken)


def client_hello() -> bytes:
    """A real TLS ClientHello for 127.0.0.1, from an in-memory handshake that never completes."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def as_bytes(data: str | bytes) -> bytes:
    return data.encode("latin-1") if isinstance(data, str) else data


async def send(case: Case, port: int, timeout_s: float) -> Outcome:
    """One connection: write the case, read answers until EOF (or ``READ_MAX``, or ``timeout_s``)."""
    data = bytearray()
    end = "eof"
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                return Outcome([], "refused")
            with contextlib.suppress(OSError):  # the proxy may answer and close (or reset) mid-write
                for piece in case.pieces:
                    writer.write(piece)
                    await writer.drain()
                if case.half_close and writer.can_write_eof():
                    writer.write_eof()
            while len(data) < READ_MAX:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                data += chunk
    except TimeoutError:
        end = "timeout"
    except OSError:  # ECONNRESET, or ENOTCONN after a reset
        end = "reset"
    finally:
        if writer is not None:
            writer.transport.abort()  # no TIME_WAIT pile-up across 10,000 connections; the proxy sees RST
    return Outcome([int(s) for s in STATUS.findall(bytes(data))], end)


@dataclass
class Tally:
    """What the connections of one run ended with."""

    sent: int = 0
    not_sent: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    kind_statuses: dict[str, Counter[int]] = field(default_factory=lambda: {k: Counter() for k in KINDS})
    ends: Counter[str] = field(default_factory=Counter)
    unanswered: Counter[str] = field(default_factory=Counter)  # connections with no status line, by end


async def run_cases(cases: Iterator[Case], port: int, args: argparse.Namespace, tally: Tally) -> float:
    start = time.monotonic()
    deadline = start + args.time_limit_s

    async def worker() -> None:
        for case in cases:
            if time.monotonic() > deadline:
                tally.not_sent += 1
                continue
            outcome = await send(case, port, args.timeout_s)
            tally.sent += 1
            tally.by_kind[case.kind] += 1
            tally.statuses.update(outcome.statuses)
            tally.kind_statuses[case.kind].update(outcome.statuses)
            tally.ends[outcome.end] += 1
            if not outcome.statuses:
                tally.unanswered[outcome.end] += 1

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    return time.monotonic() - start


class Figures(TypedDict, total=False):
    """What ``run`` measures of the proxy, for ``report``."""

    machine: Required[str]
    rss_start_kib: int
    settle_s: float
    rss_end_kib: int
    rss_peak_kib: int
    log_lines: int


def run(args: argparse.Namespace) -> int:
    pin_self(0)
    figures: Figures = {"machine": f"{CORES} cores, Python {sys.version.split()[0]}"}
    with tempfile.TemporaryDirectory() as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        origin_log = tmp / "origin.log"
        origin = stack.enter_context(child([*pin(0), PY, "bench/origin.py", "--port", "0"], origin_log))
        origin_port = int(wait_line(origin_log, r"origin listening on (\d+)", origin))
        config = {
            "log": {"access_log": False, "level": "info"},
            "intercept": {"allowed_ports": [origin_port]},
        }
        proxy, port, log = stack.enter_context(signing_proxy(tmp, config))
        warm = Generator(random.Random(args.seed + 1), origin_port)
        asyncio.run(run_cases((warm.case(i) for i in range(args.warmup)), port, args, Tally()))
        settle(port, args.settle_s)
        figures["rss_start_kib"] = status_kib(proxy.pid)
        generator = Generator(random.Random(args.seed), origin_port, tuple(args.kinds.split(",")))
        tally = Tally()
        elapsed = asyncio.run(run_cases((generator.case(i) for i in range(args.count)), port, args, tally))
        alive = proxy.poll() is None
        figures["settle_s"] = settle(port, args.settle_s) if alive else float("nan")
        figures["rss_end_kib"] = status_kib(proxy.pid)
        figures["rss_peak_kib"] = status_kib(proxy.pid, "VmHWM")
        alive = alive and proxy.poll() is None
        found = tracebacks(log)
        figures["log_lines"] = len(log.read_text(errors="replace").splitlines())
    return report(args, figures, tally, elapsed, alive, found)


def report(  # noqa: PLR0917
    args: argparse.Namespace,
    figures: Figures,
    tally: Tally,
    elapsed: float,
    alive: bool,
    found: list[str],
) -> int:
    start, peak, end = (
        figures["rss_start_kib"] / 1024,
        figures["rss_peak_kib"] / 1024,
        figures["rss_end_kib"] / 1024,
    )
    back = end - start <= RSS_RETURN_MIB
    print(
        f"\nmalformed input — {figures['machine']}; proxy on core 1, origin + generator on core 0\n"
        f"{tally.sent} generated requests sent (seed {args.seed}), one connection each, "
        f"{args.concurrency} at a time, {args.timeout_s:g} s bound per connection, in {elapsed:.1f} s"
        + (f"; {tally.not_sent} not sent (time limit)" if tally.not_sent else "")
    )
    print("\nanswers by status (a connection may carry two):")
    for status, count in sorted(tally.statuses.items()):
        print(f"  {status}  {count:>6}")
    print(f"  total {sum(tally.statuses.values()):>6}")
    print("\nby kind: sent, then the three most common answers")
    for kind in KINDS:
        top = ", ".join(f"{s} x{n}" for s, n in tally.kind_statuses[kind].most_common(3)) or "-"
        print(f"  {kind:20} {tally.by_kind[kind]:>5}  {top}")
    print(
        f"\nconnections: ended by EOF {tally.ends['eof']}, reset {tally.ends['reset']}, given up after "
        f"{args.timeout_s:g} s {tally.ends['timeout']}, refused {tally.ends['refused']}"
    )
    print(
        "connections with no answer at all: "
        + (", ".join(f"{end} {n}" for end, n in sorted(tally.unanswered.items())) or "none")
        + " (incomplete input, or a complete request whose sender half-closed before the answer)"
    )
    print(
        f"\nproxy RSS: start {start:.1f} MiB, peak {peak:.1f} MiB, end {end:.1f} MiB "
        f"(end - start {end - start:+.1f} MiB; bound +{RSS_RETURN_MIB:g} MiB: {'ok' if back else 'MISSED'}; "
        f"connections closed {figures['settle_s']:.1f} s after the run)"
    )
    print(f"proxy alive at the end: {'yes' if alive else 'NO'}")
    print(f"traceback in the proxy's log ({figures['log_lines']} lines): {'YES' if found else 'no'}")
    for excerpt in found[:3]:
        print("  " + excerpt.replace("\n", "\n  "))
    summary = {
        **figures,
        "sent": tally.sent,
        "not_sent": tally.not_sent,
        "elapsed_s": elapsed,
        "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "by_kind": dict(tally.by_kind),
        "ends": dict(tally.ends),
        "unanswered": dict(tally.unanswered),
        "alive": alive,
        "tracebacks": len(found),
        "rss_back": back,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0 if alive and not found and back else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=10_000, help="generated requests (default 10000)")
    parser.add_argument("--concurrency", type=int, default=64, help="connections at a time (default 64)")
    parser.add_argument("--timeout-s", type=float, default=3.0, help="bound of one connection (default 3)")
    parser.add_argument("--seed", type=int, default=16, help="random seed (default 16)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset of the kinds")
    parser.add_argument("--warmup", type=int, default=400, help="generated requests before RSS is read")
    parser.add_argument("--settle-s", type=float, default=30.0, help="wait for connections to close (max)")
    parser.add_argument("--time-limit-s", type=float, default=900, help="no new request after this long")
    parser.add_argument("--quick", action="store_true", help="500 requests, 16 connections at a time")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args()
    if args.quick:
        args.count, args.concurrency, args.warmup = min(args.count, 500), 16, 100
        args.time_limit_s = min(args.time_limit_s, 120)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
