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


def test_the_masked_names_are_those_redis_py_reads_a_secret_from() -> None:
    """redis-py passes every query name on as a connection keyword: those naming a secret all hold
    ``password`` (its others: a database, timeouts, TLS paths and flags, public CA data)."""
    redis = pytest.importorskip("redis")
    secrets = {"password", "ssl_password"}
    for name in secrets:
        assert redis.connection.parse_url(f"rediss://h/0?{name}=x")[name] == "x"
        store = f"rediss://h/0?{name}={SECRET}"
        assert SECRET not in redacted(parse_config({"gateway": {"store": store}}))["gateway"]["store"]
