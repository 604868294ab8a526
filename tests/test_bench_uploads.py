"""Smoke test of bench/uploads.py: a quick run of concurrent uploads stays under the RSS bound, and
every upload ends in 200 (every byte at the origin) or 503 with Retry-After."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def test_quick_uploads_stay_under_the_rss_bound(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench/uploads.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())
    assert figures["within_bound"]
    outcomes = figures["outcomes"]
    assert set(outcomes) <= {"200", "503 Retry-After"}, outcomes
    assert sum(outcomes.values()) == 8
    assert outcomes.get("200", 0) >= 1  # the budget (4 MiB) admits at least one 2 MiB upload at a time
