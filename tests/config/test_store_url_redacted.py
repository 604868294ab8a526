"""``config check`` masks the Redis password of ``gateway.store``: in the URL's userinfo and in a
``password`` query value (both read by redis-py); the host, port and database stay shown."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from signing_proxy.config import parse_config, redacted
from tests.harness import run_cli

SECRET = "S3cretRedisPass"


@pytest.mark.parametrize(
    ("store", "shown"),
    [
        (f"redis://:{SECRET}@127.0.0.1:6379/0", "redis://(not shown)@127.0.0.1:6379/0"),
        (f"rediss://gw:{SECRET}@redis.example:6380/1", "rediss://(not shown)@redis.example:6380/1"),
        (f"redis://gw:p@ss/{SECRET}@redis.example/0", "redis://(not shown)@redis.example/0"),  # unencoded
        (
            f"unix:///run/redis.sock?db=2&password={SECRET}",
            "unix:///run/redis.sock?db=2&password=(not shown)",
        ),
        (f"redis://redis.example/0?Pass%77ord={SECRET}", "redis://redis.example/0?Pass%77ord=(not shown)"),
        ("redis://redis.example:6379/0", "redis://redis.example:6379/0"),
        ("sqlite", "sqlite"),
        ("sqlite:///var/lib/gw@1/counters.sqlite3", "sqlite:///var/lib/gw@1/counters.sqlite3"),
    ],
)
def test_the_redacted_view_masks_the_store_password(store: str, shown: str) -> None:
    view = redacted(parse_config({"gateway": {"store": store}}))
    assert view["gateway"]["store"] == shown
    assert SECRET not in yaml.safe_dump(view)


def test_config_check_does_not_print_the_redis_password(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {"data_dir": str(tmp_path / "data"), "gateway": {"store": f"redis://:{SECRET}@127.0.0.1:6379/0"}}
        )
    )
    done = run_cli("config", "check", str(config))
    assert done.returncode == 0, done.stderr
    assert "redis://(not shown)@127.0.0.1:6379/0" in done.stdout
    assert SECRET not in done.stdout + done.stderr
