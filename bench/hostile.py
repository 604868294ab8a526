"""Hostile-verifier benchmark: a relay under requests naming unique directories, beside legitimate traffic.

    .venv/bin/python bench/hostile.py [--count 10000] [--quick] [--json FILE]

Starts on 127.0.0.1 a fast origin (bench/origin.py), a directory host (this script with
``--serve-directories``: one aiohttp app on four ports) and ``signing-proxy run`` in relay mode
(``egress.allow_private: ["127.0.0.1/32"]`` so it may fetch from loopback), pinned to core 1 when
there are two cores, everything else on core 0. A legitimate agent (requests signed in-process with
``core``, its directory and empty revocation list on the directory host) sends steady traffic: a
quiet run, then the same traffic while an attacker (this script with ``--attack``) sends ``--count``
requests, each validly shaped and signed but naming its own ``Signature-Agent``: directories that
are valid, garbage, too large, slow, redirecting, with an object as ``alg``, with a key the request
does not use, and revocation lists that name the legitimate agent's key, are huge, slow or garbage.
Then a quiet run again. The relay runs its default configuration (access log on, the fetch
budget ``verify.fetches_per_s``); ``--fetches-per-s 0`` shows it without the budget, where every
attacker request costs a fetch.

Prints the relay's RSS before and after (issue 15 target: growth <= 20 MiB), the legitimate
requests' p50/p99 under attack against the quiet run (target <= 1.5x) and how many legitimate
requests were accepted (all must be: exit status 1 otherwise). Bounded in time and count; stops
every process it started, by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Required, TypedDict

from signing_proxy.core.b64 import b64url_decode, b64url_encode
from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import PublicKey, SigningKey
from signing_proxy.core.keys import (
    DIRECTORY_PATH,
    Directory,
    DirectoryKey,
    RevocationList,
    render_directory,
    render_revocation_list,
)
from signing_proxy.core.signatures import Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_absolute_uri

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
# One attacker request in twenty of each kind (index % 20), so every run mixes them the same way.
KINDS = (
    *["poison"] * 5,  # valid directory whose revocation_url lists the legitimate agent's key
    "poison-big",  # the same, in a list of --big-list thumbprints (default 2,000: ~90 KB)
    *["valid"] * 2,  # a valid directory of its own: the request is accepted and forwarded
    *["garbage"] * 2,  # not JSON
    "alg-object",  # "alg": {} (an unhashable value where a string belongs)
    "huge",  # 100 KiB, over the 64 KiB directory limit
    "status-404",
    "status-500",
    "slow-directory",  # answers after --slow-s, past the relay's fetch timeout
    "slow-revocations",
    "garbage-revocations",
    "redirect",  # 302 to the legitimate directory: must not be followed
    "unknown-keyid",  # a valid directory without the key the request names
    "many-keys",  # 64 keys
)
FETCH_TIMEOUT_S = 2.0  # egress.fetch_timeout_s of the relay under test
BODY = b'{"ver":"1.0","op":"bench"}'
REQUEST_TIMEOUT_S = 30.0  # one exchange through the relay; past it the request counts as "timeout"


CORES = len(os.sched_getaffinity(0))  # read before this process pins itself to core 0


def pin(core: int) -> list[str]:
    return ["taskset", "-c", str(core)] if CORES >= 2 and shutil.which("taskset") else []


def yielding() -> list[str]:
    """The attack's own generators (attacker, directory host) run at nice 10 on the shared core 0:
    when they and the legitimate client or the origin wake together, the legitimate side runs
    first, so the figures measure the relay under attack, not the harness queueing on its core."""
    return ["nice", "-n", "10"] if shutil.which("nice") else []


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def core_ticks() -> dict[str, tuple[int, int]]:
    """Per core: (busy, total) jiffies from /proc/stat, whoever ran there (other load shows too)."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name != "cpu":
            ticks = [int(v) for v in values[:8]]
            out[name] = (sum(ticks) - ticks[3] - ticks[4], sum(ticks))  # minus idle and iowait
    return out


def busy_percent(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> str:
    return ", ".join(
        f"{name} {100 * (after[name][0] - b[0]) / max(after[name][1] - b[1], 1):.0f} %"
        for name, b in sorted(before.items())
    )


def attacker_key(index: int) -> SigningKey:
    return SigningKey.from_seed(hashlib.sha256(b"hostile-bench attacker %d" % index).digest())


# ------------------------------------------------------------------------------------------------
# Requests: signed in-process, sent as raw HTTP/1.1 over keep-alive connections


def signed_request(key: SigningKey, agent_base: str, url: str) -> bytes:
    """An absolute-form POST for a forward proxy, signed by ``key`` as an agent named by ``agent_base``."""
    now = int(time.time())
    fields = Fields(
        [
            ("Content-Type", "application/json"),
            ("Content-Digest", content_digest(BODY)),
            ("Authorization", "Bearer bench"),
            ("Signature-Agent", f'"{agent_base}"'),
        ]
    )
    target = parse_absolute_uri(url)
    member = sign_message(Message("POST", target, fields), key, created=now, expires=now + 60)
    attach_signature(fields, member)
    head = f"POST {url} HTTP/1.1\r\nHost: {target.authority}\r\nContent-Length: {len(BODY)}\r\n"
    return (head + "".join(f"{n}: {v}\r\n" for n, v in fields) + "\r\n").encode() + BODY


class Connection:
    """One keep-alive connection to the relay, reopened after a close or a failure."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def exchange(self, raw: bytes) -> tuple[int, bytes]:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                if self.writer is None:
                    self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
                assert self.reader is not None
                self.writer.write(raw)
                head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                status = int(head.split(" ", 2)[1])
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in head.split("\r\n")[1:] if line)
                }
                body = await self._body(headers)
        except BaseException:
            self.close()
            raise
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, body

    async def _body(self, headers: dict[str, str]) -> bytes:
        assert self.reader is not None
        if "content-length" in headers:
            return await self.reader.readexactly(int(headers["content-length"]))
        if "chunked" in headers.get("transfer-encoding", "").lower():
            chunks = []
            while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
                chunks.append(await self.reader.readexactly(size + 2))
            await self.reader.readuntil(b"\r\n")
            return b"".join(c[:-2] for c in chunks)
        body = await self.reader.read()
        self.close()
        return body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def outcome(status: int, body: bytes) -> str:
    """``accepted`` for a 200 from the origin, otherwise the status and the problem's reason."""
    if status == 200:
        return "accepted"
    try:
        return f"{status} {json.loads(body).get('reason', '?')}"
    except (ValueError, AttributeError):
        return f"{status} (no problem body)"


# ------------------------------------------------------------------------------------------------
# Role: the directory host (--serve-directories)


def serve_directories(args: argparse.Namespace) -> None:
    from aiohttp import web

    agent = PublicKey.from_raw(b64url_decode(args.agent_x))
    filler = [b64url_encode(hashlib.sha256(b"filler %d" % n).digest()) for n in range(args.big_list)]
    hits: Counter[str] = Counter()

    def window(key: PublicKey) -> DirectoryKey:
        now = int(time.time())
        return DirectoryKey(key, now - 60, now + 86_400)

    def answer(body: bytes, cache_control: str = "max-age=300") -> web.Response:
        return web.Response(
            body=body, content_type="application/json", headers={"Cache-Control": cache_control}
        )

    async def legit_directory(request: web.Request) -> web.Response:
        hits["legit directory"] += 1
        return answer(
            render_directory(Directory((window(agent),), f"http://{request.host}/legit/revoked.json"))
        )

    async def legit_revocations(_request: web.Request) -> web.Response:
        hits["legit revocations"] += 1
        return answer(render_revocation_list(RevocationList(int(time.time()), frozenset())), "max-age=60")

    async def attacker_directory(request: web.Request) -> web.Response:
        index = int(request.match_info["index"])
        kind = KINDS[index % len(KINDS)]
        hits[f"directory {kind}"] += 1
        own = window(attacker_key(index).public)
        revocations = f"http://{request.host}/a/{index}/revoked.json"
        if kind == "garbage":
            return answer(b"{not json at all")
        if kind == "alg-object":
            return answer(json.dumps({"keys": [{**own.jwk(), "alg": {}}]}).encode())
        if kind == "huge":
            return answer(b'{"keys":[],"pad":"' + b"x" * 100_000 + b'"}')
        if kind.startswith("status-"):
            return web.Response(status=int(kind[7:]), text="no")
        if kind == "redirect":
            raise web.HTTPFound(f"http://{request.host}/legit{DIRECTORY_PATH}")
        if kind == "slow-directory":
            await asyncio.sleep(args.slow_s)
        if kind == "unknown-keyid":
            own = window(attacker_key(index + 1).public)
        keys: tuple[DirectoryKey, ...] = (own,)
        if kind == "many-keys":
            keys = (own, *(window(attacker_key(index * 64 + n + 10**7).public) for n in range(63)))
        with_list = kind.startswith(("poison", "slow-rev", "garbage-rev"))
        return answer(render_directory(Directory(keys, revocations if with_list else None)))

    async def attacker_revocations(request: web.Request) -> web.Response:
        kind = KINDS[int(request.match_info["index"]) % len(KINDS)]
        hits[f"revocations {kind}"] += 1
        if kind == "garbage-revocations":
            return answer(b"[1, 2")
        if kind == "slow-revocations":
            await asyncio.sleep(args.slow_s)
        revoked = {agent.thumbprint, *(filler if kind == "poison-big" else ())}
        return answer(
            render_revocation_list(RevocationList(int(time.time()), frozenset(revoked))), "max-age=0"
        )

    async def stats(_request: web.Request) -> web.Response:
        return web.json_response(dict(hits))

    async def main() -> None:
        app = web.Application()
        app.router.add_get(f"/legit{DIRECTORY_PATH}", legit_directory)
        app.router.add_get("/legit/revoked.json", legit_revocations)
        app.router.add_get(r"/a/{index:\d+}" + DIRECTORY_PATH, attacker_directory)
        app.router.add_get(r"/a/{index:\d+}/revoked.json", attacker_revocations)
        app.router.add_get("/stats", stats)
        runner = web.AppRunner(app, access_log=None, handle_signals=True)
        await runner.setup()
        for _ in range(args.sites):
            await web.TCPSite(runner, "127.0.0.1", 0, backlog=1024).start()
        ports: list[int] = [address[1] for address in runner.addresses]  # one per site, in start order
        print(f"directories listening on {','.join(map(str, ports))}", flush=True)
        try:
            await asyncio.sleep(args.lifetime_s)  # stops by itself even if its parent died
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):
        asyncio.run(main())


# ------------------------------------------------------------------------------------------------
# Role: the attacker (--attack)


def attack(args: argparse.Namespace) -> None:
    dir_ports = [int(p) for p in args.dir_ports.split(",")]
    results: Counter[str] = Counter()

    async def main() -> float:
        start = time.monotonic()
        deadline = start + args.lifetime_s
        counter = iter(range(args.count))

        async def worker() -> None:
            conn = Connection(args.relay_port)
            for index in counter:
                due = start + index / args.rate
                if time.monotonic() > deadline:
                    results["not sent (deadline)"] += 1
                    continue
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                base = f"http://127.0.0.1:{dir_ports[index % len(dir_ports)]}/a/{index}"
                raw = signed_request(attacker_key(index), base, f"http://127.0.0.1:{args.origin_port}/attack")
                try:
                    results[outcome(*await conn.exchange(raw))] += 1
                except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                    results[f"error {type(exc).__name__}"] += 1
            conn.close()

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        return time.monotonic() - start

    elapsed_s = asyncio.run(main())
    print(json.dumps({"outcomes": dict(results), "elapsed_s": elapsed_s}), flush=True)


# ------------------------------------------------------------------------------------------------
# The run


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


def wait_line(log: Path, pattern: str, proc: subprocess.Popen[bytes], limit_s: float = 20.0) -> str:
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


@dataclass
class Run:
    """One run of legitimate traffic: latencies through the relay, outcomes, and the control probe."""

    latencies: list[float] = field(default_factory=list)  # ms, signing excluded
    outcomes: Counter[str] = field(default_factory=Counter)
    control: list[float] = field(default_factory=list)  # ms, straight to the origin: the harness's noise

    def refused(self) -> Counter[str]:
        return Counter({k: v for k, v in self.outcomes.items() if k != "accepted"})


@dataclass
class Legit:
    """The legitimate agent: requests signed in-process, paced, over one keep-alive connection; after
    each, an unsigned GET straight to the origin measures what the client side alone adds."""

    conn: Connection
    control: Connection
    key: SigningKey
    base: str  # its Signature-Agent
    url: str
    rate: float

    async def run(self, stop: Callable[[int], bool]) -> Run:
        """Paced requests until ``stop(sent)``."""
        run = Run()
        probe = f"GET /control HTTP/1.1\r\nHost: {self.url.split('/')[2]}\r\n\r\n".encode()
        start, sent = time.monotonic(), 0
        while not stop(sent):
            await asyncio.sleep(max(0.0, start + sent / self.rate - time.monotonic()))
            raw = signed_request(self.key, self.base, self.url)
            began = time.perf_counter()
            try:
                result = outcome(*await self.conn.exchange(raw))
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                result = f"error {type(exc).__name__}"
            run.latencies.append((time.perf_counter() - began) * 1000)
            run.outcomes[result] += 1
            began = time.perf_counter()
            with contextlib.suppress(OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
                await self.control.exchange(probe)
                run.control.append((time.perf_counter() - began) * 1000)
            sent += 1
        return run


def percentile(values: list[float], pct: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(pct) - 1]


class AttackerFigures(TypedDict):
    """What the ``--attack`` child prints as JSON when it is done."""

    outcomes: dict[str, int]
    elapsed_s: float


class Figures(TypedDict, total=False):
    """What ``run`` measures of the relay, the attacker and the directory host, for ``report``."""

    machine: Required[str]
    rss_before_kib: int
    relay_cpu_during_attack: float
    cores_busy_during_attack: str
    rss_after_attack_kib: int
    rss_after_kib: int
    rss_peak_kib: int
    attacker: AttackerFigures
    directory_host_hits: dict[str, int]


def run(args: argparse.Namespace) -> int:
    if CORES >= 2:
        os.sched_setaffinity(0, {0})  # the legitimate client shares core 0 with origin and attacker
    agent = SigningKey.generate()
    figures: Figures = {"machine": f"{CORES} cores, Python {sys.version.split()[0]}"}
    with tempfile.TemporaryDirectory() as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        lifetime = str(args.time_limit_s + 60)
        origin_log, dirs_log, relay_log = tmp / "origin.log", tmp / "dirs.log", tmp / "relay.log"
        origin = stack.enter_context(child([*pin(0), PY, "bench/origin.py", "--port", "0"], origin_log))
        dirs = stack.enter_context(
            child(
                # "=": a base64url value may start with "-", which argparse would take for an option
                [*yielding(), *pin(0), PY, "bench/hostile.py", "--serve-directories",
                 f"--agent-x={agent.public.jwk()['x']}", "--sites", "4", "--slow-s", str(args.slow_s),
                 "--big-list", str(args.big_list),
                 "--lifetime-s", lifetime],
                dirs_log,
            )
        )  # fmt: skip
        origin_port = int(wait_line(origin_log, r"origin listening on (\d+)", origin))
        dir_ports = wait_line(dirs_log, r"directories listening on ([\d,]+)", dirs)
        relay_key = tmp / "relay.pem"
        relay_key.write_bytes(SigningKey.generate().to_pem())
        relay_key.chmod(0o600)
        config = tmp / "relay.yaml"
        config.write_text(
            f"mode: relay\nlisten: 127.0.0.1:0\ndata_dir: {tmp / 'data'}\nsigning:\n  label: broker\n"
            "relay:\n  max_hops: 3\n"  # the default log: access log on, info
            f'egress:\n  allow_private: ["127.0.0.1/32"]\n  fetch_timeout_s: {FETCH_TIMEOUT_S}\n'
            + ("" if args.fetches_per_s is None else f"verify:\n  fetches_per_s: {args.fetches_per_s}\n")
        )
        relay = stack.enter_context(
            child(
                [*pin(1), PY, "-m", "signing_proxy", "run", "--config", str(config), "--key", str(relay_key)],
                relay_log,
            )
        )
        relay_port = int(wait_line(relay_log, r"listening on http://127\.0\.0\.1:(\d+)", relay))
        base = f"http://127.0.0.1:{dir_ports.split(',')[0]}/legit"
        url = f"http://127.0.0.1:{origin_port}/legit"
        attack_cmd = [
            *yielding(), *pin(0), PY, "bench/hostile.py", "--attack", "--relay-port", str(relay_port),
            "--origin-port", str(origin_port), "--dir-ports", dir_ports, "--count", str(args.count),
            "--rate", str(args.rate), "--concurrency", str(args.concurrency),
            "--lifetime-s", str(args.time_limit_s),
        ]  # fmt: skip

        async def phases() -> dict[str, Run]:
            legit = Legit(Connection(relay_port), Connection(origin_port), agent, base, url, args.legit_rate)
            done: dict[str, Run] = {}
            done["warm-up"] = await legit.run(lambda n: n >= 20)  # directory fetched, connection open
            done["quiet"] = await legit.run(lambda n: n >= args.quiet)
            figures["rss_before_kib"] = rss_kib(relay.pid)
            cpu0, wall0, ticks0 = cpu_seconds(relay.pid), time.monotonic(), core_ticks()
            with (tmp / "attack.json").open("wb") as out:
                attacker = await asyncio.create_subprocess_exec(*attack_cmd, stdout=out, cwd=ROOT)
                try:
                    done["attack"] = await legit.run(lambda _n: attacker.returncode is not None)
                finally:
                    if attacker.returncode is None:
                        attacker.kill()
                    await asyncio.wait_for(attacker.wait(), 10)
            figures["relay_cpu_during_attack"] = (cpu_seconds(relay.pid) - cpu0) / (time.monotonic() - wall0)
            figures["cores_busy_during_attack"] = busy_percent(ticks0, core_ticks())
            figures["rss_after_attack_kib"] = rss_kib(relay.pid)
            done["after"] = await legit.run(lambda n: n >= args.after)
            figures["rss_after_kib"] = rss_kib(relay.pid)
            figures["rss_peak_kib"] = rss_kib(relay.pid, "VmHWM")
            legit.conn.close()
            legit.control.close()
            return done

        runs = asyncio.run(asyncio.wait_for(phases(), args.time_limit_s + 120))
        figures["attacker"] = json.loads((tmp / "attack.json").read_text() or "{}")
        with contextlib.suppress(OSError, ValueError):
            stats_url = f"http://127.0.0.1:{dir_ports.split(',')[0]}/stats"
            figures["directory_host_hits"] = json.loads(urlopen_text(stats_url))
        relay_alive = relay.poll() is None
    return report(args, figures, runs, relay_alive)


def urlopen_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def run_summary(run: Run) -> dict[str, object]:
    return {
        "requests": len(run.latencies),
        "p50_ms": percentile(run.latencies, 50),
        "p99_ms": percentile(run.latencies, 99),
        "outcomes": dict(run.outcomes),
        "control_p50_ms": percentile(run.control, 50),
        "control_p99_ms": percentile(run.control, 99),
    }


def report(
    args: argparse.Namespace,
    figures: Figures,
    runs: dict[str, Run],
    relay_alive: bool,
) -> int:
    before, after_attack, after = (
        figures["rss_before_kib"] / 1024,
        figures["rss_after_attack_kib"] / 1024,
        figures["rss_after_kib"] / 1024,
    )
    growth = max(after_attack, after) - before
    attacker = figures["attacker"]["outcomes"]
    elapsed_s = float(figures["attacker"]["elapsed_s"])
    print(
        f"\nhostile verifier — {figures['machine']}; relay on core 1, origin + directory host + attacker "
        f"+ legitimate client on core 0; relay fetch timeout {FETCH_TIMEOUT_S:g} s, fetch budget "
        f"{'the default (verify.fetches_per_s)' if args.fetches_per_s is None else args.fetches_per_s}\n"
        f"attacker: {args.count} requests naming unique Signature-Agent directories, {args.concurrency} "
        f"connections, paced at {args.rate:g}/s: sent in {elapsed_s:.1f} s; relay CPU during the attack "
        f"{figures['relay_cpu_during_attack'] * 100:.0f} % of a core; cores busy (any process): "
        f"{figures['cores_busy_during_attack']}"
    )
    for name, count in sorted(attacker.items(), key=lambda kv: -kv[1]):
        print(f"    {count:>6}  {name}")
    peak = figures["rss_peak_kib"] / 1024
    print(
        f"\nrelay RSS: {before:.1f} MiB before the attack, {after_attack:.1f} MiB right after, "
        f"{after:.1f} MiB after the last quiet run (peak {peak:.1f} MiB)"
    )
    verdict = "ok" if growth <= 20 else "MISSED"
    print(f"relay RSS growth: {growth:.1f} MiB (target <= 20 MiB: {verdict})")
    print(f"\nlegitimate traffic at {args.legit_rate:g}/s over one keep-alive connection:")
    print(
        f"  {'run':8} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} {'accepted':>9} {'refused':>8} |"
        f" control: {'p50 ms':>6} {'p99 ms':>7}"
    )
    refused_total: Counter[str] = runs["warm-up"].refused()
    for name in ("quiet", "attack", "after"):
        run = runs[name]
        refused_total.update(run.refused())
        print(
            f"  {name:8} {len(run.latencies):>8} {percentile(run.latencies, 50):>8.2f} "
            f"{percentile(run.latencies, 99):>8.2f} {run.outcomes['accepted']:>9} "
            f"{sum(run.refused().values()):>8} |          {percentile(run.control, 50):>6.2f} "
            f"{percentile(run.control, 99):>7.2f}"
        )
    quiet, attack = runs["quiet"].latencies, runs["attack"].latencies
    p50_ratio = percentile(attack, 50) / percentile(quiet, 50)
    p99_ratio = percentile(attack, 99) / percentile(quiet, 99)
    verdict = "ok" if max(p50_ratio, p99_ratio) <= 1.5 else "MISSED"
    print(f"under attack / quiet: p50 x{p50_ratio:.2f}, p99 x{p99_ratio:.2f} (target <= 1.5x: {verdict})")
    print("  (control: an unsigned GET straight to the origin after each request; when it degrades too,")
    print("   the client's core is saturated and part of the ratio is the harness, not the relay)")
    if refused_total:
        print("LEGITIMATE REQUESTS REFUSED:")
        for name, count in refused_total.most_common():
            print(f"    {count:>6}  {name}")
    else:
        print("every legitimate request was accepted")
    hits = figures.get("directory_host_hits") or {}
    print(f"\ndirectory host served: {', '.join(f'{k} {v}' for k, v in sorted(hits.items()))}")
    if not relay_alive:
        print("THE RELAY EXITED DURING THE RUN")
    summary = {
        **figures,
        "rss_growth_mib": growth,
        "p50_ratio": p50_ratio,
        "p99_ratio": p99_ratio,
        "legit": {name: run_summary(r) for name, r in runs.items()},
        "legit_refused": sum(refused_total.values()),
        "relay_alive": relay_alive,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 1 if refused_total or not relay_alive else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=10_000, help="attacker requests (default 10000)")
    # 150/s leaves core 0 (attacker, directory host, origin, client) some room: above it the client's
    # own core saturates and the latency ratio starts measuring the harness (see the control column)
    parser.add_argument("--rate", type=float, default=150, help="attacker requests per second (default 150)")
    parser.add_argument("--concurrency", type=int, default=64, help="attacker connections (default 64)")
    parser.add_argument("--legit-rate", type=float, default=50, help="legitimate requests per second")
    parser.add_argument("--quiet", type=int, default=500, help="legitimate requests in each quiet run")
    parser.add_argument("--after", type=int, default=300, help="legitimate requests after the attack")
    parser.add_argument("--slow-s", type=float, default=FETCH_TIMEOUT_S + 1, help="delay of slow documents")
    parser.add_argument("--big-list", type=int, default=2000, help="thumbprints in a poison-big list")
    parser.add_argument("--time-limit-s", type=float, default=600, help="the attack stops after this long")
    parser.add_argument(
        "--fetches-per-s",
        type=float,
        help="the relay's verify.fetches_per_s (default: the relay's own default; 0: unbounded)",
    )
    parser.add_argument("--quick", action="store_true", help="300 attacker requests, short quiet runs")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--serve-directories", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--attack", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--agent-x", help=argparse.SUPPRESS)
    parser.add_argument("--sites", type=int, default=4, help=argparse.SUPPRESS)
    parser.add_argument("--lifetime-s", type=float, default=900, help=argparse.SUPPRESS)
    parser.add_argument("--relay-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--origin-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dir-ports", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_directories:
        serve_directories(args)
        return 0
    if args.attack:
        attack(args)
        return 0
    if args.quick:
        args.count, args.rate, args.concurrency = min(args.count, 300), 100, 16
        args.quiet, args.after, args.time_limit_s = 100, 50, min(args.time_limit_s, 120)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
