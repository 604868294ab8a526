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

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def test_quick_malformed_run_leaves_the_proxy_alive_without_tracebacks(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench/malformed.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())
    assert figures["alive"]
    assert figures["tracebacks"] == 0
    assert figures["rss_back"]
    assert figures["sent"] == 500, figures
    assert sum(figures["statuses"].values()) > 0
