"""bench/report.py: the README's performance tables and issue 21's verdicts, read from a run's JSON.

A verdict must follow the figures (a target missed says so, one the run did not measure is never
called met), and every figure printed must be the run's own.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def load_report() -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))  # as when run: it reads the row names from bench/run.py
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "bench" / "report.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through it
    spec.loader.exec_module(module)
    return module


report = load_report()
PAIRED = "intercepted HTTPS against plain HTTP, paired (at once, CPU per request)"


def post(
    config: str, conns: int, rps: float, cpu: float, *, p50: float = 5.0, p99: float = 9.0
) -> dict[str, Any]:
    return {
        "config": config,
        "method": "POST",
        "connections": conns,
        "direct_rps": 50_000.0,
        "direct_p50_ms": 0.02 if conns == 1 else 1.0,
        "direct_p99_ms": 2.0,
        "proxy_rps": rps,
        "proxy_p50_ms": p50,
        "proxy_p99_ms": p99,
        "proxy_cpu_us_per_request": cpu,
    }


def headline(**overrides: float) -> dict[str, float]:
    figures = {
        "rps": 11_000.0,
        "cpu_us_per_request": 90.0,
        "p99_ms": 8.0,
        "naive_rps": 5_000.0,
        "naive_cpu_us_per_request": 200.0,
        "ratio": 2.2,
        "added_p50_ms_1conn": 0.24,
        "https_rps": 8_000.0,
        "https_share": 0.73,
        "https_cpu_us_per_request": 110.0,
        "https_paired_share": 0.81,
        "https_paired_plain_us": 100.0,
        "https_paired_us": 123.5,
        "access_log_on_us": 95.0,
        "access_log_off_us": 92.5,
        "access_log_us": 2.5,
    }
    return figures | overrides


def run_doc() -> dict[str, Any]:
    return {
        "machine": "2 cores, x86_64, Python 3.11.7",
        "table": [
            {**post("default", 64, 1, 1), "method": "GET"},  # first: GET rows are not the README's table
            post("default", 1, 3_500, 200, p50=0.26, p99=0.7),
            post("naive-sign", 1, 2_000, 350),  # only ours is shown at one connection
            post("default", 64, 12_000, 96.4),
            post("tuned", 64, 13_000, 80),
            post("workers=2", 64, 16_000, 88),
            post("naive-sign", 64, 5_000, 198),
        ],
        "https": [
            {"connections": 64, "rps": 9_000.0, "p50_ms": 6.5, "p99_ms": 9.6, "proxy_cpu_us_per_request": 104}
        ],
        "relay_table": [
            {
                "config": "relay",
                "connections": 64,
                "rps": 4_000.0,
                "p50_ms": 16,
                "p99_ms": 24,
                "cpu_us_per_request": 251,
            },
            {
                "config": "naive-relay",
                "connections": 64,
                "rps": 900.0,
                "p50_ms": 70,
                "p99_ms": 110,
                "cpu_us_per_request": 1159,
            },
        ],
        "gateway_table": [],
        "headline": {"rounds": [headline(), headline(ratio=2.4)], "median": headline()},
        "proxy idle RSS (MiB)": 50.8,
        "streaming 100 MiB: RSS growth (MiB)": 0.4,
    }


def verdicts(text: str) -> dict[str, tuple[str, str, str]]:
    """Target name -> (table figure, median figure, verdict), from the printed targets table."""
    rows = [line.strip("|").split(" | ") for line in text.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): (cells[2], cells[3], cells[4].strip()) for cells in rows if len(cells) == 5}


def test_the_table_prints_the_runs_own_post_rows() -> None:
    text = report.render(run_doc())
    assert "| **default configuration** | 64 | 12,000 | 5.00 ms | 9.00 ms | 96 µs | 4.00 ms |" in text
    assert "| **default configuration** | 1 | 3,500 | 0.26 ms | 0.70 ms | 200 µs | 0.24 ms |" in text
    assert "`--workers 2`" in text
    assert "| 4,000 | 16.00 ms | 24.00 ms | 251 µs | — |" in text  # the relay row
    at_one = [line.split(" | ")[0] for line in report.table(run_doc()) if " | 1 | " in line]
    assert at_one == ["| **default configuration**"]  # only ours at one connection
    assert "| 64 | 1 |" not in text  # the GET row stayed out


def test_each_target_is_judged_on_the_table_and_the_medians() -> None:
    judged = verdicts(report.render(run_doc()))
    assert judged["requests/s against the naive signer, 64 connections"] == ("2.40x", "2.20x", "yes")
    assert judged["CPU per request, 64 connections"] == ("96.4 µs", "90.0 µs", "**no**")  # the table missed
    assert judged["added p50 at 1 connection"] == ("0.24 ms", "0.24 ms", "yes")
    assert judged["intercepted HTTPS against plain HTTP, 64"] == ("75%", "73%", "**no**")
    assert judged[PAIRED] == ("—", "81%", "yes")
    assert judged["relay against the naive relay, 64 connections"] == ("4.44x", "—", "yes")
    assert judged["access log, on \N{MINUS SIGN} off"] == ("—", "2.5 µs", "yes")
    assert judged["idle RSS"][2] == "yes"


def test_rounds_show_the_paired_https_share_and_a_run_from_before_it_has_none() -> None:
    assert "| 81% (100.0 / 123.5 µs) |" in report.render(run_doc())
    doc = run_doc()
    for figures in [*doc["headline"]["rounds"], doc["headline"]["median"]]:
        for name in ("https_paired_share", "https_paired_plain_us", "https_paired_us"):
            del figures[name]
    text = report.render(doc)
    assert verdicts(text)[PAIRED] == ("—", "—", "not measured")
    assert "| 73% of plain, 110.0 µs | — |" in text.replace("8,000 req/s, ", "")


def test_a_run_without_rounds_leaves_their_targets_not_measured() -> None:
    doc = run_doc()
    del doc["headline"]
    doc["relay_table"] = []
    text = report.render(doc)
    judged = verdicts(text)
    assert judged["access log, on \N{MINUS SIGN} off"] == ("—", "—", "not measured")
    assert judged["relay against the naive relay, 64 connections"][2] == "not measured"
    assert "| round |" not in text


def test_the_command_prints_markdown_and_names_a_file_it_cannot_read(tmp_path: Path) -> None:
    run = tmp_path / "run.json"
    run.write_text(json.dumps(run_doc()))
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "report.py"), str(run)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == report.render(run_doc())
    missing = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "report.py"), str(tmp_path / "absent.json")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2
    assert "absent.json" in missing.stderr


def test_a_figure_that_misses_its_limit_by_less_than_its_rounding_is_shown_with_the_digits_it_takes() -> None:
    """A median of 3.007 µs against 3.0 read "3.0 µs" beside "no"; one that meets it stays short."""
    doc = run_doc()
    doc["headline"]["median"]["access_log_us"] = 3.007
    assert verdicts(report.render(doc))["access log, on \N{MINUS SIGN} off"] == ("—", "3.01 µs", "**no**")
    doc["headline"]["median"]["access_log_us"] = 2.996
    assert verdicts(report.render(doc))["access log, on \N{MINUS SIGN} off"] == ("—", "3.0 µs", "yes")
    doc["headline"]["median"]["https_paired_share"] = 0.7996
    assert verdicts(report.render(doc))[PAIRED] == ("—", "79.96%", "**no**")


def test_rounds_show_the_floors_added_p50_beside_ours_when_the_run_measured_it() -> None:
    """The added p50 at one connection is mostly the machine's wake-ups across cores: the floor
    forwarder's own figure, measured in the same round, says how much of it any forwarder pays."""
    doc = run_doc()
    assert "| 8.00 ms | 0.24 ms | 8,000 req/s" in report.render(doc)  # a run from before: ours alone
    for figures in [*doc["headline"]["rounds"], doc["headline"]["median"]]:
        figures["floor_added_p50_ms_1conn"] = 0.29
    text = report.render(doc)
    assert "| 8.00 ms | 0.24 ms (floor 0.29 ms) | 8,000 req/s" in text
    assert verdicts(text)["added p50 at 1 connection"] == ("0.24 ms", "0.24 ms", "yes")  # judged on ours
