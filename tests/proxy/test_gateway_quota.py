"""Quota and replay across real processes: a delegation with ``max_accesses: 3`` lets exactly 3 of 10
concurrent requests through in total — two gateways sharing one redis-server, or one gateway with
``--workers 2`` on the embedded SQLite store — and 3 more once the period has passed. Replay: the
same signed request sent twice is accepted once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from signing_proxy.core.delegation import extend_chain, issue_authority
from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.signatures import Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from tests.harness import WAIT_S, ProxyProcess
from tests.proxy.gateway_backend import DISCOVER, OWNER_ISS, Backend, exchange_body, issuer_key
from tests.proxy.test_gateway_e2e import hop, signing_key
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

LIMIT = 3
PERIOD_S = 5  # long enough for a burst of 10 to fall in one window on a busy machine
BURST = 10


def gateway(backend: Backend, store: str, **extra: Any) -> dict[str, Any]:
    return {
        "mode": "gateway",
        "log": {"format": "json", "access_log": False},
        "egress": {"allow_private": ["127.0.0.1/32"]},
        "gateway": {
            "upstream": backend.url,
            "trusted_issuers": {OWNER_ISS: {"directory": backend.issuer_directory}},
            "store": store,
            **extra,
        },
    }


def capped_chain(owner: SigningKey, holder: str) -> str:
    principal = SigningKey.generate()
    now = int(time.time())
    authority = issue_authority(
        owner,
        iss=OWNER_ISS,
        holder_jkt=principal.thumbprint,
        now=now,
        exp=now + 600,
        max_accesses=LIMIT,
        quota_period_s=PERIOD_S,
    )
    return extend_chain(
        authority,
        principal,
        holder_jkt=holder,
        now=now,
        exp=now + 300,
        max_accesses=LIMIT,
        quota_period_s=PERIOD_S,
    )


def burst(agent: ProxyProcess, gateways: list[ProxyProcess], body: bytes) -> list[requests.Response]:
    def post(i: int) -> requests.Response:
        url = gateways[i % len(gateways)].url + DISCOVER
        return requests.post(url, data=body, proxies={"http": agent.url}, timeout=WAIT_S)

    with ThreadPoolExecutor(BURST) as pool:
        return list(pool.map(post, range(BURST)))


def check_quota(agent: ProxyProcess, gateways: list[ProxyProcess], owner: SigningKey) -> None:
    for gw in gateways:  # directories cached before the burst: the burst fits in one window
        assert requests.get(gw.url + "/warm", proxies={"http": agent.url}, timeout=WAIT_S).status_code == 200
    chain = capped_chain(owner, signing_key(agent.tmp / "data").thumbprint)
    body = exchange_body(chain, expires_at=time.time() + 200)  # the mirror no later than the exp
    first = burst(agent, gateways, body)
    assert sorted(r.status_code for r in first) == [200] * LIMIT + [429] * (BURST - LIMIT), first[0].text
    refusals = [r for r in first if r.status_code == 429]
    assert {r.json()["reason"] for r in refusals} == {"DENIAL_REASON_QUOTA_EXCEEDED"}
    waits = [int(r.headers["Retry-After"]) for r in refusals]
    assert all(1 <= w <= PERIOD_S for w in waits)
    remaining = sorted(int(r.json()["verified"]["x-verified-remaining-accesses"]) for r in first if r.ok)
    assert remaining == list(range(LIMIT))
    time.sleep(max(waits))  # the gateway's own Retry-After: the window has ended after it
    second = burst(agent, gateways, body)
    assert sorted(r.status_code for r in second) == [200] * LIMIT + [429] * (BURST - LIMIT)


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[tuple[Backend, SigningKey, ProxyProcess]]:
    owner = SigningKey.generate()
    with Backend() as backend:
        backend.directories["issuer"] = [issuer_key(owner)]
        with ProxyProcess(tmp_path / "agent", hop(tmp_path / "agent", mode="agent", label="agent")) as agent:
            yield backend, owner, agent


def test_two_gateways_share_one_redis_server(
    tmp_path: Path, parts: tuple[Backend, SigningKey, ProxyProcess]
) -> None:
    backend, owner, agent = parts
    (tmp_path / "g1").mkdir()
    (tmp_path / "g2").mkdir()
    with (
        RedisServer(tmp_path) as redis_server,
        ProxyProcess(tmp_path / "g1", gateway(backend, redis_server.url)) as g1,
        ProxyProcess(tmp_path / "g2", gateway(backend, redis_server.url)) as g2,
    ):
        check_quota(agent, [g1, g2], owner)


def test_embedded_store_with_two_workers(
    tmp_path: Path, parts: tuple[Backend, SigningKey, ProxyProcess]
) -> None:
    backend, owner, agent = parts
    (tmp_path / "g").mkdir()
    with ProxyProcess(tmp_path / "g", gateway(backend, "sqlite"), extra_args=("--workers", "2")) as g:
        check_quota(agent, [g], owner)
        workers = {line.rsplit("worker=", 1)[1] for line in g.stderr_lines if "listening on" in line}
        assert workers == {"0", "1"}, "\n".join(g.stderr_lines)


def test_the_same_signed_request_is_accepted_once(tmp_path: Path) -> None:
    """Replay protection: the exact bytes of a signed request, sent twice, pass once."""
    key = SigningKey.generate()
    with Backend() as backend:
        backend.directories["agent"] = [issuer_key(key)]
        (tmp_path / "g").mkdir()
        with ProxyProcess(tmp_path / "g", gateway(backend, "sqlite", replay_protection=True)) as g:
            url = g.url + "/feed"
            body = b'{"q":1}'
            fields = Fields(
                [
                    ("Content-Digest", content_digest(body)),
                    ("Authorization", ""),
                    ("Signature-Agent", f'"{backend.url}/agent"'),
                ]
            )
            now = int(time.time())
            message = Message("POST", parse_absolute_uri(url), fields)
            attach_signature(fields, sign_message(message, key, created=now, expires=now + 60))
            headers = dict(fields)

            def send() -> requests.Response:
                return requests.post(url, data=body, headers=headers, proxies={"http": ""}, timeout=WAIT_S)

            assert send().status_code == 200
            again = send()
            assert again.status_code == 401
            assert again.json()["reason"] == "signature-replayed"
            assert len(backend.arrivals) == 1
