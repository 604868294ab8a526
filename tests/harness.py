"""Loopback harness: a verifying origin, and ``signing-proxy run`` as a real child process.

The origin checks every request it receives twice — with our ``core`` verifier and with the
independent ``http-message-signatures`` package — and records the verdicts, so a test can assert
on what really arrived. Everything binds 127.0.0.1 port 0, every wait is bounded, and each
helper stops what it started (by PID).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import aiohttp
import yaml
from aiohttp import web

from signing_proxy.core.errors import VerificationError
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import PublicKey, SigningKey
from signing_proxy.core.keys import (
    DIRECTORY_MEDIA_TYPE,
    DIRECTORY_PATH,
    parse_directory,
    parse_revocation_list,
)
from signing_proxy.core.signatures import Message, VerificationKey, verify_stack
from signing_proxy.core.uri import parse_received_uri
from tests.oracle import SPEC_FIVE, WEB_BOT_AUTH_REQUIRED, oracle_verify

WAIT_S = 15.0
DIRECT = {"http": "", "https": ""}  # requests' proxies= for "not through HTTP_PROXY" ({} merges it back in)


def run_cli(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None, timeout_s: float = 30
) -> subprocess.CompletedProcess[str]:
    """``python -m signing_proxy ARGS`` with this environment (minus any SIGNING_PROXY_*) plus ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SIGNING_PROXY_")}
    return subprocess.run(
        [sys.executable, "-m", "signing_proxy", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env={**base, **(env or {})},
        input=stdin,
    )


@contextlib.contextmanager
def started(command: str, *args: str, until: str = "listening on") -> Iterator[list[str]]:
    """``python -m signing_proxy COMMAND ARGS`` (no ``*_proxy`` variables): yield its stderr lines up
    to the first that holds ``until``, each waited for at most ``WAIT_S``; stopped by PID after."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "signing_proxy", command, *args], stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stderr is not None
    stderr = proc.stderr
    arrived: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in stderr:
            arrived.put(line)
        arrived.put(None)  # the end: the process closed its stderr

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        lines: list[str] = []
        while not lines or until not in lines[-1]:
            try:
                line = arrived.get(timeout=WAIT_S)
            except queue.Empty:
                said = "".join(lines)
                raise AssertionError(f"{command} said nothing for {WAIT_S} s after: {said}") from None
            if line is None:
                raise AssertionError(f"{command} ended before saying {until!r}: {''.join(lines)}")
            lines.append(line)
        yield lines
    finally:
        stop_process(proc)
        reader.join(WAIT_S)
        stderr.close()


def started_run(*args: str) -> contextlib.AbstractContextManager[list[str]]:
    """``started("run", *args)``: the proxy, up to its first "listening on" line."""
    return started("run", *args)


def wait_for(condition: Callable[[], bool], what: str, limit_s: float = WAIT_S) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


async def until(ready: Callable[[], object], what: str = "the condition", limit_s: float = WAIT_S) -> None:
    """``wait_for`` on an event loop: poll a state that has no event of its own, the loop running."""
    deadline = time.monotonic() + limit_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def wait_port(port: int, limit_s: float = WAIT_S) -> None:
    """Wait until something accepts connections on 127.0.0.1:``port``."""

    def accepting() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        except OSError:
            return False
        return True

    wait_for(accepting, f"127.0.0.1:{port} to accept connections", limit_s)


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM a process we started (by its PID), SIGKILL it if it has not ended in ``WAIT_S``."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(WAIT_S)


def children(pid: int) -> set[int]:
    """The live (not zombie) child processes of ``pid``, from ``/proc``."""
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.add(int(entry.name))
    return out


def free_port() -> int:
    """A free loopback port, for addresses that must be known before a process starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Arrival:
    """One request as the origin received it, with both verdicts."""

    method: str
    target_uri: str
    lines: list[tuple[str, str]]
    body: bytes
    verified: bool
    reason: str | None
    labels: list[str]
    oracle: str  # "ok" or the oracle's error
    keyids: list[str] = field(default_factory=list)
    directory_keyids: list[str] = field(default_factory=list)  # resolve_directories: keys served then

    def header(self, name: str) -> str | None:
        return Fields(self.lines).combined(name)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class OnItsOwnLoop:
    """``with``: start ``_run`` (which runs the server's own event loop and sets ``_loop``, then
    ``_ready`` once it serves) on a thread, and stop that loop on exit. For test servers."""

    thread_name = "server"
    _loop: asyncio.AbstractEventLoop | None
    _thread: threading.Thread | None
    _ready: threading.Event

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        if not self._ready.wait(WAIT_S):
            raise RuntimeError(f"{self.thread_name} did not start")
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(WAIT_S)


class VerifyingOrigin(OnItsOwnLoop):
    """An aiohttp origin on its own thread and loop that verifies every request it receives."""

    thread_name = "origin"

    def __init__(
        self,
        keys: dict[str, PublicKey] | None = None,
        *,
        tls: ssl.SSLContext | None = None,
        handler: Handler | None = None,
        now: Callable[[], float] = time.time,
        resolve_directories: bool = False,
        middlewares: Sequence[Any] = (),
    ) -> None:
        self.keys = keys or {}
        self.tls = tls
        self.handler = handler
        self.now = now
        # True: ignore ``keys``; find each request's keys at {Signature-Agent}/.well-known/... as
        # served at that moment (valid now, minus the revocation list), like a real verifier.
        self.resolve_directories = resolve_directories
        self.middlewares = tuple(middlewares)  # e.g. signature_middleware: requests it refuses never arrive
        self.arrivals: list[Arrival] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def url(self, path: str = "/") -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}{path}"

    def trust(self, *keys: SigningKey | PublicKey) -> None:
        for key in keys:
            public = key.public if isinstance(key, SigningKey) else key
            self.keys[public.thumbprint] = public

    def verify(
        self,
        method: str,
        target_uri: str,
        lines: list[tuple[str, str]],
        body: bytes,
        keys: dict[str, PublicKey] | None = None,
    ) -> Arrival:
        trusted = self.keys if keys is None else keys
        message = Message(method, parse_received_uri(target_uri), Fields(lines))  # as received
        verified, reason, labels, keyids, profile = False, None, [], [], "svc"
        try:
            stack = verify_stack(
                message,
                body,
                lambda e, _i: VerificationKey(trusted[e.keyid]) if e.keyid in trusted else None,
                now=self.now(),
            )
            verified, labels, keyids, profile = (
                True,
                [s.label for s in stack.signatures],
                [s.keyid for s in stack.signatures],
                stack.profile,
            )
        except VerificationError as exc:
            reason = exc.reason
        oracle = "not-run"
        if verified:
            try:
                oracle_verify(
                    method,
                    target_uri,
                    lines,
                    body,
                    {k: v.key for k, v in trusted.items()},
                    labels=labels,
                    require_components=SPEC_FIVE if profile == "svc" else WEB_BOT_AUTH_REQUIRED,
                )
                oracle = "ok"
            except Exception as exc:  # the oracle's own exception types
                oracle = f"{type(exc).__name__}: {exc}"
        return Arrival(method, target_uri, lines, body, verified, reason, labels, oracle, keyids)

    async def directory_keys(self, lines: list[tuple[str, str]]) -> tuple[dict[str, PublicKey], str | None]:
        """The keys of ``{Signature-Agent}/.well-known/http-message-signatures-directory`` as served
        now, whose window covers now and that its ``revocation_url`` does not list; or an error."""
        agent = Fields(lines).combined("signature-agent") or ""
        base = agent[1:-1] if len(agent) >= 2 and agent[0] == agent[-1] == '"' else agent
        if not base:
            return {}, "no-signature-agent"
        timeout = aiohttp.ClientTimeout(total=WAIT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(base.rstrip("/") + DIRECTORY_PATH) as resp:
                body = await resp.read()
                if resp.status != 200 or resp.headers.get("Content-Type") != DIRECTORY_MEDIA_TYPE:
                    return {}, f"directory-unavailable-{resp.status}"
            directory = parse_directory(body)
            revoked: frozenset[str] = frozenset()
            if directory.revocation_url:
                async with session.get(directory.revocation_url) as resp:
                    if resp.status != 200:
                        return {}, f"revocation-list-unavailable-{resp.status}"
                    revoked = parse_revocation_list(await resp.read()).revoked
        now = self.now()
        valid = (k for k in directory.keys if directory.find(k.thumbprint, now, revoked=revoked))
        return {k.thumbprint: k.public for k in valid}, None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        lines = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers]
        target = f"{self.scheme}://{request.headers.get('Host', '')}{request.raw_path}"
        if self.resolve_directories:
            keys, error = await self.directory_keys(lines)
            arrival = self.verify(request.method, target, lines, body, keys)
            arrival.directory_keyids = sorted(keys)
            if error is not None and not arrival.verified:
                arrival.reason = error
        else:
            arrival = self.verify(request.method, target, lines, body)
        self.arrivals.append(arrival)
        if self.handler is not None:
            return await self.handler(request)
        return web.json_response(
            {
                "verified": arrival.verified,
                "reason": arrival.reason,
                "labels": arrival.labels,
                "oracle": arrival.oracle,
            }
        )

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop

        async def start() -> None:
            app = web.Application(client_max_size=512 * 1024 * 1024, middlewares=self.middlewares)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.tls)
            await site.start()
            server = site._server
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

        loop.run_until_complete(start())
        self._ready.set()
        loop.run_forever()
        assert self._runner is not None
        loop.run_until_complete(self._runner.cleanup())
        loop.close()


class ProxyProcess:
    """``python -m signing_proxy run`` with a config written to a temp dir; stopped by PID."""

    def __init__(
        self,
        tmp: Path,
        config: dict[str, Any] | None = None,
        *,
        key: SigningKey | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        own_group: bool = False,
    ) -> None:
        """``own_group``: the proxy leads a new process group (a shell's job): its PID is the group's."""
        self.tmp = tmp
        self.own_group = own_group
        self.key = key or SigningKey.generate()
        self.config = {"listen": "127.0.0.1:0", "data_dir": str(tmp / "data"), **(config or {})}
        self.extra_args = extra_args
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.publish_port = 0  # publish.listen, when configured
        self.admin_port = 0  # admin.listen, when configured ("127.0.0.1:0" reads the bound port back)
        self.stderr_lines: list[str] = []
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def said(self, text: str) -> int:
        """How many of the proxy's stderr lines so far hold ``text``."""
        return sum(text in line for line in list(self.stderr_lines))

    def rewrite_config(self, **sections: Any) -> None:
        """Its configuration file written again with these sections replaced (then SIGHUP it)."""
        (self.tmp / "config.yaml").write_text(yaml.safe_dump({**self.config, **sections}))

    def __enter__(self) -> ProxyProcess:
        key_path = self.tmp / "agent-key.pem"
        if not key_path.exists():
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(self.key.to_pem())
        self.config.setdefault("signing", {}).setdefault("key", str(key_path))
        config_path = self.tmp / "config.yaml"
        config_path.write_text(yaml.safe_dump(self.config))
        env = {**os.environ, **(self.env or {})}
        for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
            env.pop(name, None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "signing_proxy", "run", "--config", str(config_path), *self.extra_args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=self.own_group,
        )
        ready = threading.Event()

        def read() -> None:
            assert self.proc is not None
            assert self.proc.stderr is not None
            for raw in self.proc.stderr:
                line = raw.decode(errors="replace").rstrip()
                self.stderr_lines.append(line)
                if "publishing on http://" in line and not self.publish_port:  # printed before "listening"
                    self.publish_port = int(line.rsplit(":", 1)[1].split()[0])
                if " admin on http://" in line and not self.admin_port:  # printed before "listening"
                    self.admin_port = int(line.rsplit(":", 1)[1].split()[0])
                if "listening on http://" in line and not self.port:
                    self.port = int(line.split("listening on http://", 1)[1].split()[0].rsplit(":", 1)[1])
                    ready.set()
            ready.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not ready.wait(WAIT_S) or not self.port:
            self.__exit__()
            raise RuntimeError("proxy did not start:\n" + "\n".join(self.stderr_lines))
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.proc is not None:
            stop_process(self.proc)
        if self._reader is not None:
            self._reader.join(WAIT_S)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

    def _status_kib(self, field: str) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise RuntimeError(f"no {field}")

    def rss_kib(self) -> int:
        return self._status_kib("VmRSS")

    def hwm_kib(self) -> int:
        """Peak resident set size so far."""
        return self._status_kib("VmHWM")

    def access_lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.stderr_lines:
            start = line.find("{")
            if start >= 0:
                with contextlib.suppress(ValueError):
                    doc = json.loads(line[start:])
                    if doc.get("event") == "request":
                        out.append(doc)
        return out


@contextlib.contextmanager
def proxy_env(monkeypatch: Any, proxy_url: str, *, https: bool = False) -> Iterator[None]:
    """Point every client at the proxy through the environment only."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy") + (("HTTPS_PROXY", "https_proxy") if https else ()):
        monkeypatch.setenv(name, proxy_url)
    yield


def run_bench(script: str, tmp: Path, *args: str, timeout_s: float = 240) -> tuple[dict[str, Any], str]:
    """``python bench/SCRIPT ARGS --json FILE``: asserts it exits 0; the figures it wrote, and its output."""
    out = tmp / "figures.json"
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, str(root / "bench" / script), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        cwd=root,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures: dict[str, Any] = json.loads(out.read_text())
    return figures, result.stdout
