"""A CONNECT to a host name the leaf cache does not hold mints a leaf on the event loop (~2 ms: key,
certificate, context) before any TLS arrives, so whoever may CONNECT chose how many: 2,000 new names
held the loop ~5 s and emptied the cache of the hosts in use. New names' leaves are made at most
``LEAF_MINTS_PER_S`` a second (``LEAF_MINT_BURST`` at once); past it a CONNECT to a new name is 503
``interception-busy`` with ``Retry-After``, while a name the cache holds is never refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from signing_proxy.config import parse_config
from signing_proxy.errors import ProxyError
from signing_proxy.proxy.connect import LEAF_MINTS_PER_S, ConnectHandler
from signing_proxy.verify.cache import TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def handler(tmp_path: Path) -> ConnectHandler:
    made = ConnectHandler(
        parse_config({"data_dir": str(tmp_path / "data")}),
        policy=lambda: pytest.fail("no policy is asked for a leaf"),
        inner=lambda _target, _credentials: pytest.fail("no tunnel is made"),
        count=lambda _outcome: None,
    )
    assert made.leaves is not None
    return made


def test_new_host_names_past_the_burst_wait_and_known_ones_never_do(tmp_path: Path) -> None:
    clock = Clock()
    made = handler(tmp_path)
    made._mints = TokenBucket(LEAF_MINTS_PER_S, 3, clock)  # a burst of 3 for the test
    try:
        for i in range(3):
            made._context_for(f"h{i}.example")
        with pytest.raises(ProxyError) as caught:
            made._context_for("h3.example")
        refusal = caught.value
        assert (refusal.status, refusal.reason) == (503, "interception-busy")
        assert ("Retry-After", "1") in refusal.headers
        assert made._context_for("h1.example") is made._context_for("h1.example")  # held: no new leaf
        clock.now += 1.5 / LEAF_MINTS_PER_S  # one more leaf's worth of time, and some
        made._context_for("h3.example")
        assert made.leaves is not None
        assert made.leaves.misses == 4
    finally:
        made.close()
