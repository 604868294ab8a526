"""Prometheus metrics: one registry per process, served at ``/metrics``.

Labels carry only closed sets of values (modes, outcomes, reasons, labels, directory URLs we
fetched) — never a client address, a path, a token or a key. Hot-path counters are bound to their
label values once, so counting a request costs a lock and an add, not a label lookup.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _Callbacks(Collector):
    """Gauges computed at scrape time from live state (key validity, cache sizes, revocation ages)."""

    def __init__(self) -> None:
        self.key_remaining: Callable[[], float | None] = lambda: None
        self.revocation_ages: Callable[[], dict[str, float | None]] = dict
        self.leaf_cache: Callable[[], tuple[int, int, int] | None] = lambda: None

    def collect(self) -> Iterable[GaugeMetricFamily]:
        remaining = self.key_remaining()
        g = GaugeMetricFamily(
            "signing_proxy_signing_key_remaining_seconds",
            "Seconds until the active signing key's not_after (absent: no valid key)",
        )
        if remaining is not None:
            g.add_metric([], remaining)
        yield g
        ages = GaugeMetricFamily(
            "signing_proxy_revocation_set_age_seconds",
            "Seconds since each revocation list was last fetched successfully",
            labels=["url"],
        )
        for url, age in self.revocation_ages().items():
            ages.add_metric([url], float("inf") if age is None else age)
        yield ages
        leaf = self.leaf_cache()
        if leaf is not None:
            hits, misses, size = leaf
            for name, value, doc in (
                ("hits", hits, "Leaf certificate cache hits"),
                ("misses", misses, "Leaf certificates minted"),
                ("entries", size, "Leaf certificates cached"),
            ):
                fam = GaugeMetricFamily(f"signing_proxy_leaf_cache_{name}", doc)
                fam.add_metric([], value)
                yield fam


class Metrics:
    """Every metric the proxy exports, on a private registry (several apps per process in tests)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.started = time.time()
        self.requests = Counter(
            "signing_proxy_requests", "Requests served, by mode and outcome", ["mode", "outcome"], registry=r
        )
        self.signatures = Counter(
            "signing_proxy_signatures_added", "Signatures added, by label", ["label"], registry=r
        )
        self.signing_failures = Counter(
            "signing_proxy_signing_failures", "Requests not signed, by reason", ["reason"], registry=r
        )
        self.verification_failures = Counter(
            "signing_proxy_verification_failures",
            "Incoming signature stacks refused, by reason",
            ["reason"],
            registry=r,
        )
        self.upstream_latency = Histogram(
            "signing_proxy_upstream_latency_seconds",
            "Time from sending upstream to the response head",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.bytes_in = Counter(
            "signing_proxy_request_bytes", "Request body bytes received from agents", registry=r
        )
        self.bytes_out = Counter(
            "signing_proxy_response_bytes", "Response body bytes sent to agents", registry=r
        )
        self.connects = Counter(
            "signing_proxy_connect_tunnels",
            "CONNECT tunnels, by kind (intercepted, tunnelled)",
            ["kind"],
            registry=r,
        )
        self.directory_fetches = Counter(
            "signing_proxy_directory_fetches", "Key directory fetches", registry=r
        )
        self.directory_hits = Counter(
            "signing_proxy_directory_cache_hits", "Key directory cache hits", registry=r
        )
        self.manifest_fetches = Counter("signing_proxy_manifest_fetches", "Manifest fetches", registry=r)
        self.manifest_hits = Counter("signing_proxy_manifest_cache_hits", "Manifest cache hits", registry=r)
        self.callbacks = _Callbacks()
        r.register(self.callbacks)
        self._bound: dict[tuple[str, str], Counter] = {}

    def request(self, mode: str, outcome: str) -> None:
        key = (mode, outcome)
        child = self._bound.get(key)
        if child is None:
            child = self._bound[key] = self.requests.labels(mode=mode, outcome=outcome)
        child.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
