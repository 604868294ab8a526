"""Prometheus metrics: one registry per process, served at ``/metrics``.

Labels carry only closed sets of values (modes, outcomes, reasons, labels) — never a client
address, a path, a token, a key or a URL a stranger's directory named. The per-request counts are plain
integers (one event loop per process: no lock needed) that the collector turns into counter
families at scrape time, so counting costs a dict update, not a locked Prometheus child; figures
that live elsewhere (key validity, caches, revocation ages) are read the same way.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _Histogram:
    """A Prometheus histogram counted like the other per-request figures: a list update per
    observation (one event loop per process: no lock), cumulative buckets made at scrape time."""

    __slots__ = ("bounds", "counts", "doc", "name", "total")

    def __init__(self, name: str, doc: str, bounds: tuple[float, ...]) -> None:
        self.name, self.doc, self.bounds = name, doc, bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # a bucket counts values <= its bound
        self.total += value

    def family(self) -> HistogramMetricFamily:
        running, buckets = 0, []
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += count
            buckets.append(("+Inf" if bound == math.inf else repr(float(bound)), running))  # Go's form
        return HistogramMetricFamily(self.name, self.doc, buckets=buckets, sum_value=self.total)


class _Callbacks(Collector):
    """Families computed at scrape time from live state."""

    def __init__(self) -> None:
        self.key_remaining: Callable[[], float | None] = lambda: None
        self.delegation_key_remaining: Callable[[], float | None] = lambda: None
        self.revocation_ages: Callable[[], Iterable[float | None]] = tuple  # one per list tracked
        self.leaf_cache: Callable[[], tuple[int, int, int] | None] = lambda: None
        self.directory_cache: Callable[[], tuple[int, int] | None] = lambda: None
        self.engine: Callable[[], tuple[int, int, int] | None] = lambda: None  # open, refused, buffered
        self.access_log_dropped: Callable[[], int] = lambda: 0
        self.providers: Callable[[], dict[str, int] | None] = lambda: None  # gateway: providers per state
        self.requests: dict[tuple[str, str], int] = {}
        self.signatures: dict[str, int] = {}
        self.connects: dict[str, int] = {}
        self.bytes = [0, 0]  # request bytes in, response bytes out
        self.histograms: list[_Histogram] = []

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        for histogram in self.histograms:
            yield histogram.family()
        yield _counter(
            "signing_proxy_requests",
            "Requests served, by mode and outcome",
            ["mode", "outcome"],
            self.requests,
        )
        yield _counter(
            "signing_proxy_signatures_added", "Signatures added, by label", ["label"], self.signatures
        )
        yield _counter(
            "signing_proxy_connect_tunnels",
            "CONNECT tunnels and WebSockets, by kind (intercepted, tunnelled, websocket)",
            ["kind"],
            self.connects,
        )
        engine = self.engine()
        if engine is not None:
            open_now = GaugeMetricFamily("signing_proxy_connections_open", "Client connections open")
            open_now.add_metric([], engine[0])
            yield open_now
            yield _counter(
                "signing_proxy_connections_refused",
                "Client connections refused at limits.max_connections",
                [],
                {(): engine[1]},
            )
            held = GaugeMetricFamily("signing_proxy_buffered_body_bytes", "Request body bytes buffered now")
            held.add_metric([], engine[2])
            yield held
        yield _counter(
            "signing_proxy_access_log_dropped",
            "Access-log lines dropped: the disk or pipe behind the log was too slow to take them",
            [],
            {(): self.access_log_dropped()},
        )
        yield _counter(
            "signing_proxy_request_bytes", "Request body bytes received from agents", [], {(): self.bytes[0]}
        )
        yield _counter(
            "signing_proxy_response_bytes", "Response body bytes sent to agents", [], {(): self.bytes[1]}
        )
        remaining = self.key_remaining()
        key = GaugeMetricFamily(
            "signing_proxy_signing_key_remaining_seconds",
            "Seconds until the signing key's not_after (absent: no window, or no valid key)",
        )
        if remaining is not None:
            key.add_metric([], remaining)
        yield key
        bound = self.delegation_key_remaining()
        delegated = GaugeMetricFamily(
            "signing_proxy_delegation_key_remaining_seconds",
            "Seconds until the key the delegation chain is bound to stops signing (absent: no delegation)",
        )
        if bound is not None:
            delegated.add_metric([], bound)
        yield delegated
        # an aggregate: the URLs are named by strangers' directories, never a label (issue 15)
        ages = [float("inf") if age is None else age for age in self.revocation_ages()]
        oldest = GaugeMetricFamily(
            "signing_proxy_revocation_set_age_seconds",
            "Seconds since the stalest revocation list in use was last fetched successfully (+Inf: never)",
        )
        if ages:
            oldest.add_metric([], max(ages))
        yield oldest
        tracked = GaugeMetricFamily(
            "signing_proxy_revocation_lists", "Revocation lists polled (one per directory)"
        )
        tracked.add_metric([], len(ages))
        yield tracked
        directory = self.directory_cache()
        if directory is not None:
            for name, value, doc in (
                ("fetches", directory[0], "Key directory fetches"),
                ("cache_hits", directory[1], "Key directory cache hits"),
            ):
                counter = CounterMetricFamily(f"signing_proxy_directory_{name}", doc)
                counter.add_metric([], value)
                yield counter
        providers = self.providers()
        if providers is not None:  # per state only: provider names never become labels
            standing = GaugeMetricFamily(
                "signing_proxy_gateway_providers",
                "Provider manifests by standing of this exchange (authorized, removed, unavailable, pending)",
                labels=["state"],
            )
            for state, count in sorted(providers.items()):
                standing.add_metric([state], count)
            yield standing
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


def _counter(name: str, doc: str, labels: list[str], values: dict[Any, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, value in values.items():
        family.add_metric(list(key) if isinstance(key, tuple) else [key], value)
    return family


class Metrics:
    """Every metric the proxy exports, on a private registry (several apps per process in tests)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.started = time.time()
        self.signing_failures = Counter(
            "signing_proxy_signing_failures", "Requests not signed, by reason", ["reason"], registry=r
        )
        self.verification_failures = Counter(
            "signing_proxy_verification_failures",
            "Incoming signature stacks refused, by reason",
            ["reason"],
            registry=r,
        )
        self.upstream_latency = _Histogram(
            "signing_proxy_upstream_latency_seconds",
            "Time from sending upstream to the response head",
            _LATENCY_BUCKETS,
        )
        self.manifest_fetches = Counter("signing_proxy_manifest_fetches", "Manifest fetches", registry=r)
        self.manifest_hits = Counter("signing_proxy_manifest_cache_hits", "Manifest cache hits", registry=r)
        self.callbacks = _Callbacks()
        self.callbacks.histograms.append(self.upstream_latency)
        r.register(self.callbacks)
        self._requests = self.callbacks.requests
        self._signatures = self.callbacks.signatures
        self._bytes = self.callbacks.bytes

    def request(self, mode: str, outcome: str) -> None:
        key = (mode, outcome)
        self._requests[key] = self._requests.get(key, 0) + 1

    def signed(self, label: str) -> None:
        self._signatures[label] = self._signatures.get(label, 0) + 1

    def tunnel(self, kind: str) -> None:
        self.callbacks.connects[kind] = self.callbacks.connects.get(kind, 0) + 1

    def transferred(self, bytes_in: int, bytes_out: int) -> None:
        self._bytes[0] += bytes_in
        self._bytes[1] += bytes_out

    def signing_failure(self, reason: str) -> None:
        self.signing_failures.labels(reason=reason).inc()

    def verification_failure(self, reason: str) -> None:
        self.verification_failures.labels(reason=reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
