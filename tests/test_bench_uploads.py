"""Smoke test of bench/uploads.py: a quick run of concurrent uploads stays under the RSS bound, and
every upload ends in 200 (every byte at the origin) or 503 with Retry-After."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import run_bench

pytestmark = pytest.mark.integration


def test_quick_uploads_stay_under_the_rss_bound(tmp_path: Path) -> None:
    figures, _ = run_bench("uploads.py", tmp_path, "--quick", timeout_s=180)
    assert figures["within_bound"]
    outcomes = figures["outcomes"]
    assert set(outcomes) <= {"200", "503 Retry-After"}, outcomes
    assert sum(outcomes.values()) == 8
    assert outcomes.get("200", 0) >= 1  # the budget (4 MiB) admits at least one 2 MiB upload at a time
