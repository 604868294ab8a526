"""Signing cost per request in-process: each adapter of ``signing_proxy.client`` beside pyauth's
``HTTPMessageSigner`` (``http-message-signatures``) signing the same request (issue 22).

    .venv/bin/python bench/adapters.py [--requests 2000] [--body-bytes 1024] [--rounds 5] [--quick]
                                       [--json FILE]

The request: ``POST https://origin.example/items?q=1`` with a JSON body of ``--body-bytes``, empty
``Authorization``, ``Signature-Agent``, covering the spec's five components with ``Content-Digest``
computed over the body. Each library's request objects are built before the clock starts; what is
timed is what the adapter (or pyauth's ``sign``) does to one request: the httpx auth flow (sync and
async), the requests auth on a prepared request, the aiohttp middleware (timed from the middleware
before it to the one after it, which stops the request before any connection), ``Signer.sign``
alone (what every adapter shares) and one Ed25519 signature (the floor). Prints microseconds per
request, the best of ``--rounds`` rounds, and each adapter's time as a fraction of pyauth's
(issue 22's target: at most 1/4). No network: nothing is sent.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import requests
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from http_message_signatures import HTTPMessageSigner, MappingKeyResolver, algorithms

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from signing_proxy.client import HttpxAuth, RequestsAuth, Signer, SigningMiddleware
from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider

SEED = b"\x61" * 32
URL = "https://origin.example/items?q=1"
AGENT = "https://agent.example"
FIVE = ("@method", "@target-uri", "content-digest", "authorization", "signature-agent")


def body_of(size: int) -> bytes:
    doc = json.dumps({"pad": ""}).encode()
    return json.dumps({"pad": "x" * max(0, size - len(doc))}).encode()


def headers() -> dict[str, str]:
    return {"Content-Type": "application/json", "Authorization": "", "Signature-Agent": f'"{AGENT}"'}


def per_request_us(run: Callable[[int], float], n: int, rounds: int) -> float:
    """Best of ``rounds``: ``run(n)`` returns the seconds spent on ``n`` requests."""
    return min(run(n) for _ in range(rounds)) / n * 1e6


def bench_ed25519(body: bytes) -> Callable[[int], float]:
    key = Ed25519PrivateKey.from_private_bytes(SEED)
    base = body[:400]  # about a signature base's size

    def run(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            key.sign(base)
        return time.perf_counter() - start

    return run


def bench_core(signer: Signer, body: bytes) -> Callable[[int], float]:
    lines = list(headers().items())

    def run(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            signer.sign("POST", URL, lines, body)
        return time.perf_counter() - start

    return run


def bench_httpx(signer: Signer, body: bytes) -> Callable[[int], float]:
    auth = HttpxAuth(signer)

    def run(n: int) -> float:
        batch = [httpx.Request("POST", URL, content=body, headers=headers()) for _ in range(n)]
        start = time.perf_counter()
        for request in batch:
            flow = auth.sync_auth_flow(request)
            next(flow)
            flow.close()
        return time.perf_counter() - start

    return run


def bench_httpx_async(signer: Signer, body: bytes) -> Callable[[int], float]:
    auth = HttpxAuth(signer)

    async def timed(n: int) -> float:
        batch = [httpx.Request("POST", URL, content=body, headers=headers()) for _ in range(n)]
        start = time.perf_counter()
        for request in batch:
            flow = auth.async_auth_flow(request)
            await flow.__anext__()
            await flow.aclose()
        return time.perf_counter() - start

    return lambda n: asyncio.run(timed(n))


def bench_requests(signer: Signer, body: bytes) -> Callable[[int], float]:
    auth = RequestsAuth(signer)

    def run(n: int) -> float:
        batch = [requests.Request("POST", URL, data=body, headers=headers()).prepare() for _ in range(n)]
        start = time.perf_counter()
        for request in batch:
            auth(request)
        return time.perf_counter() - start

    return run


class _Stop(Exception):
    pass


def bench_aiohttp(signer: Signer, body: bytes) -> Callable[[int], float]:
    signing = SigningMiddleware(signer)

    async def timed(n: int) -> float:
        spent = 0.0
        started = 0.0

        async def before(request: aiohttp.ClientRequest, handler: Any) -> aiohttp.ClientResponse:
            nonlocal started
            started = time.perf_counter()
            response: aiohttp.ClientResponse = await handler(request)
            return response

        async def after(request: aiohttp.ClientRequest, handler: Any) -> aiohttp.ClientResponse:
            nonlocal spent
            spent += time.perf_counter() - started
            raise _Stop  # before any connection is made

        async with aiohttp.ClientSession(middlewares=(before, signing, after)) as session:
            for _ in range(n):
                with contextlib.suppress(_Stop):
                    await session.post(URL, data=body, headers=headers())
        return spent

    return lambda n: asyncio.run(timed(n))


def bench_pyauth(body: bytes) -> Callable[[int], float]:
    key = SigningKey.from_seed(SEED)
    signer = HTTPMessageSigner(
        signature_algorithm=algorithms.ED25519,
        key_resolver=MappingKeyResolver(
            public_keys={}, private_keys={key.thumbprint: Ed25519PrivateKey.from_private_bytes(SEED)}
        ),
    )

    def run(n: int) -> float:
        batch = [requests.Request("POST", URL, data=body, headers=headers()).prepare() for _ in range(n)]
        start = time.perf_counter()
        for request in batch:
            created = time.time()
            signer.sign(
                request,
                key_id=key.thumbprint,
                label="agent",
                created=_utc(created),
                expires=_utc(created + 300),
                covered_component_ids=FIVE,
                body=body,
            )
        return time.perf_counter() - start

    return run


def _utc(ts: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(int(ts), tz=datetime.UTC)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000, help="requests per round")
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="200 requests, 2 rounds: just see it work")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    n, rounds = (200, 2) if args.quick else (args.requests, args.rounds)
    body = body_of(args.body_bytes)
    signer = Signer(
        StaticKeyProvider(SigningKey.from_seed(SEED)), parse_config({"signing": {"signature_agent": AGENT}})
    )
    rows = {
        "pyauth HTTPMessageSigner.sign": bench_pyauth(body),
        "httpx auth (sync flow)": bench_httpx(signer, body),
        "httpx auth (async flow)": bench_httpx_async(signer, body),
        "requests auth": bench_requests(signer, body),
        "aiohttp middleware": bench_aiohttp(signer, body),
        "Signer.sign (shared by all)": bench_core(signer, body),
        "Ed25519 sign alone (floor)": bench_ed25519(body),
    }
    figures = {name: per_request_us(run, n, rounds) for name, run in rows.items()}
    pyauth = figures["pyauth HTTPMessageSigner.sign"]
    print(f"POST {URL}, {len(body)} B JSON body; {n} requests x {rounds} rounds, best round\n")
    print(f"| {'signing':<32} | µs/request | vs pyauth |")
    print(f"|{'-' * 34}|-----------:|----------:|")
    for name, us in figures.items():
        print(f"| {name:<32} | {us:10.1f} | {us / pyauth:9.2f} |")
    adapters = [v for k, v in figures.items() if k.startswith(("httpx", "requests", "aiohttp"))]
    worst = max(adapters) / pyauth
    print(f"\nslowest adapter: {worst:.2f} of pyauth's time (target: at most 0.25)")
    if args.json:
        args.json.write_text(
            json.dumps({"us_per_request": figures, "worst_adapter_vs_pyauth": worst}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
