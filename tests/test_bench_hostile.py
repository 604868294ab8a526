"""Smoke test of bench/hostile.py: a short hostile run completes and every legitimate request is accepted.

No timing assertion: the figures depend on the machine; the bench prints them and the issue's
targets are read from a full run, not from CI.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import run_bench

pytestmark = pytest.mark.integration


def test_quick_hostile_run_completes_and_accepts_every_legitimate_request(tmp_path: Path) -> None:
    figures, _ = run_bench("hostile.py", tmp_path, "--quick", "--count", "100")
    assert figures["relay_alive"]
    assert figures["legit_refused"] == 0, figures["legit"]
    for run in ("quiet", "attack", "after"):
        legit = figures["legit"][run]
        assert legit["requests"] > 0
        assert legit["outcomes"] == {"accepted": legit["requests"]}, (run, legit)
    sent = sum(v for k, v in figures["attacker"]["outcomes"].items() if k != "not sent (deadline)")
    assert sent == 100, figures["attacker"]
