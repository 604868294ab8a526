"""Smoke test of bench/hostile.py: a short hostile run completes and every legitimate request is accepted.

No timing assertion: the figures depend on the machine; the bench prints them and the issue's
targets are read from a full run, not from CI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def test_quick_hostile_run_completes_and_accepts_every_legitimate_request(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench/hostile.py"), "--quick", "--count", "100", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())
    assert figures["relay_alive"]
    assert figures["legit_refused"] == 0, figures["legit"]
    for run in ("quiet", "attack", "after"):
        legit = figures["legit"][run]
        assert legit["requests"] > 0
        assert legit["outcomes"] == {"accepted": legit["requests"]}, (run, legit)
    sent = sum(v for k, v in figures["attacker"]["outcomes"].items() if k != "not sent (deadline)")
    assert sent == 100, figures["attacker"]
