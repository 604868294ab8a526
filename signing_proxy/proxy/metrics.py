"""Prometheus metrics: one registry per process, served at ``/metrics``.

Labels carry only closed sets of values (modes, outcomes, reasons, labels, directory URLs we
fetched) — never a client address, a path, a token or a key. Hot-path counters are bound to their
label values once, so counting a request costs a lock and an add, not a label lookup. Figures that
live elsewhere (key validity, caches, revocation ages) are read at scrape time by callbacks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _Callbacks(Collector):
    """Families computed at scrape time from live state."""

    def __init__(self) -> None:
        self.key_remaining: Callable[[], float | None] = lambda: None
        self.revocation_ages: Callable[[], dict[str, float | None]] = dict
        self.leaf_cache: Callable[[], tuple[int, int, int] | None] = lambda: None
        self.directory_cache: Callable[[], tuple[int, int] | None] = lambda: None

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        remaining = self.key_remaining()
        key = GaugeMetricFamily(
            "signing_proxy_signing_key_remaining_seconds",
            "Seconds until the signing key's not_after (absent: no window, or no valid key)",
        )
        if remaining is not None:
            key.add_metric([], remaining)
        yield key
        ages = GaugeMetricFamily(
            "signing_proxy_revocation_set_age_seconds",
            "Seconds since each revocation list was last fetched successfully (+Inf: never)",
            labels=["url"],
        )
        for url, age in self.revocation_ages().items():
            ages.add_metric([url], float("inf") if age is None else age)
        yield ages
        directory = self.directory_cache()
        if directory is not None:
            for name, value, doc in (
                ("fetches", directory[0], "Key directory fetches"),
                ("cache_hits", directory[1], "Key directory cache hits"),
            ):
                counter = CounterMetricFamily(f"signing_proxy_directory_{name}", doc)
                counter.add_metric([], value)
                yield counter
        leaf = self.leaf_cache()
        if leaf is not None:
            for name, value, doc in (
                ("hits", leaf[0], "Leaf certificate cache hits"),
                ("misses", leaf[1], "Leaf certificates minted"),
            ):
                counter = CounterMetricFamily(f"signing_proxy_leaf_cache_{name}", doc)
                counter.add_metric([], value)
                yield counter
            size = GaugeMetricFamily("signing_proxy_leaf_cache_entries", "Leaf certificates cached")
            size.add_metric([], leaf[2])
            yield size


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
        self.manifest_fetches = Counter("signing_proxy_manifest_fetches", "Manifest fetches", registry=r)
        self.manifest_hits = Counter("signing_proxy_manifest_cache_hits", "Manifest cache hits", registry=r)
        self.callbacks = _Callbacks()
        r.register(self.callbacks)
        self._bound: dict[tuple[str, str], Counter] = {}
        self._labels: dict[str, Counter] = {}

    def request(self, mode: str, outcome: str) -> None:
        key = (mode, outcome)
        child = self._bound.get(key)
        if child is None:
            child = self._bound[key] = self.requests.labels(mode=mode, outcome=outcome)
        child.inc()

    def signed(self, label: str) -> None:
        child = self._labels.get(label)
        if child is None:
            child = self._labels[label] = self.signatures.labels(label=label)
        child.inc()

    def signing_failure(self, reason: str) -> None:
        self.signing_failures.labels(reason=reason).inc()

    def verification_failure(self, reason: str) -> None:
        self.verification_failures.labels(reason=reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
