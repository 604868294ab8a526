"""A route prefix is refused as colliding with the proxy's own ``/healthz``, ``/readyz`` or
``/metrics`` exactly when ``Routes.target_for`` would take that path: ``/r/``, ``/read/``,
``/health/`` and ``/me/`` were refused (``"/readyz".startswith("/r")``), though no such route is
ever given ``/readyz``; ``/``, ``/healthz/`` and ``/me`` + ``trics/`` still are."""

from __future__ import annotations

import pytest

from signing_proxy.config import ConfigError, parse_config
from signing_proxy.proxy.exchange import Routes

RESERVED = ("/healthz", "/readyz", "/metrics")
UPSTREAM = "http://127.0.0.1:9000/"


def routes(*prefixes: str) -> dict[str, object]:
    return {"routes": [{"prefix": prefix, "upstream": UPSTREAM} for prefix in prefixes]}


@pytest.mark.parametrize(
    "prefix", ["/r/", "/read/", "/health/", "/me/", "/metric/", "/healthz/x/", "/readyz2/"]
)
def test_a_prefix_that_never_takes_a_reserved_path_is_accepted(prefix: str) -> None:
    config = parse_config(routes(prefix))
    assert [route.prefix for route in config.routes] == [prefix]


@pytest.mark.parametrize(
    ("prefix", "reserved"),
    [("/", "/healthz"), ("/healthz/", "/healthz"), ("/readyz/", "/readyz"), ("/metrics/", "/metrics")],
)
def test_a_prefix_that_takes_a_reserved_path_is_refused(prefix: str, reserved: str) -> None:
    with pytest.raises(
        ConfigError, match=f"routes\\[0\\].prefix: '{prefix}' collides with the proxy's own {reserved}"
    ):
        parse_config(routes(prefix))


@pytest.mark.parametrize(
    "prefix",
    [
        "/",
        "/r/",
        "/re/",
        "/read/",
        "/readyz/",
        "/readyz/x/",
        "/h/",
        "/health/",
        "/healthz/",
        "/m/",
        "/me/",
        "/metrics/",
        "/metricsz/",
        "/x/",
        "/x/healthz/",
    ],
)
def test_the_check_agrees_with_target_for(prefix: str) -> None:
    """Refused if and only if a request for a reserved path would be sent along that route."""
    taken = any(Routes([(prefix, UPSTREAM)]).target_for(path) is not None for path in RESERVED)
    try:
        parse_config(routes(prefix))
    except ConfigError:
        refused = True
    else:
        refused = False
    assert refused == taken
