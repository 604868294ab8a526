"""Load through intercepted CONNECT tunnels: N keep-alive tunnels, each sending requests back to back.

wrk cannot speak CONNECT, so this small generator does: one CONNECT and one TLS handshake per
connection, then keep-alive requests until the duration ends. Prints one JSON line: requests,
requests/s, p50/p99 latency (ms), errors.

    python bench/https_load.py --proxy 127.0.0.1:8080 --target 127.0.0.1:8443 --ca ca.pem
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import ssl
import time


async def tunnel(
    args: argparse.Namespace, ctx: ssl.SSLContext, deadline: float, latencies: list[float], errors: list[str]
) -> None:
    host, port = args.proxy.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"CONNECT {args.target} HTTP/1.1\r\nHost: {args.target}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        errors.append(head.split(b"\r\n", 1)[0].decode())
        return
    await writer.start_tls(ctx, server_hostname=args.target.rsplit(":", 1)[0])
    body = b"x" * args.body
    method = "POST" if args.body else "GET"
    request = (
        f"{method} /bench HTTP/1.1\r\nHost: {args.target}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        writer.write(request)
        response_head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in response_head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        await reader.readexactly(length)
        if not response_head.startswith(b"HTTP/1.1 200"):
            errors.append(response_head.split(b"\r\n", 1)[0].decode())
        latencies.append(time.perf_counter() - started)
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--proxy", required=True, help="HOST:PORT of the proxy")
    parser.add_argument("--target", required=True, help="HOST:PORT of the HTTPS origin (CONNECT target)")
    parser.add_argument("--ca", required=True, help="the proxy's interception CA (PEM)")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--body", type=int, default=1024, help="POST body bytes (0: GET)")
    args = parser.parse_args()
    ctx = ssl.create_default_context(cafile=args.ca)
    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.perf_counter() + args.duration
    started = time.perf_counter()
    await asyncio.gather(*(tunnel(args, ctx, deadline, latencies, errors) for _ in range(args.connections)))
    elapsed = time.perf_counter() - started
    latencies.sort()

    def pct(p: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(len(latencies) * p))] * 1000 if latencies else float("nan")
        )

    print(
        json.dumps(
            {
                "requests": len(latencies),
                "rps": len(latencies) / elapsed,
                "p50_ms": pct(0.5),
                "p99_ms": pct(0.99),
                "errors": len(errors),
                "first_error": errors[0] if errors else None,
            }
        )
    )


if __name__ == "__main__":
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    asyncio.run(main())
