"""Process helpers shared by bench/malformed.py and bench/uploads.py: pinning, children stopped by PID,
their log lines, resident memory, and ``signing-proxy run`` started on a free loopback port."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
CORES = len(os.sched_getaffinity(0))  # read before this process pins itself
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via HTTP_PROXY


def pin(core: int) -> list[str]:
    """``taskset`` prefix for ``core`` when there are two cores or more (as bench/run.py does)."""
    return ["taskset", "-c", str(core)] if CORES >= 2 and shutil.which("taskset") else []


def pin_self(core: int) -> None:
    if CORES >= 2:
        os.sched_setaffinity(0, {core})


def status_kib(pid: int, field: str = "VmRSS") -> int:
    """A ``/proc/PID/status`` figure in KiB (VmRSS now, VmHWM the peak); 0 once the process is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


@contextlib.contextmanager
def child(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A child process with stdout and stderr to ``log``; SIGTERM (then SIGKILL) to its PID on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def wait_line(log: Path, pattern: str, proc: subprocess.Popen[bytes], limit_s: float = 30.0) -> str:
    """The first group of ``pattern`` once it appears in ``log`` (bounded; fails if ``proc`` exits)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        match = re.search(pattern, log.read_text(errors="replace"))
        if match:
            return match.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited ({proc.returncode}):\n{log.read_text(errors='replace')}")
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {pattern!r} in {log}")


@contextlib.contextmanager
def signing_proxy(
    tmp: Path, config: dict[str, Any], core: int = 1
) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """``signing-proxy run`` (agent mode, a fresh key) with ``config`` on 127.0.0.1:0, pinned to ``core``;
    yields the process, its port and its log file."""
    from signing_proxy.core.jwk import SigningKey

    key = tmp / "proxy-key.pem"
    key.write_bytes(SigningKey.generate().to_pem())
    key.chmod(0o600)
    path = tmp / "proxy.yaml"
    whole = {"listen": "127.0.0.1:0", "data_dir": str(tmp / "data"), **config}
    whole.setdefault("signing", {})["key"] = str(key)
    path.write_text(json.dumps(whole))  # JSON is YAML
    log = tmp / "proxy.log"
    with child([*pin(core), PY, "-m", "signing_proxy", "run", "--config", str(path)], log) as proc:
        port = int(wait_line(log, r"listening on http://127\.0\.0\.1:(\d+)", proc))
        yield proc, port, log


def metric(port: int, name: str) -> float:
    """One unlabelled sample of the proxy's ``/metrics`` (served on its own port); NaN when absent."""
    with NO_PROXY.open(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else float("nan")


def settle(port: int, limit_s: float) -> float:
    """Wait (bounded) until the proxy holds no client connection but the scrape's; return how long it took."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        if metric(port, "signing_proxy_connections_open") <= 1:
            break
        time.sleep(0.1)
    return time.monotonic() - start


def tracebacks(log: Path) -> list[str]:
    """Excerpts of ``log`` around each traceback or fatal transport error (one line either side)."""
    lines = log.read_text(errors="replace").splitlines()
    return [
        "\n".join(lines[max(0, i - 1) : i + 2])
        for i, line in enumerate(lines)
        if "Traceback (most recent call last)" in line or "Fatal error" in line
    ]
