"""signing-proxy benchmark: one command, a table of figures.

    .venv/bin/python bench/run.py [--duration 10] [--quick]

Starts a fast loopback origin (bench/origin.py), ``signing-proxy run`` and ``wrk`` (installed from
the OS packages when missing), pins the load generator and the origin to core 0 and the proxy to
core 1 when there are two cores, and prints requests/s, p50/p99 latency and proxy CPU per request
for GET and POST 1 KiB at 1, 16 and 64 connections — direct and through the proxy — plus peak RSS
while streaming 100 MiB and micro-figures of the core signer. Then the headline figures again, in
alternating rounds (``--headline-rounds``, default 3): the default configuration against the naive
signer at 64 connections, the added p50 at one connection, intercepted HTTPS against plain HTTP
(one after the other, and at once: two proxies on the proxy's core, one loaded over each), and the
access log's cost in place (two proxies alike but for the log, loaded at once on the proxy's core),
with their medians. Measured at once, the machine's drift touches both alike; rows measured
minutes apart drift apart with the machine's speed. The origin verifies a sample of the
proxied requests and the run fails if any sample does not verify.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
BODY_1K = "x" * 1024
LUA = """
wrk.method = "{method}"
wrk.path = "{path}"
{body}
"""


def cores() -> int:
    return len(os.sched_getaffinity(0))


def pin(core: int) -> list[str]:
    return ["taskset", "-c", str(core)] if cores() >= 2 and shutil.which("taskset") else []


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    print("wrk not found; installing it from the OS packages (apt-get install wrk)", file=sys.stderr)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "wrk"],
        check=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
    found = shutil.which("wrk")
    if not found:
        raise SystemExit("wrk is required")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


@contextlib.contextmanager
def process(args: list[str], stderr: object = subprocess.DEVNULL) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=stderr)  # type: ignore[call-overload]
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and of its live children (the workers of ``run --workers N``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children = Path(f"/proc/{pid}/task/{pid}/children")
    kids = children.read_text().split() if children.exists() else []
    return own + sum(cpu_seconds(int(kid)) for kid in kids)


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def parse_latency(text: str, pct: str) -> float:
    match = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
    if not match:
        return float("nan")
    value, unit = float(match.group(1)), match.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


def run_wrk(  # noqa: PLR0917
    wrk: str,
    connect_port: int,
    path: str,
    method: str,
    conns: int,
    duration: int,
    tmp: Path,
    headers: dict[str, str] | None = None,
) -> tuple[float, float, float, int]:
    script = tmp / f"{method}.lua"
    body = (
        f'wrk.body = "{BODY_1K}"\nwrk.headers["Content-Type"] = "application/octet-stream"'
        if method == "POST"
        else ""
    )
    for name, value in (headers or {}).items():
        body += f"\nwrk.headers[{json.dumps(name)}] = {json.dumps(value)}"
    script.write_text(LUA.format(method=method, path=path, body=body))
    out = subprocess.run(
        [
            *pin(0),
            wrk,
            "-t1",
            f"-c{conns}",
            f"-d{duration}s",
            "--latency",
            "-s",
            str(script),
            f"http://127.0.0.1:{connect_port}",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=duration + 30,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"wrk saw {errors.group(1)} error responses:\n{out}")
    return rps, parse_latency(out, "50"), parse_latency(out, "99"), total


def micro_figures() -> dict[str, float]:
    from signing_proxy.core.digest import content_digest
    from signing_proxy.core.fields import Fields
    from signing_proxy.core.jwk import SigningKey
    from signing_proxy.core.signatures import Message, attach_signature, sign_message
    from signing_proxy.core.uri import parse_absolute_uri

    key = SigningKey.generate()
    body = BODY_1K.encode()
    target = parse_absolute_uri("https://exchange.example/svc.v1.ExchangeService/DiscoverResources")

    def sign_once() -> None:
        fields = Fields(
            [
                ("Content-Type", "application/json"),
                ("Content-Digest", content_digest(body)),
                ("Authorization", ""),
                ("Signature-Agent", '"https://agent.example"'),
            ]
        )
        message = Message("POST", target, fields)
        attach_signature(fields, sign_message(message, key, created=1_700_000_000, expires=1_700_000_300))

    n = 5000
    per = min(timeit.repeat(sign_once, number=n, repeat=5)) / n * 1e6
    ed = min(timeit.repeat(lambda: key.sign(b"x" * 400), number=n, repeat=5)) / n * 1e6
    figures = {"core signer per 1 KiB request (us)": per, "Ed25519 sign alone (us)": ed}
    with contextlib.suppress(ImportError):
        from signing_proxy.net.leaves import LeafContextCache
        from signing_proxy.storage.ca import CertificateAuthority

        cache = LeafContextCache(CertificateAuthority.generate(), max_entries=10_000)
        hosts = [f"h{i}.example" for i in range(300)]
        start = time.perf_counter()
        for host in hosts:
            cache.get(host)
        figures["leaf certificate mint + TLS context (ms)"] = (time.perf_counter() - start) / len(hosts) * 1e3
        cache.close()
    return figures


def https_load(proxy_port: int, tls_port: int, tmp: Path, duration: int, conns: int) -> dict[str, Any]:
    """``bench/https_load.py`` through the proxy at ``proxy_port``: its JSON figures (errors refused)."""
    out = subprocess.run(
        [
            *pin(0),
            PY,
            str(ROOT / "bench/https_load.py"),
            "--proxy",
            f"127.0.0.1:{proxy_port}",
            "--target",
            f"127.0.0.1:{tls_port}",
            "--ca",
            str(tmp / "data" / "ca.pem"),
            "--connections",
            str(conns),
            "--duration",
            str(duration),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=duration + 60,
    ).stdout
    doc: dict[str, Any] = json.loads(out)
    if doc["errors"]:
        raise RuntimeError(f"HTTPS load saw errors: {doc['first_error']}")
    return doc


def https_rows(  # noqa: PLR0917
    proxy_pid: int, proxy_port: int, tls_port: int, tmp: Path, duration: int, conn_counts: list[int]
) -> list[dict[str, float]]:
    """Intercepted CONNECT, keep-alive tunnels, POST 1 KiB: requests/s, latency, proxy CPU per request."""
    rows = []
    for conns in conn_counts:
        cpu0 = cpu_seconds(proxy_pid)
        doc = https_load(proxy_port, tls_port, tmp, duration, conns)
        doc["connections"] = conns
        doc["proxy_cpu_us_per_request"] = (cpu_seconds(proxy_pid) - cpu0) / max(doc["requests"], 1) * 1e6
        rows.append(doc)
    return rows


DEFAULT_ROW = "default"  # the headline: what a user runs
TUNED_ROW = "tuned"
NAIVE_SIGN_ROW = "naive-sign"  # bench/naive.py: aiohttp + pyauth, signing
NAIVE_PASS_ROW = "naive-pass"  # bench/naive.py: aiohttp, no signing
FLOOR_ROW = "floor-pass"  # bench/floor.py: uvloop + llhttp forwarding and nothing else
RELAY_ROW = "relay"  # signing-proxy as a relay hop
NAIVE_RELAY_ROW = "naive-relay"  # bench/naive.py --mode relay: http-message-signatures verify + sign
GATEWAY_ROW = "gateway"  # signing-proxy gateway
WORKERS_ROW = "workers="  # + N: the default configuration with run --workers N
Wrk = tuple[float, float, float, int]  # requests/s, p50 ms, p99 ms, requests
Row = tuple[str, str, int, Wrk, Wrk, float]  # config, method, conns, direct, through it, CPU us/request
DIRECT: dict[tuple[str, int], Wrk] = {}  # the origin alone, per method and connections


def load_rows(  # noqa: PLR0917
    wrk: str,
    name: str,
    pid: int,
    port: int,
    origin_port: int,
    method: str,
    conn_counts: list[int],
    duration: int,
    tmp: Path,
    headers: dict[str, str] | None = None,
) -> list[Row]:
    """wrk through the proxy-like process ``pid`` on ``port``: one row per connection count."""
    rows = []
    for conns in conn_counts:
        cpu0 = cpu_seconds(pid)
        url = f"http://127.0.0.1:{origin_port}/bench"
        via = run_wrk(wrk, port, url, method, conns, duration, tmp, headers)
        cpu_us = (cpu_seconds(pid) - cpu0) / via[3] * 1e6
        rows.append((name, method, conns, DIRECT[method, conns], via, cpu_us))
    return rows


def agent_signed_headers(key: Any, url: str, agent: str = "") -> dict[str, str]:
    """What an agent hop sends for POST 1 KiB to ``url``: ``Signature-Agent`` names ``agent`` (empty:
    a relay with the key pinned)."""
    from signing_proxy.core.digest import content_digest
    from signing_proxy.core.fields import Fields
    from signing_proxy.core.signatures import Message, attach_signature, sign_message
    from signing_proxy.core.uri import parse_absolute_uri

    fields = Fields(
        [
            ("Content-Digest", content_digest(BODY_1K.encode())),
            ("Authorization", ""),
            ("Signature-Agent", f'"{agent}"' if agent else ""),
        ]
    )
    created = int(time.time())
    member = sign_message(
        Message("POST", parse_absolute_uri(url), fields), key, created=created, expires=created + 600
    )
    attach_signature(fields, member)
    return dict(fields)


def relay_rows(  # noqa: PLR0917
    wrk: str,
    start_proxy: Callable[..., subprocess.Popen[bytes]],
    tmp: Path,
    key: Any,
    key_path: Path,
    pub_path: Path,
    origin_port: int,
    conn_counts: list[int],
    duration: int,
    needed: str,
) -> list[Row]:
    """A relay hop (verify the agent's label, add ours) at the default configuration, beside a naive
    aiohttp relay built on pyauth's verifier and signer, on the same pre-signed requests."""
    config = tmp / "relay.yaml"
    config.write_text(
        needed + f"mode: relay\nsigning:\n  label: broker\nrelay:\n  pinned_agent_keys: [{pub_path}]\n"
    )
    headers = agent_signed_headers(key, f"http://127.0.0.1:{origin_port}/bench")
    rows: list[Row] = []
    port = free_port()
    relay = start_proxy(config, port, "relay.log")
    wait_port(port)
    rows += load_rows(
        wrk, RELAY_ROW, relay.pid, port, origin_port, "POST", conn_counts, duration, tmp, headers
    )
    relay.send_signal(signal.SIGTERM)
    relay.wait(10)
    port = free_port()
    naive_cmd = [*pin(1), PY, str(ROOT / "bench/naive.py"), "--port", str(port), "--mode", "relay"]
    naive_cmd += ["--key", str(key_path), "--agent-public-pem", str(pub_path)]
    with process(naive_cmd) as naive:
        wait_port(port)
        rows += load_rows(
            wrk, NAIVE_RELAY_ROW, naive.pid, port, origin_port, "POST", conn_counts, duration, tmp, headers
        )
    return rows


def gateway_rows(  # noqa: PLR0917
    wrk: str,
    stack: contextlib.ExitStack,
    tmp: Path,
    key: Any,
    origin_port: int,
    conn_counts: list[int],
    duration: int,
) -> list[Row]:
    """``signing-proxy gateway`` at its defaults in front of the origin: each pre-signed request's
    label verified with the key from its Signature-Agent's directory (served by the origin, fetched
    once and cached), Content-Digest checked, then forwarded with X-Verified-* headers."""
    origin = f"http://127.0.0.1:{origin_port}"
    config = tmp / "gateway.yaml"
    config.write_text(
        f"mode: gateway\ndata_dir: {tmp / 'gateway-data'}\n"
        f"gateway:\n  upstream: {origin}\n  external_origin: {origin}\n"  # what the origin re-verifies
        'egress:\n  allow_private: ["127.0.0.1/32"]\n'  # the directory is on loopback
    )
    headers = agent_signed_headers(key, f"{origin}/bench", agent=origin)
    port = free_port()
    log_file = stack.enter_context((tmp / "gateway.log").open("wb"))
    command = [*pin(1), PY, "-m", "signing_proxy", "gateway", "--config", str(config)]
    with process([*command, "--listen", f"127.0.0.1:{port}"], stderr=log_file) as gateway:
        wait_port(port)
        rows: list[Row] = []
        for conns in conn_counts:
            cpu0 = cpu_seconds(gateway.pid)
            via = run_wrk(wrk, port, "/bench", "POST", conns, duration, tmp, headers)
            rows.append(
                (
                    GATEWAY_ROW,
                    "POST",
                    conns,
                    DIRECT["POST", conns],
                    via,
                    (cpu_seconds(gateway.pid) - cpu0) / via[3] * 1e6,
                )
            )
    return rows


def at_once(loads: list[tuple[int, Callable[[], int]]]) -> list[float]:
    """Run each ``(pid, load)`` at the same time (``load`` returns how many requests it made) and
    return each process's CPU us per request over its load."""
    cpu0 = [cpu_seconds(pid) for pid, _load in loads]
    with concurrent.futures.ThreadPoolExecutor(len(loads)) as pool:
        served = [run.result() for run in [pool.submit(load) for _pid, load in loads]]
    return [
        (cpu_seconds(pid) - before) / count * 1e6
        for (pid, _load), before, count in zip(loads, cpu0, served, strict=True)
    ]


def access_log_pair(  # noqa: PLR0917
    wrk: str, on: tuple[int, int], off: tuple[int, int], origin_port: int, duration: int, tmp: Path
) -> tuple[float, float]:
    """CPU us per request of two proxies loaded at once (POST 1 KiB, 64 connections each): ``on`` the
    default configuration, ``off`` the same with ``log.access_log: false``, both (pid, port) on the
    proxy's core, started together and served the same. Measured side by side rather than one after
    the other, the machine's drift touches both alike: their difference is the access log's cost in
    place, to about a microsecond. Each runs at about half its rate alone, so a cost per flush of
    the log weighs about twice what it does alone."""
    url = f"http://127.0.0.1:{origin_port}/bench"
    for name in ("on", "off"):  # each wrk its own script file
        (tmp / name).mkdir(exist_ok=True)

    def loads(seconds: int) -> list[tuple[int, Callable[[], int]]]:
        def load(port: int, name: str) -> Callable[[], int]:
            return lambda: run_wrk(wrk, port, url, "POST", 64, seconds, tmp / name)[3]

        return [(pid, load(port, name)) for (pid, port), name in ((on, "on"), (off, "off"))]

    at_once(loads(2))  # warm: both open their upstream connections
    on_us, off_us = at_once(loads(duration))
    return on_us, off_us


def https_pair(  # noqa: PLR0917
    wrk: str,
    plain: tuple[int, int],
    https: tuple[int, int],
    origin_port: int,
    tls_port: int,
    duration: int,
    tmp: Path,
) -> tuple[float, float]:
    """CPU us per request of two proxies of the default configuration loaded at once, both (pid, port)
    on the proxy's core: ``plain`` with POST 1 KiB over plain HTTP (64 connections), ``https`` with
    the same through 64 intercepted keep-alive tunnels. Their ratio is the share HTTPS keeps of the
    plain figure (each proxy is held by its CPU: requests/s is one over the CPU per request), which
    measured minutes apart moved with the machine's speed: 71 % to 104 % in one run of one tree."""
    url = f"http://127.0.0.1:{origin_port}/bench"
    (tmp / "plain").mkdir(exist_ok=True)

    def loads(seconds: int) -> list[tuple[int, Callable[[], int]]]:
        return [
            (plain[0], lambda: run_wrk(wrk, plain[1], url, "POST", 64, seconds, tmp / "plain")[3]),
            (https[0], lambda: int(https_load(https[1], tls_port, tmp, seconds, 64)["requests"])),
        ]

    at_once(loads(2))  # warm: tunnels, leaf certificates, upstream connections
    plain_us, https_us = at_once(loads(duration))
    return plain_us, https_us


def headline(  # noqa: PLR0917
    wrk: str,
    pid: int,
    port: int,
    key_path: Path,
    origin_port: int,
    tls_port: int,
    tmp: Path,
    duration: int,
    rounds: int,
    logs: tuple[tuple[int, int], tuple[int, int]],
    https_peer: tuple[int, int],
) -> dict[str, object]:
    """The issue-21 figures again, in ``rounds`` alternating rounds: the default proxy and the naive
    signer (POST 1 KiB, 64 connections), the origin direct, the default proxy and the floor (one connection),
    intercepted HTTPS (64 tunnels) alone and against plain HTTP at once (``https_pair``: the default
    proxy and ``https_peer``, (pid, port) of another), and the access log's cost in place
    (``access_log_pair`` of the ``logs`` proxies, (pid, port) with the log on and off). Rows
    measured minutes apart drift apart with the machine's speed; alternating, they drift together,
    and the medians say what holds."""
    naive_port, floor_port = free_port(), free_port()
    naive_cmd = [*pin(1), PY, str(ROOT / "bench/naive.py"), "--port", str(naive_port)]
    floor_cmd = [*pin(1), PY, str(ROOT / "bench/floor.py"), "--port", str(floor_port)]
    per_round: list[dict[str, float]] = []
    with (
        process([*naive_cmd, "--mode", "sign", "--key", str(key_path)]) as naive,
        process(floor_cmd) as floor,
    ):
        wait_port(naive_port)
        wait_port(floor_port)
        for _ in range(rounds):
            ours = load_rows(wrk, DEFAULT_ROW, pid, port, origin_port, "POST", [64], duration, tmp)[0]
            theirs = load_rows(
                wrk, NAIVE_SIGN_ROW, naive.pid, naive_port, origin_port, "POST", [64], duration, tmp
            )[0]
            direct = DIRECT["POST", 1] = run_wrk(wrk, origin_port, "/bench", "POST", 1, duration, tmp)
            one = load_rows(wrk, DEFAULT_ROW, pid, port, origin_port, "POST", [1], duration, tmp)[0]
            # what any Python forwarder adds at one connection here (the machine's wake-ups across
            # cores): the added p50's own floor
            least = load_rows(wrk, FLOOR_ROW, floor.pid, floor_port, origin_port, "POST", [1], duration, tmp)[
                0
            ]
            https = https_rows(pid, port, tls_port, tmp, duration, [64])[0]
            plain_us, https_us = https_pair(
                wrk, (pid, port), https_peer, origin_port, tls_port, duration, tmp
            )
            log_on, log_off = access_log_pair(wrk, *logs, origin_port, duration, tmp)
            per_round.append(
                {
                    "rps": ours[4][0],
                    "cpu_us_per_request": ours[5],
                    "p99_ms": ours[4][2],
                    "naive_rps": theirs[4][0],
                    "naive_cpu_us_per_request": theirs[5],
                    "ratio": ours[4][0] / theirs[4][0],
                    "added_p50_ms_1conn": one[4][1] - direct[1],
                    "floor_added_p50_ms_1conn": least[4][1] - direct[1],
                    "https_rps": https["rps"],
                    "https_share": https["rps"] / ours[4][0],
                    "https_cpu_us_per_request": https["proxy_cpu_us_per_request"],
                    "https_paired_share": plain_us / https_us,
                    "https_paired_plain_us": plain_us,
                    "https_paired_us": https_us,
                    "access_log_on_us": log_on,
                    "access_log_off_us": log_off,
                    "access_log_us": log_on - log_off,
                }
            )
    medians = {name: statistics.median(r[name] for r in per_round) for name in per_round[0]}
    return {"rounds": per_round, "median": medians}


def print_headline(doc: dict[str, Any], duration: int) -> None:
    rounds: list[dict[str, float]] = doc["rounds"]
    print(
        f"\nHeadline, {len(rounds)} alternating rounds ({duration} s runs; POST 1 KiB; default "
        "configuration against the naive signer at 64 connections, then the origin direct, the "
        "proxy and the floor forwarder at 1, then intercepted HTTPS at 64 tunnels, then two "
        "proxies of the default configuration on the proxy's core loaded at once, one over plain "
        "HTTP and one through 64 tunnels (HTTPS paired: plain CPU per request over HTTPS CPU per "
        "request), then two proxies started together, the default configuration and the same with "
        "log.access_log: false, loaded at once, 64 connections each, both on the proxy's core):"
    )
    for i, r in enumerate([*rounds, doc["median"]], 1):
        label = f"round {i}" if i <= len(rounds) else "median "
        print(
            f"  {label}: {r['rps']:>7.0f} req/s  cpu {r['cpu_us_per_request']:.1f} us/req  "
            f"p99 {r['p99_ms']:.2f} ms | naive-sign {r['naive_rps']:>6.0f} req/s "
            f"{r['naive_cpu_us_per_request']:.1f} us/req | {r['ratio']:.2f}x | added p50 at 1 conn "
            f"{r['added_p50_ms_1conn']:.2f} ms (floor-pass {r['floor_added_p50_ms_1conn']:.2f}) | HTTPS "
            f"{r['https_rps']:>6.0f} req/s, "
            f"{r['https_share']:.0%} of plain, {r['https_cpu_us_per_request']:.1f} us/req | HTTPS "
            f"paired {r['https_paired_share']:.0%} ({r['https_paired_plain_us']:.1f} over "
            f"{r['https_paired_us']:.1f} us/req) | access log "
            f"{r['access_log_us']:+.1f} us/req (on {r['access_log_on_us']:.1f}, "
            f"off {r['access_log_off_us']:.1f})"
        )


def side_table(rows: list[Row]) -> list[dict[str, object]]:
    """A side benchmark's rows (relay, gateway) for the JSON output."""
    return [
        {
            "config": r[0],
            "connections": r[2],
            "rps": r[4][0],
            "p50_ms": r[4][1],
            "p99_ms": r[4][2],
            "cpu_us_per_request": r[5],
        }
        for r in rows
    ]


def print_side(title: str, rows: list[Row]) -> None:
    print(f"\n{title}")
    for name, _method, conns, _direct, via, cpu_us in rows:
        print(
            f"  {name:12} {conns:>3} conns: {via[0]:>7.0f} req/s  p50 {via[1]:.2f} ms  p99 {via[2]:.2f} ms  "
            f"cpu {cpu_us:.1f} us/req"
        )


def access_log_figures(port: int, log_path: Path) -> dict[str, int]:
    """Lines the default-configuration proxy wrote to its stderr file, and lines it dropped."""
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = re.search(r"^signing_proxy_access_log_dropped_total ([\d.e+]+)$", metrics, re.M)
    with log_path.open("rb") as fh:
        lines = sum(b" signing_proxy.access: " in line for line in fh)
    return {"lines": lines, "dropped": int(float(found.group(1))) if found else -1}


def stream_rss(proxy_pid: int, proxy_port: int, origin_port: int) -> tuple[float, float]:
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{proxy_port}"})
    )
    before = rss_kib(proxy_pid)
    received = 0
    with opener.open(f"http://127.0.0.1:{origin_port}/stream?mib=100", timeout=120) as resp:
        while chunk := resp.read(1 << 20):
            received += len(chunk)
    assert received == 100 << 20, received
    return before / 1024, (rss_kib(proxy_pid, "VmHWM") - before) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run (default 10)")
    parser.add_argument("--quick", action="store_true", help="3 s runs, 64 connections only")
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="also a row with run --workers N, unpinned (default 2; 1: none)",
    )
    parser.add_argument(
        "--headline-rounds",
        type=int,
        default=3,
        help="alternating rounds of the headline figures after the table (default 3; --quick: 1; 0: none)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args()
    duration = 3 if args.quick else args.duration
    conn_counts = [64] if args.quick else [1, 16, 64]
    wrk = ensure_wrk()
    results: dict[str, object] = {
        "machine": f"{cores()} cores, {os.uname().machine}, Python {sys.version.split()[0]}"
    }
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        from signing_proxy.core.jwk import SigningKey

        key = SigningKey.generate()
        key_path = tmp / "key.pem"
        key_path.write_bytes(key.to_pem())
        key_path.chmod(0o600)
        pub_path = tmp / "pub.pem"
        from cryptography.hazmat.primitives import serialization

        pub_path.write_bytes(
            key.public.key.public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        origin_port, proxy_port, tls_port = free_port(), free_port(), free_port()
        default_port = free_port()
        origin_ca = tmp / "origin-ca.pem"
        # what the benchmark needs (where keys live, the origin's CA, the TLS port); the rest default
        needed = (
            f"data_dir: {tmp / 'data'}\n"
            f"upstream:\n  pin_ca_files:\n    127.0.0.1: {origin_ca}\n"
            f"intercept:\n  allowed_ports: [{tls_port}]\n"
        )
        config = tmp / "config.yaml"  # tuned: no access log, warnings only
        config.write_text(needed + "log:\n  access_log: false\n  level: warning\n")
        default_config = tmp / "default.yaml"  # the default configuration: access log on, text, info
        default_config.write_text(needed)
        origin_cmd = [*pin(0), PY, str(ROOT / "bench/origin.py"), "--public-key-pem", str(pub_path)]
        with contextlib.ExitStack() as stack:
            stack.enter_context(process([*origin_cmd, "--port", str(origin_port)]))
            stack.enter_context(
                process([*origin_cmd, "--port", str(tls_port), "--tls-ca-out", str(origin_ca)])
            )
            wait_port(tls_port)  # its CA file exists before the proxy pins it

            def start_proxy(
                config_path: Path, port: int, log_name: str, workers: int = 1
            ) -> subprocess.Popen[bytes]:
                # stderr (where the access log goes) to a real file: /dev/null would flatter it
                log_file = stack.enter_context((tmp / log_name).open("wb"))
                cores_for = pin(1) if workers == 1 else []  # N workers: every core (shared with the load)
                command = [*cores_for, PY, "-m", "signing_proxy", "run", "--config", str(config_path)]
                command += ["--key", str(key_path), "--listen", f"127.0.0.1:{port}"]
                command += ["--workers", str(workers)] if workers > 1 else []
                return stack.enter_context(process(command, stderr=log_file))

            proxy = start_proxy(config, proxy_port, "tuned.log")
            # the access log's cost in place: two proxies alike but for log.access_log, for the rounds
            log_off_config = tmp / "log-off.yaml"
            log_off_config.write_text(needed + "log:\n  access_log: false\n")
            log_on_port, log_off_port = free_port(), free_port()
            log_on = start_proxy(default_config, log_on_port, "log-on.log")
            log_off = start_proxy(log_off_config, log_off_port, "log-off.log")
            # intercepted HTTPS beside plain HTTP at once: a proxy of its own (tunnels and a TLS pool
            # would set the access log's pair apart)
            https_peer_port = free_port()
            https_peer = start_proxy(default_config, https_peer_port, "https-peer.log")
            default_proxy = start_proxy(default_config, default_port, "default.log")
            wait_port(origin_port)
            wait_port(proxy_port)
            wait_port(default_port)
            wait_port(log_on_port)
            wait_port(log_off_port)
            wait_port(https_peer_port)
            time.sleep(0.3)
            results["proxy idle RSS (MiB)"] = rss_kib(default_proxy.pid) / 1024
            rows: list[Row] = []
            proxies = ((DEFAULT_ROW, default_proxy.pid, default_port), (TUNED_ROW, proxy.pid, proxy_port))
            for method in ("GET", "POST"):
                for conns in conn_counts:
                    direct = run_wrk(wrk, origin_port, "/bench", method, conns, duration, tmp)
                    DIRECT[method, conns] = direct
                    for name, pid, port in proxies:
                        rows += load_rows(wrk, name, pid, port, origin_port, method, [conns], duration, tmp)
            # in-run references on the proxy's core, one at a time: a naive signer and passthrough, and
            # the floor (the least an HTTP/1.1 forwarder on uvloop and llhttp does)
            references = (
                (NAIVE_SIGN_ROW, "bench/naive.py", "--mode", "sign", "--key", str(key_path)),
                (NAIVE_PASS_ROW, "bench/naive.py", "--mode", "pass", "--key", str(key_path)),
                (FLOOR_ROW, "bench/floor.py"),
            )
            for name, script, *extra in references:
                port = free_port()
                with process([*pin(1), PY, str(ROOT / script), "--port", str(port), *extra]) as ref:
                    wait_port(port)
                    rows += load_rows(
                        wrk, name, ref.pid, port, origin_port, "POST", conn_counts, duration, tmp
                    )
            rounds = min(args.headline_rounds, 1) if args.quick else args.headline_rounds
            if rounds > 0:
                results["headline"] = headline(
                    wrk,
                    default_proxy.pid,
                    default_port,
                    key_path,
                    origin_port,
                    tls_port,
                    tmp,
                    duration,
                    rounds,
                    ((log_on.pid, log_on_port), (log_off.pid, log_off_port)),
                    (https_peer.pid, https_peer_port),
                )
            if args.workers > 1:  # scaling: the default configuration with N workers
                port = free_port()
                scaled = start_proxy(default_config, port, "workers.log", args.workers)
                wait_port(port)
                time.sleep(0.5)  # every worker listening
                name = f"{WORKERS_ROW}{args.workers}"
                rows += load_rows(
                    wrk, name, scaled.pid, port, origin_port, "POST", conn_counts, duration, tmp
                )
                scaled.send_signal(signal.SIGTERM)
                scaled.wait(10)
            results["relay"] = relay_rows(
                wrk, start_proxy, tmp, key, key_path, pub_path, origin_port, conn_counts, duration, needed
            )
            results["gateway"] = gateway_rows(wrk, stack, tmp, key, origin_port, conn_counts, duration)
            results["access log"] = access_log_figures(default_port, tmp / "default.log")
            idle_mib, growth_mib = stream_rss(default_proxy.pid, default_port, origin_port)
            results["https"] = https_rows(  # the default configuration, like the headline rows
                default_proxy.pid, default_port, tls_port, tmp, duration, conn_counts
            )
            stats = json.loads(
                urllib.request.urlopen(f"http://127.0.0.1:{origin_port}/stats", timeout=10).read()
            )
        results["streaming 100 MiB: RSS growth (MiB)"] = growth_mib
    print(
        f"\nsigning-proxy benchmark — {results['machine']}, wrk -t1, {duration} s per run, "
        f"origin+wrk on core 0, proxy on core 1; proxy stderr to a file\n"
        f"  {DEFAULT_ROW}: the default configuration (log.access_log: true, log.format: text, level info)\n"
        f"  {TUNED_ROW}: log.access_log: false, log.level: warning\n"
        f"  {NAIVE_SIGN_ROW}, {NAIVE_PASS_ROW}: bench/naive.py (aiohttp on uvloop; signing by hand / none)\n"
        f"  {FLOOR_ROW}: bench/floor.py (uvloop + llhttp forwarding, nothing else: the floor under any "
        f"Python proxy)\n"
        f"  workers=N: the default configuration with run --workers N, unpinned (shares the cores with "
        f"wrk and the origin; CPU summed over the workers)\n"
    )
    print(
        f"{'config':10} {'method':6} {'conns':>5} | {'direct rps':>10} {'p50 ms':>7} {'p99 ms':>7} | "
        f"{'proxy rps':>9} {'p50 ms':>7} {'p99 ms':>7} {'cpu us/req':>10} | {'rps ratio':>9} {'+p50 ms':>8}"
    )
    print("-" * 115)
    table = []
    for name, method, conns, direct, via, cpu_us in rows:
        ratio, added = via[0] / direct[0], via[1] - direct[1]
        print(
            f"{name:10} {method:6} {conns:>5} | {direct[0]:>10.0f} {direct[1]:>7.2f} {direct[2]:>7.2f} | "
            f"{via[0]:>9.0f} {via[1]:>7.2f} {via[2]:>7.2f} {cpu_us:>10.1f} | {ratio:>9.2f} {added:>8.2f}"
        )
        table.append(
            {
                "config": name,
                "method": method,
                "connections": conns,
                "direct_rps": direct[0],
                "direct_p50_ms": direct[1],
                "direct_p99_ms": direct[2],
                "proxy_rps": via[0],
                "proxy_p50_ms": via[1],
                "proxy_p99_ms": via[2],
                "proxy_cpu_us_per_request": cpu_us,
            }
        )
    results["table"] = table
    relay: list[Row] = results["relay"]  # type: ignore[assignment]
    print_side(
        "Relay hop (verify the agent's label, stack ours), POST 1 KiB, the same pre-signed requests", relay
    )
    gateway: list[Row] = results["gateway"]  # type: ignore[assignment]
    print_side(
        "Gateway (verify the agent's label with its directory's key, forward), POST 1 KiB, pre-signed",
        gateway,
    )
    by_name = {(row[0], row[1], row[2]): row for row in rows + relay}
    print("\nRatios in this run (requests/s; CPU per request), POST 1 KiB:")
    for conns in conn_counts:
        pairs = ((DEFAULT_ROW, NAIVE_SIGN_ROW), (TUNED_ROW, NAIVE_SIGN_ROW), (RELAY_ROW, NAIVE_RELAY_ROW))
        for ours, theirs in pairs:
            a, b = by_name.get((ours, "POST", conns)), by_name.get((theirs, "POST", conns))
            if a and b:
                print(
                    f"  {conns:>3} conns: {ours} / {theirs}: {a[4][0] / b[4][0]:.2f}x req/s, "
                    f"{a[5]:.1f} vs {b[5]:.1f} us/req"
                )
    if "headline" in results:
        print_headline(results["headline"], duration)  # type: ignore[arg-type]
    results["relay_table"] = side_table(relay)
    del results["relay"]
    results["gateway_table"] = side_table(gateway)
    del results["gateway"]
    access: dict[str, int] = results["access log"]  # type: ignore[assignment]
    print(
        f"\n{DEFAULT_ROW}: {access['lines']} access-log lines written, {access['dropped']} dropped "
        "(signing_proxy_access_log_dropped_total)"
    )
    print(
        "\nHTTPS through intercepted CONNECT, default configuration (keep-alive tunnels, POST 1 KiB; "
        "load from bench/https_load.py)"
    )
    https: list[dict[str, float]] = results["https"]  # type: ignore[assignment]
    for row in https:
        print(
            f"  {row['connections']:>3.0f} tunnels: {row['rps']:>7.0f} req/s  p50 {row['p50_ms']:.2f} ms  "
            f"p99 {row['p99_ms']:.2f} ms  proxy cpu {row['proxy_cpu_us_per_request']:.1f} us/req"
        )
    print()
    print(
        f"proxy idle RSS: {results['proxy idle RSS (MiB)']:.1f} MiB; streaming 100 MiB: RSS growth "
        f"{growth_mib:.1f} MiB (from {idle_mib:.1f} MiB)"
    )
    for name, value in micro_figures().items():
        results[name] = value
        print(f"{name}: {value:.2f}")
    reasons = stats["reasons"] or ""
    print(f"origin verified {stats['verified']} sampled requests, {stats['failed']} failed {reasons}")
    results["sampled_verified"], results["sampled_failed"] = stats["verified"], stats["failed"]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 1 if stats["failed"] or not stats["verified"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
