"""``config check`` masks every ``gateway.store`` query value whose name holds ``password``: redis-py
also reads ``ssl_password`` (the passphrase of the TLS client key) from the URL's query, and it was
printed; so was a ``password`` after an ``@`` in the query, whose ``?`` the userinfo mask took."""

from __future__ import annotations

import pytest
import yaml

from signing_proxy.config import parse_config, redacted

SECRET = "S3cretKeyPassphrase"


@pytest.mark.parametrize(
    ("store", "shown"),
    [
        (
            f"rediss://redis.example:6380/0?ssl_password={SECRET}&ssl_keyfile=/k.pem",
            "rediss://redis.example:6380/0?ssl_password=(not shown)&ssl_keyfile=/k.pem",
        ),
        (
            f"rediss://redis.example/0?SSL%5FPassword={SECRET}",
            "rediss://redis.example/0?SSL%5FPassword=(not shown)",
        ),
        (
            f"unix:///run/redis.sock?db=2&ssl_password={SECRET}&password={SECRET}",
            "unix:///run/redis.sock?db=2&ssl_password=(not shown)&password=(not shown)",
        ),
        (f"redis://redis.example/0?db=1@x&password={SECRET}", "redis://(not shown)@x&password=(not shown)"),
        (
            "rediss://redis.example/0?ssl_cert_reqs=required",
            "rediss://redis.example/0?ssl_cert_reqs=required",
        ),
    ],
)
def test_every_password_in_the_query_is_masked(store: str, shown: str) -> None:
    view = redacted(parse_config({"gateway": {"store": store}}))
    assert view["gateway"]["store"] == shown
    assert SECRET not in yaml.safe_dump(view)


def test_redis_py_reads_the_masked_names_as_connection_keywords() -> None:
    """The two names masked above are what redis-py takes a secret from (parsed, not ignored)."""
    redis = pytest.importorskip("redis")
    for name in ("password", "ssl_password"):
        assert redis.connection.parse_url(f"rediss://h/0?{name}=x")[name] == "x"
