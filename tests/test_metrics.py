"""The upstream-latency histogram, counted without a lock, renders as Prometheus's own would:
cumulative buckets whose bound counts values equal to it, ``+Inf``, ``_count`` and ``_sum``."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from signing_proxy.metrics import Metrics


def test_latency_buckets_are_cumulative_and_inclusive() -> None:
    metrics = Metrics()
    for value in (0.0005, 0.001, 0.003, 0.02, 100.0):
        metrics.upstream_latency.observe(value)
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    samples = {
        (s.name, s.labels.get("le")): s.value
        for s in families["signing_proxy_upstream_latency_seconds"].samples
    }
    assert samples["signing_proxy_upstream_latency_seconds_bucket", "0.001"] == 2  # 0.001 itself counts
    assert samples["signing_proxy_upstream_latency_seconds_bucket", "0.005"] == 3
    assert samples["signing_proxy_upstream_latency_seconds_bucket", "0.025"] == 4
    assert samples["signing_proxy_upstream_latency_seconds_bucket", "30.0"] == 4
    assert samples["signing_proxy_upstream_latency_seconds_bucket", "+Inf"] == 5
    assert samples["signing_proxy_upstream_latency_seconds_count", None] == 5
    assert samples["signing_proxy_upstream_latency_seconds_sum", None] == pytest.approx(100.0245)
