"""Concurrent uploads: peak RSS of the proxy against limits.max_buffered_bytes + 80 MiB (issue 16).

    .venv/bin/python bench/uploads.py [--uploads 64] [--size-mib 10] [--quick] [--json FILE]

Starts ``signing-proxy run`` on 127.0.0.1, pinned to core 1 when there are two cores, with
``limits.max_buffered_bytes`` at ``--max-buffered-mib`` (default 128, as in config/default.yaml) and
``limits.max_body_bytes`` at the upload size (10 MiB, the default).
This process, on core 0, runs a loopback origin that reads each body slowly (``--origin-mibps``
per connection) and ``--uploads`` clients. The clients each POST ``--size-mib`` MiB through the
proxy at once and read the answer while they write (a 503 may come before the body is sent).

Prints the proxy's RSS when idle and at peak (VmHWM), against the bound ``max_buffered_bytes +
80 MiB``, and how many uploads got 200 (with the origin confirming every byte), how many got 503 with
``Retry-After``, and what else happened. Exits 1 if the peak passed the bound or an upload ended in
anything but 200 or 503 with ``Retry-After``. Bounded by ``--timeout-s`` per upload; stops every
process it started, by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from procs import CORES, pin_self, settle, signing_proxy, status_kib, tracebacks

MIB = 1024 * 1024
HEADROOM_MIB = 80  # issue 16: RSS stays under max_buffered_bytes + 80 MiB
PIECE = 256 * 1024  # what a client writes at a time
ORIGIN_READ = 64 * 1024  # what the origin reads at a time


class SlowOrigin:
    """Reads each request body at ``rate`` bytes/s per connection, then answers how much arrived."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.received: list[int] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            length = next(
                int(line.split(":", 1)[1])
                for line in head.split("\r\n")
                if line.lower().startswith("content-length:")
            )
            start, got = time.monotonic(), 0
            while got < length:
                got += len(await reader.readexactly(min(ORIGIN_READ, length - got)))
                await asyncio.sleep(max(0.0, start + got / self.rate - time.monotonic()))
            self.received.append(got)
            body = json.dumps({"received": got}).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%b" % (len(body), body)
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, StopIteration, ValueError):
            pass
        finally:
            writer.close()


async def upload(port: int, url: str, body: memoryview, timeout_s: float) -> tuple[str, int]:
    """POST ``body`` through the proxy, reading the answer while writing; (outcome, bytes confirmed)."""
    writer: asyncio.StreamWriter | None = None
    answered = asyncio.Event()

    async def write_all(w: asyncio.StreamWriter) -> None:
        host = url.split("/")[2]
        w.write(
            f"POST {url} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        for offset in range(0, len(body), PIECE):
            if answered.is_set():
                return
            w.write(body[offset : offset + PIECE])
            await w.drain()

    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            sending = asyncio.create_task(write_all(writer))
            try:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                answered.set()
                fields = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in head.split("\r\n")[1:] if line)
                }
                content = await reader.readexactly(int(fields.get("content-length", "0")))
            finally:
                answered.set()
                sending.cancel()
                await asyncio.gather(sending, return_exceptions=True)
            status = int(head.split(" ", 2)[1])
            if status == 200:
                return "200", int(json.loads(content)["received"])
            if status == 503:
                return ("503 Retry-After" if "retry-after" in fields else "503 without Retry-After"), 0
            return f"{status} {content[:100]!r}", 0
    except TimeoutError:
        return f"no answer in {timeout_s:g} s", 0
    except (ConnectionError, asyncio.IncompleteReadError):
        return "connection reset", 0
    finally:
        if writer is not None:
            writer.transport.abort()


async def campaign(args: argparse.Namespace, port: int, proxy_pid: int) -> dict[str, object]:
    origin = SlowOrigin(args.origin_mibps * MIB)
    server = await asyncio.start_server(origin.serve, "127.0.0.1", 0, backlog=1024)
    origin_port = server.sockets[0].getsockname()[1]
    body = memoryview(bytes(range(256)) * (args.size_mib * MIB // 256))
    samples: list[int] = []
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            samples.append(status_kib(proxy_pid))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    start = time.monotonic()
    try:
        results = await asyncio.gather(
            *(
                upload(port, f"http://127.0.0.1:{origin_port}/upload/{i}", body, args.timeout_s)
                for i in range(args.uploads)
            )
        )
    finally:
        done.set()
        await sampler
        server.close()
        await server.wait_closed()
    return {
        "elapsed_s": time.monotonic() - start,
        "outcomes": dict(Counter(outcome for outcome, _ in results)),
        "short_uploads": sum(1 for outcome, got in results if outcome == "200" and got != len(body)),
        "rss_sampled_peak_kib": max(samples, default=0),
    }


def run(args: argparse.Namespace) -> int:
    pin_self(0)
    budget = args.max_buffered_mib * MIB
    figures: dict[str, object] = {"machine": f"{CORES} cores, Python {sys.version.split()[0]}"}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        limits = {"max_buffered_bytes": budget, "max_body_bytes": args.size_mib * MIB}  # at least the upload
        config = {"log": {"access_log": False}, "limits": limits}
        with signing_proxy(tmp, config) as (proxy, port, log):
            settle(port, 10)
            figures["rss_idle_kib"] = status_kib(proxy.pid)
            figures.update(asyncio.run(campaign(args, port, proxy.pid)))
            figures["rss_peak_kib"] = status_kib(proxy.pid, "VmHWM")
            figures["alive"] = proxy.poll() is None
            figures["tracebacks"] = len(tracebacks(log))
    return report(args, figures, budget)


def report(args: argparse.Namespace, figures: dict[str, object], budget: int) -> int:
    idle, peak = (int(figures[k]) / 1024 for k in ("rss_idle_kib", "rss_peak_kib"))  # type: ignore[call-overload]
    bound = budget / MIB + HEADROOM_MIB
    outcomes: dict[str, int] = figures["outcomes"]  # type: ignore[assignment]
    unexpected = {k: v for k, v in outcomes.items() if k not in ("200", "503 Retry-After")}
    within = peak <= bound
    print(
        f"\nconcurrent uploads — {figures['machine']}; proxy on core 1, clients + origin on core 0\n"
        f"{args.uploads} uploads of {args.size_mib} MiB at once through the proxy "
        f"(limits.max_buffered_bytes {budget / MIB:g} MiB) to an origin reading {args.origin_mibps:g} MiB/s "
        f"per connection; {float(figures['elapsed_s']):.1f} s"  # type: ignore[arg-type]
    )
    print(f"  200 (origin confirmed every byte): {outcomes.get('200', 0)}")
    print(f"  503 with Retry-After:              {outcomes.get('503 Retry-After', 0)}")
    for name, count in sorted(unexpected.items()):
        print(f"  {name}: {count}")
    if figures["short_uploads"]:
        print(f"  200 with bytes missing at the origin: {figures['short_uploads']}")
    print(
        f"proxy RSS: idle {idle:.1f} MiB, peak {peak:.1f} MiB (sampled every 20 ms: "
        f"{int(figures['rss_sampled_peak_kib']) / 1024:.1f} MiB); bound max_buffered_bytes + "  # type: ignore[call-overload]
        f"{HEADROOM_MIB} MiB = {bound:.0f} MiB: {'ok' if within else 'PASSED THE BOUND'}"
    )
    print(
        f"proxy alive: {'yes' if figures['alive'] else 'NO'}; tracebacks in its log: {figures['tracebacks']}"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({**figures, "bound_mib": bound, "within_bound": within}, indent=2)
        )
    ok = within and not unexpected and not figures["short_uploads"] and figures["alive"]
    return 0 if ok and not figures["tracebacks"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--uploads", type=int, default=64, help="concurrent uploads (default 64)")
    parser.add_argument("--size-mib", type=int, default=10, help="size of each upload (default 10 MiB)")
    parser.add_argument("--max-buffered-mib", type=int, default=128, help="limits.max_buffered_bytes, MiB")
    parser.add_argument("--origin-mibps", type=float, default=4.0, help="origin read rate per connection")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="bound of one upload (default 120)")
    parser.add_argument("--quick", action="store_true", help="8 uploads of 2 MiB, max_buffered_bytes 4 MiB")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args()
    if args.quick:
        args.uploads, args.size_mib, args.max_buffered_mib, args.timeout_s = 8, 2, 4, 60.0
    return run(args)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
