"""Smoke test of bench/malformed.py: a quick run ends with the proxy alive, no traceback, RSS back.

No figure is asserted beyond the bench's own verdict (its exit status): the full run's figures are
read from a full run, not from CI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import run_bench

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def test_quick_malformed_run_leaves_the_proxy_alive_without_tracebacks(tmp_path: Path) -> None:
    figures, _ = run_bench("malformed.py", tmp_path, "--quick", timeout_s=300)
    assert figures["alive"]
    assert figures["tracebacks"] == 0
    assert figures["rss_back"]
    assert figures["sent"] == 500, figures
    assert sum(figures["statuses"].values()) > 0


def test_tls_garbage_after_connect_leaves_no_memory_behind(tmp_path: Path) -> None:
    """2,000 CONNECTs, each followed by a broken or cut-short TLS ClientHello. Every handshake that
    started must be forgotten once it fails. Today each one stays reachable from the CONNECT policy's
    handshake map: that map's values hold their own keys, so about 17 KiB per tunnel is never freed."""
    out = tmp_path / "figures.json"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench/malformed.py"),
            *("--kinds", "connect-tls-garbage", "--count", "2000", "--concurrency", "32", "--warmup", "100"),
            *("--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    figures = json.loads(out.read_text())
    growth_mib = (figures["rss_end_kib"] - figures["rss_start_kib"]) / 1024
    assert figures["rss_back"], f"RSS grew {growth_mib:.1f} MiB over 2,000 failed handshakes\n{result.stdout}"
    assert result.returncode == 0, result.stdout + result.stderr
