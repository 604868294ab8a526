"""Smoke test of bench/adapters.py: a quick run signs through every adapter and pyauth and writes a
figure for each (the figures themselves are the lead's to take, on a quiet machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_run_reports_every_adapter_beside_pyauth(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench/adapters.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(out.read_text())["us_per_request"]
    assert set(figures) == {
        "pyauth HTTPMessageSigner.sign",
        "httpx auth (sync flow)",
        "httpx auth (async flow)",
        "requests auth",
        "aiohttp middleware",
        "Signer.sign (shared by all)",
        "Ed25519 sign alone (floor)",
    }
    assert all(value > 0 for value in figures.values())
    assert "slowest adapter:" in result.stdout
