"""Smoke test of bench/gateway.py: a quick run prints a rate for each verifier and the stores'
latencies (figures only; the bench asserts nothing about them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def test_quick_gateway_bench_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench/gateway.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())
    rates = figures["verified_per_cpu_second"]
    assert set(rates) == {"gateway-plain", "gateway-requester", "gateway-delegated", "pyauth"}
    assert all(rate > 0 for rate in rates.values())
    assert set(figures["store_latency"]["sqlite"]) == {"take", "first_seen"}
    assert "redis" in figures["store_latency"]
