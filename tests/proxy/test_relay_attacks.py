"""Issue 15 against a relay hop (a real ``ProxyApp`` in relay mode on 127.0.0.1): a stranger's request
cannot make it fetch an internal address, cannot revoke someone else's key, and a directory whose
revocation list cannot be fetched fails closed. Every refused request leaves nothing at the origin."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.service.app import ProxyApp
from tests.harness import WAIT_S, VerifyingOrigin
from tests.verify.strangers import Host, directory_doc, host, revocation_doc, signed

pytestmark = pytest.mark.integration

VICTIM = SigningKey.from_seed(bytes(range(32)))
ATTACKER = SigningKey.from_seed(bytes(range(7, 39)))
RELAY = SigningKey.from_seed(bytes(range(5, 37)))
BODY = b'{"ver":"1.0"}'


@asynccontextmanager
async def relay(tmp_path: Path, **sections: Any) -> AsyncIterator[tuple[int, VerifyingOrigin]]:
    config = parse_config(
        {
            "mode": "relay",
            "listen": "127.0.0.1:0",
            "data_dir": str(tmp_path),
            "signing": {"label": "broker"},
            "log": {"access_log": False},
            **sections,
        }
    )
    app = ProxyApp(config, StaticKeyProvider(RELAY))
    (_, port), *_ = await app.start()
    try:
        with VerifyingOrigin() as origin:
            origin.trust(VICTIM, ATTACKER, RELAY)
            yield port, origin
    finally:
        await app.stop(drain_s=1)


async def send(port: int, origin: VerifyingOrigin, agent: str, key: SigningKey) -> tuple[int, dict[str, Any]]:
    status, _, doc = await exchange(port, origin, agent, key)
    return status, doc


async def exchange(
    port: int, origin: VerifyingOrigin, agent: str, key: SigningKey
) -> tuple[int, str, dict[str, Any]]:
    """One signed request through the relay: status, response head, problem document."""
    url = origin.url("/x")
    fields = signed(agent, key, now=int(time.time()), url=url, body=BODY)
    head = f"POST {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(BODY)}\r\n"
    head += "".join(f"{n}: {v}\r\n" for n, v in fields) + "\r\n"
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
    writer.write(head.encode() + BODY)
    data = await asyncio.wait_for(reader.read(), WAIT_S)
    writer.close()
    await writer.wait_closed()
    answer, _, body = data.partition(b"\r\n\r\n")
    status = int(answer.split(b" ", 2)[1])
    return status, answer.decode("latin-1"), json.loads(body) if body.startswith(b"{") else {}


def publish(found: Host, key: SigningKey, *revoked: str) -> None:
    now = int(time.time())
    found.directory(directory_doc(key, now=now, revocation_url=f"{found.base}/revoked.json"))
    found.serve("/revoked.json", revocation_doc(*revoked, as_of=now))


async def test_relay_forgery_an_internal_server_is_never_reached_without_allow_private(
    tmp_path: Path,
) -> None:
    async with host() as internal, relay(tmp_path) as (port, origin):
        publish(internal, VICTIM)
        for agent in (internal.base, f"{internal.base}/latest/meta-data/iam/security-credentials/role"):
            status, doc = await send(port, origin, f'"{agent}"', VICTIM)
            assert (status, doc.get("reason")) == (401, "signature-agent-refused"), doc
            assert "Connect call failed" not in doc.get("detail", "")
        assert internal.seen == []
        assert origin.arrivals == []


async def test_relay_poisoning_an_attackers_list_naming_the_victim_leaves_the_victim_accepted(
    tmp_path: Path,
) -> None:
    loopback = {"egress": {"allow_private": ["127.0.0.1/32"]}}
    async with host() as victim, host() as attacker, relay(tmp_path, **loopback) as (port, origin):
        publish(victim, VICTIM)
        publish(attacker, ATTACKER, VICTIM.thumbprint)
        status, doc = await send(port, origin, f'"{attacker.base}"', ATTACKER)
        assert status == 200, doc
        assert "/revoked.json" in attacker.seen  # the attacker's list was fetched …
        status, doc = await send(port, origin, f'"{victim.base}"', VICTIM)
        assert status == 200, doc  # … and applies to the attacker's keys only


async def test_relay_revocation_list_never_fetched_fails_closed(tmp_path: Path) -> None:
    loopback = {"egress": {"allow_private": ["127.0.0.1/32"]}}
    async with host() as victim, relay(tmp_path, **loopback) as (port, origin):
        publish(victim, VICTIM)
        victim.serve("/revoked.json", b"", status=503)
        status, doc = await send(port, origin, f'"{victim.base}"', VICTIM)
        assert (status, doc.get("reason")) == (401, "revocation-unavailable"), doc
        assert origin.arrivals == []


async def test_relay_fetches_caused_by_strangers_are_budgeted(tmp_path: Path) -> None:
    # one new directory, then none for a long while: the second stranger's host is never contacted
    sections = {
        "egress": {"allow_private": ["127.0.0.1/32"]},
        "verify": {"fetches_per_s": 0.001, "fetch_burst": 1},
    }
    async with host() as victim, host() as attacker, relay(tmp_path, **sections) as (port, origin):
        publish(victim, VICTIM)
        publish(attacker, ATTACKER)
        status, _, doc = await exchange(port, origin, f'"{victim.base}"', VICTIM)
        assert status == 200, doc
        status, head, doc = await exchange(port, origin, f'"{attacker.base}"', ATTACKER)
        assert (status, doc.get("reason")) == (503, "verifier-busy"), doc
        assert "\r\nRetry-After: 1\r\n" in head
        assert "WWW-Authenticate" not in head  # busy is not a verdict on the signature
        status, head, doc = await exchange(port, origin, f'"{victim.base}"', ATTACKER)  # not its key
        assert status == 401, doc
        assert '\r\nWWW-Authenticate: Signature realm="signing-proxy"\r\n' in head
        assert attacker.seen == []
        status, _, doc = await exchange(port, origin, f'"{victim.base}"', VICTIM)
        assert status == 200, doc  # a known agent is served from the cache
        assert len(origin.arrivals) == 2
