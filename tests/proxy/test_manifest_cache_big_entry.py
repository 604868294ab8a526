"""A manifest too big for the cache (``discovery.max_manifest_bytes`` may be 16 MiB, the cache holds
8 MiB as charged) is served but not cached: it never flushes the other publishers' entries."""

from __future__ import annotations

import json

from signing_proxy.core.manifest import parse_manifest
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.proxy import manifest_cache
from signing_proxy.proxy.manifest_cache import ManifestCache
from tests.proxy.test_discovery_alone import EDGE, MANIFEST, MANIFEST_BODY, OWN, Fetches, discovery

BIG_OWN = "https://big.example/.well-known/svc.json"
BIG_EDGE = parse_absolute_uri("https://big.example/a")
# about 3 MiB: 12 MiB as charged (4x), more than the whole cache
BIG_BODY = json.dumps({**MANIFEST, "domain": "big.example", "contact": "x" * (3 * 1024 * 1024)}).encode()


async def test_a_big_manifest_leaves_the_other_entries_in_place() -> None:
    fetch = Fetches({OWN: (200, MANIFEST_BODY), BIG_OWN: (200, BIG_BODY)})
    found = discovery(fetch, max_manifest_bytes=4 * 1024 * 1024)
    assert (await found.find("x", EDGE)).usable
    assert (await found.find("x", BIG_EDGE)).usable  # served all the same
    assert len(found.cache) == 1
    assert (await found.find("x", EDGE)).usable
    assert [url for _, url, _ in fetch.calls] == [OWN, BIG_OWN]  # pub.example's entry was kept
    assert found.cache.bytes <= manifest_cache.MAX_BYTES


def test_an_entry_above_a_quarter_of_the_cache_is_returned_not_kept() -> None:
    cache = ManifestCache()
    small = parse_manifest(MANIFEST_BODY, served_host="pub.example")
    for i in range(3):
        cache.keep((False, f"{OWN}?n={i}"), small, 100.0, len(MANIFEST_BODY))
    before = cache.bytes
    just_over = manifest_cache.MAX_ENTRY_BYTES // 4 + 1  # a document whose 4x cost passes the bound
    kept = cache.keep((False, BIG_OWN), small, 100.0, just_over)
    assert kept.domain == "pub.example"  # what discovery reads, as for a cached one
    assert len(cache) == 3
    assert cache.bytes == before
    assert cache.fresh((False, BIG_OWN), 0.0) is None
    assert all(cache.fresh((False, f"{OWN}?n={i}"), 0.0) is not None for i in range(3))
