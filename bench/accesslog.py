"""What the access log costs one request: CPU per line, text and JSON, as the proxy writes it.

    python bench/accesslog.py [--lines 200000] [--json FILE]

Runs the proxy's own ``AccessLog`` over the service's ``LineWriter`` into a real file on a running
event loop, waiting for I/O every 64 lines as a busy proxy does between requests (so the
flush timer fires and the writing thread writes blocks as in service). The figure is the whole
process's CPU time (the loop's formatting and the thread's system calls) per line, beside the same
loop with the log off (``enabled: false``: one attribute test per request). Issue 21's target: at
most 3 us per request between ``access_log: true`` and ``false``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import tempfile
import time
from pathlib import Path

from signing_proxy.proxy.accesslog import MAX_PENDING, AccessLog
from signing_proxy.service.linewriter import LineWriter

YIELD_EVERY = 64  # requests between two turns of the loop, about what 64 connections give
WAIT_S = 0.0001  # the loop's wait for sockets between turns; not CPU time, and the same with the log off


async def cost_us(fmt: str | None, lines: int, path: Path) -> float:
    """CPU microseconds per request with the log in ``fmt`` (None: off)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    writer = LineWriter(fd)
    writer.start()
    log = AccessLog(enabled=fmt is not None, fmt=fmt or "text", write=writer.write, later=writer.later)
    started = time.process_time()
    for i in range(lines):
        records = log.records
        if records is not None:  # what the exchange does at the end of a request
            records.append(
                (
                    log.json,
                    time.time(),
                    "127.0.0.1",
                    "POST",
                    "exchange.example",
                    200,
                    round(12.3456 * (i % 7)),  # the duration, in hundredths of a millisecond
                    1024,
                    2,
                    "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs",
                    "svc",
                    "signed",
                )
            )
            waiting = len(records)
            if waiting == 1 or waiting >= MAX_PENDING:
                log.recorded()
        if i % YIELD_EVERY == 0:  # the loop waits for sockets (the GIL is free for the writer)
            await asyncio.sleep(WAIT_S)
    await writer.aclose()
    spent = time.process_time() - started
    os.close(fd)
    if fmt is not None:
        with path.open("rb") as fh:
            written = sum(1 for _ in fh)
        if written != lines or writer.dropped:
            raise SystemExit(f"{fmt}: {written} of {lines} lines written, {writer.dropped} dropped")
    return spent / lines * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args()
    logging.getLogger("signing_proxy.access").setLevel(logging.INFO)  # the default level: info
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "access.log"
        for _ in range(3):  # the best of three: the machine is shared
            for name, fmt in (("off", None), ("text", "text"), ("json", "json")):
                value = asyncio.run(cost_us(fmt, args.lines, path))
                figures[name] = min(figures.get(name, value), value)
    print(f"access log, CPU per request over {args.lines} requests (best of 3), written to a file:")
    for name in ("text", "json"):
        over = figures[name] - figures["off"]
        print(f"  {name:4}: {figures[name]:.2f} us per request; {over:.2f} us over the log off")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
