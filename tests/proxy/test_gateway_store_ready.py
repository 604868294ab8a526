"""A gateway whose counter store is down refuses every request that needs it (503), so /readyz says
so: the ``counter_store`` check, the last result of a probe run every second off the request path
(a ``PING`` for Redis, ``SELECT 1`` for SQLite), so /readyz never waits on the store."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from signing_proxy.config import Config, parse_config
from signing_proxy.proxy.gateway import GatewayPipeline
from tests.harness import DIRECT, ProxyProcess, stop_process, wait_for
from tests.proxy.gateway_backend import Backend
from tests.redis_server import RedisServer


def config(tmp_path: Path, **gateway: object) -> Config:
    return parse_config(
        {
            "mode": "gateway",
            "data_dir": str(tmp_path),
            "gateway": {"upstream": "http://127.0.0.1:9000", **gateway},
        }
    )


async def probed(pipeline: GatewayPipeline) -> str | None:
    task = asyncio.get_running_loop().create_task(pipeline.watch_store())
    try:
        for _ in range(100):
            if pipeline.store_state != "unknown":
                break
            await asyncio.sleep(0.02)
        return pipeline.store_check()
    finally:
        task.cancel()


async def test_the_check_follows_the_store(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    for gateway, expected in (
        ({"replay_protection": True}, "ok"),  # the default SQLite file, opened by the probe
        ({"store": f"sqlite:///{tmp_path}/ok/counters.sqlite3"}, "ok"),
        ({"store": f"sqlite:///{tmp_path}/a-file/counters.sqlite3"}, "unavailable"),  # cannot be opened
        ({"store": "redis://127.0.0.1:1/0"}, "unavailable"),  # nobody listens
        ({}, None),  # no replay protection, the default store: quotas only, no check
    ):
        pipeline = GatewayPipeline(config(tmp_path, **gateway))
        try:
            assert await probed(pipeline) == expected, gateway
        finally:
            await pipeline.close()


def readyz(port: int) -> tuple[int, dict[str, Any], float]:
    started = time.monotonic()
    answer = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5, proxies=DIRECT)
    return answer.status_code, answer.json(), time.monotonic() - started


@pytest.mark.integration
def test_readyz_is_unready_while_the_redis_store_is_down(tmp_path: Path) -> None:
    with Backend() as backend, RedisServer(tmp_path) as redis:
        (tmp_path / "gw").mkdir()
        gateway_config = {
            "mode": "gateway",
            "log": {"format": "json", "access_log": False},
            "egress": {"allow_private": ["127.0.0.1/32"]},
            "admin": {"listen": "127.0.0.1:0"},
            "gateway": {"upstream": backend.url, "replay_protection": True, "store": redis.url},
        }
        with ProxyProcess(tmp_path / "gw", gateway_config) as gateway:
            # with an admin port, /readyz is answered there only (the public port's is the backend's)
            wait_for(lambda: readyz(gateway.admin_port)[0] == 200, "ready with the store up")
            status, doc, _ = readyz(gateway.admin_port)
            assert (status, doc["checks"]) == (200, {"config": "ok", "counter_store": "ok"})
            assert redis.proc is not None
            stop_process(redis.proc)
            wait_for(
                lambda: readyz(gateway.admin_port)[0] == 503,
                "unready with the store down",
                5.0,
            )
            status, doc, took = readyz(gateway.admin_port)
            state = (status, doc["status"], doc["checks"]["counter_store"])
            assert state == (503, "not-ready", "unavailable")
            assert took < 0.5  # the cached result: /readyz never waits on the store
