"""Smoke test of bench/adapters.py: a quick run signs through every adapter and pyauth and writes a
figure for each (the figures themselves are the lead's to take, on a quiet machine)."""

from __future__ import annotations

from pathlib import Path

from tests.harness import run_bench


def test_quick_run_reports_every_adapter_beside_pyauth(tmp_path: Path) -> None:
    document, stdout = run_bench("adapters.py", tmp_path, "--quick", timeout_s=180)
    figures = document["us_per_request"]
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
    assert "slowest adapter:" in stdout
