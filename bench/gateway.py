"""Gateway throughput per core, beside http-message-signatures' HTTPMessageVerifier, and the counter
stores' added latency.

    python3 bench/gateway.py [--requests N] [--store-ops N] [--quick] [--json FILE]

Throughput: the same pre-signed requests (one Ed25519 label, Content-Digest over a 200-byte body)
are verified in one process on one core, signature and key directory in cache (the directory is
fetched once, from memory), and timed by CPU time: ``requests per CPU-second`` for

- ``gateway-plain``: ``GatewayVerifier.check`` on a non-exchange request (step 1 only),
- ``gateway-requester``: an exchange call (steps 1 and 2),
- ``gateway-delegated``: an exchange call with a two-link delegation (steps 1 to 3),
- ``pyauth``: ``HTTPMessageVerifier.verify`` of the same plain requests, key known in advance
  (the verification alone: no directory, no window policy beyond its own, no digest check).

Store latency: ``take`` (quota) and ``first_seen`` (replay) on the embedded SQLite store and on a
``redis-server`` started here on loopback (skipped when not installed), wall-clock per operation,
one at a time: p50 and p99 in microseconds. Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from http_message_signatures import HTTPMessageVerifier, MappingKeyResolver, algorithms
from http_message_signatures.signatures import SignatureVerifyWarning

from signing_proxy.core.delegation import extend_chain, issue_authority
from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.gateway_ingest import QuotaCounter
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import Directory, DirectoryKey, render_directory
from signing_proxy.core.requester import DelegationDoc, RequesterDoc
from signing_proxy.core.signatures import Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.verify import (
    DirectoryResolver,
    FetchResult,
    GatewayPolicy,
    GatewayVerifier,
    RequestVerifier,
    RevocationPoller,
    SqliteCounterStore,
)
from signing_proxy.verify.counters import CounterStore
from signing_proxy.verify.issuers import IssuerAnchor, IssuerKeys
from signing_proxy.verify.redis_counters import RedisCounterStore

AGENT = "https://agent.example"
EXCHANGE = "https://exchange.example/v1/svc.v1.ExchangeService/DiscoverResources"
PLAIN = "https://exchange.example/feed"
OWNER = "https://owner.example"


class _Headers:
    def __init__(self, lines: list[tuple[str, str]]) -> None:
        self._lines = lines

    def items(self) -> list[tuple[str, str]]:
        return list(self._lines)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(n for n, _ in self._lines))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(n.lower() == name.lower() for n, _ in self._lines)

    def __getitem__(self, name: str) -> str:
        return ", ".join(v for n, v in self._lines if n.lower() == name.lower())


class _Request:
    def __init__(self, method: str, url: str, lines: list[tuple[str, str]]) -> None:
        self.method, self.url, self.headers = method, url, _Headers(lines)


def sign(key: SigningKey, url: str, body: bytes, created: int) -> Fields:
    fields = Fields(
        [("Content-Digest", content_digest(body)), ("Authorization", ""), ("Signature-Agent", AGENT)]
    )
    attach_signature(
        fields,
        sign_message(
            Message("POST", parse_absolute_uri(url), fields), key, created=created, expires=created + 300
        ),
    )
    return fields


def requester_body(n: int, chain: str | None) -> bytes:
    delegation = None
    if chain is not None:
        delegation = DelegationDoc("corp.example", "alice", time.time() + 600, chain)
    doc = RequesterDoc(f"agent-{n}", "agent.example", "REQUESTER_TYPE_AGENT", delegation=delegation)
    return json.dumps(
        {"ver": "1.0", "uris": ["https://pub.example/a"], "requester": doc.proto_json()}
    ).encode()


def gateway_for(agent: SigningKey, owner: SigningKey) -> GatewayVerifier:
    now = int(time.time())
    served = {
        AGENT + "/.well-known/http-message-signatures-directory": render_directory(
            Directory((DirectoryKey(agent.public, now - 60, now + 86_400),))
        ),
    }

    async def fetch(url: str) -> FetchResult:
        return FetchResult(200, served[url], "max-age=3600")

    resolver = DirectoryResolver(fetch)
    revocations = RevocationPoller(fetch)
    verifier = RequestVerifier(resolver, revocations=revocations)
    issuers = IssuerKeys(
        resolver, revocations, verifier.egress, trusted={OWNER: IssuerAnchor(keys=(owner.public,))}
    )
    return GatewayVerifier(verifier, issuers, None, GatewayPolicy())


def per_cpu_second(count: int, run: Callable[[], None]) -> float:
    started = time.process_time()
    run()
    return count / max(time.process_time() - started, 1e-9)


async def gateway_rates(n: int) -> dict[str, float]:
    agent, owner, principal = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    gateway = gateway_for(agent, owner)
    now = int(time.time())
    authority = issue_authority(
        owner, iss=OWNER, holder_jkt=principal.thumbprint, now=now, scope=["dist:*"], exp=now + 3600
    )
    chain = extend_chain(
        authority, principal, holder_jkt=agent.thumbprint, now=now, scope=["dist:US"], exp=now + 1800
    )
    plain_body = b"x" * 200
    cases: dict[str, list[tuple[str, Fields, bytes]]] = {
        "gateway-plain": [
            (PLAIN, sign(agent, PLAIN, plain_body, now - i % 60), plain_body) for i in range(n)
        ],
        "gateway-requester": [],
        "gateway-delegated": [],
    }
    for i in range(n):
        body = requester_body(i, None)
        cases["gateway-requester"].append((EXCHANGE, sign(agent, EXCHANGE, body, now), body))
        body = requester_body(i, chain)
        cases["gateway-delegated"].append((EXCHANGE, sign(agent, EXCHANGE, body, now), body))
    rates: dict[str, float] = {}
    for name, requests in cases.items():
        url, fields, body = requests[0]
        await gateway.check("POST", url, fields, body)  # directory into the cache

        async def all_of(batch: list[tuple[str, Fields, bytes]]) -> None:
            for url, fields, body in batch:
                await gateway.check("POST", url, fields, body)

        started = time.process_time()
        await all_of(requests)
        rates[name] = n / max(time.process_time() - started, 1e-9)
    await gateway.close()
    pyauth = HTTPMessageVerifier(
        signature_algorithm=algorithms.ED25519,
        key_resolver=MappingKeyResolver(public_keys={agent.thumbprint: agent.public.key}, private_keys={}),
    )
    pyauth.allow_label_only_selection = True
    plain = [(_Request("POST", url, list(fields)), body) for url, fields, body in cases["gateway-plain"]]

    def run_pyauth() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SignatureVerifyWarning)
            for request, body in plain:
                pyauth.verify(request, expect_label="agent", max_age=datetime.timedelta(hours=1), body=body)

    rates["pyauth"] = per_cpu_second(n, run_pyauth)
    return rates


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis(tmp: Path) -> tuple[subprocess.Popen[bytes], str] | None:
    binary = shutil.which("redis-server")
    if binary is None:
        return None
    for _ in range(5):
        port = _free_port()
        args = [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp),
        ]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return proc, f"redis://127.0.0.1:{port}/0"
            except OSError:
                time.sleep(0.02)
        proc.kill()
        proc.wait(10)
    return None


async def latencies(ops: int, operation: Callable[[int], Awaitable[Any]]) -> dict[str, float]:
    samples = []
    for i in range(ops):
        started = time.perf_counter()
        await operation(i)
        samples.append((time.perf_counter() - started) * 1e6)
    samples.sort()
    return {
        "p50_us": round(statistics.median(samples), 1),
        "p99_us": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 1),
    }


async def store_figures(store: CounterStore, ops: int) -> dict[str, dict[str, float]]:
    now = time.time()
    return {
        "take": await latencies(
            ops, lambda i: store.take_all((QuotaCounter(f"chain-{i % 64}", 10**9, 60),), now)
        ),
        "first_seen": await latencies(ops, lambda i: store.first_seen(f"sig-{i}", 60, now)),
    }


async def stores(ops: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = SqliteCounterStore(Path(tmp) / "counters.sqlite3")
        out["sqlite"] = await store_figures(sqlite, ops)
        await sqlite.close()
        started = start_redis(Path(tmp))
        if started is None:
            out["redis"] = "skipped: redis-server not installed"
            return out
        proc, url = started
        try:
            redis = RedisCounterStore.from_url(url)
            out["redis"] = await store_figures(redis, ops)
            await redis.close()
        finally:
            proc.terminate()
            proc.wait(10)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--store-ops", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="a few hundred of each, to see that it runs")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    n, ops = (200, 200) if args.quick else (args.requests, args.store_ops)
    figures: dict[str, Any] = {"requests": n, "store_ops": ops}
    figures["verified_per_cpu_second"] = {k: round(v) for k, v in asyncio.run(gateway_rates(n)).items()}
    figures["store_latency"] = asyncio.run(stores(ops))
    for name, rate in figures["verified_per_cpu_second"].items():
        print(f"{name:20s} {rate:8d} verified requests per CPU-second")
    for store, result in figures["store_latency"].items():
        print(f"{store:8s} {result}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
