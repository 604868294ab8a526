"""The forward proxy through real sockets: real clients configured only by HTTP_PROXY, a real
``signing-proxy run`` process, and an origin that verifies every request with our verifier and
with the independent ``http-message-signatures``."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import requests

from signing_proxy.core.jwk import SigningKey
from tests.harness import DIRECT, WAIT_S, ProxyProcess, VerifyingOrigin, proxy_env, wait_for

pytestmark = pytest.mark.integration

KEY = SigningKey.generate()
CLIENTS = (
    ["requests", "httpx", "aiohttp", "curl"] if shutil.which("curl") else ["requests", "httpx", "aiohttp"]
)
ONE_MIB = os.urandom(1024 * 1024)


@pytest.fixture(scope="module")
def origin() -> Iterator[VerifyingOrigin]:
    with VerifyingOrigin() as server:
        server.trust(KEY)
        yield server


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    config = {"log": {"format": "json"}, "signing": {"signature_agent": "https://agent.example"}}
    with ProxyProcess(tmp_path_factory.mktemp("proxy"), config, key=KEY) as process:
        yield process


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, proxy: ProxyProcess, origin: VerifyingOrigin) -> Iterator[None]:
    origin.arrivals.clear()
    with proxy_env(monkeypatch, proxy.url):
        yield


def send(  # noqa: PLR0917 - a test helper mirroring client call shapes
    client: str,
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    chunked: bool = False,
) -> tuple[int, bytes]:
    """Send through the proxy named only by the environment; return (status, body)."""
    headers = headers or {}
    if client == "requests":
        data: Any = body
        if chunked:
            data = iter([body[: len(body) // 2], body[len(body) // 2 :]]) if body else iter([b""])
        r = requests.request(method, url, data=data, headers=headers, timeout=WAIT_S)
        return r.status_code, r.content
    if client == "httpx":
        content: Any = body
        if chunked:
            content = iter([body or b""])
        with httpx.Client(trust_env=True, timeout=WAIT_S) as c:
            resp = c.request(method, url, content=content, headers=headers)
            return resp.status_code, resp.content
    if client == "aiohttp":

        async def go() -> tuple[int, bytes]:
            async def gen() -> Any:
                yield body or b""

            payload: Any = gen() if chunked else body
            timeout = aiohttp.ClientTimeout(total=WAIT_S)
            async with (
                aiohttp.ClientSession(trust_env=True, timeout=timeout) as s,
                s.request(method, url, data=payload, headers=headers) as resp,
            ):
                return resp.status, await resp.read()

        return asyncio.run(go())
    if client == "curl":
        args = [
            "curl",
            "-sS",
            "--max-time",
            str(int(WAIT_S)),
            "-X",
            method,
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
        ]
        if method == "HEAD":
            args = [
                "curl",
                "-sS",
                "--max-time",
                str(int(WAIT_S)),
                "-I",
                "-o",
                "/dev/null",
                "-w",
                "\n%{http_code}",
            ]
        for name, value in headers.items():
            args += ["-H", f"{name}: {value}"]
        if chunked:
            args += ["-H", "Transfer-Encoding: chunked"]
        if body is not None:
            args += ["--data-binary", "@-"]
        done = subprocess.run(
            [*args, url],
            input=body or b"",
            capture_output=True,
            timeout=WAIT_S,
            check=True,
            env=dict(os.environ),
        )
        out, _, code = done.stdout.rpartition(b"\n")
        return int(code), out
    raise AssertionError(client)


def use_proxy(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("HTTP_PROXY", url)
    monkeypatch.setenv("http_proxy", url)


def last(origin: VerifyingOrigin) -> Any:
    assert origin.arrivals, "nothing reached the origin"
    return origin.arrivals[-1]


def assert_signed(arrival: Any, method: str, url: str, agent: str = '"https://agent.example"') -> None:
    assert arrival.verified, arrival.reason
    assert arrival.oracle == "ok", arrival.oracle
    assert arrival.method == method
    assert arrival.target_uri == url
    assert arrival.labels == ["agent"]
    assert arrival.keyids == [KEY.thumbprint]
    assert arrival.header("signature-agent") == agent


# --- every client, every method, every body shape -----------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("method", ["GET", "HEAD", "DELETE", "OPTIONS"])
def test_bodyless_methods_arrive_signed(client: str, method: str, origin: VerifyingOrigin) -> None:
    url = origin.url("/path/a%2Fb?q=x%20y&x=1")
    status, _ = send(client, method, url)
    assert status == 200
    arrival = last(origin)
    assert_signed(arrival, method, url)
    assert arrival.header("content-digest") == "sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:"
    assert arrival.header("authorization") == ""


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
@pytest.mark.parametrize("body", [b"", b'{"hello": "world"}', ONE_MIB], ids=["empty", "small", "1MiB"])
def test_body_methods_arrive_signed_with_exact_digest(
    client: str, method: str, body: bytes, origin: VerifyingOrigin
) -> None:
    url = origin.url("/svc.v1.ExchangeService/DiscoverResources")
    status, response = send(client, method, url, body)
    assert status == 200, response[:300]
    arrival = last(origin)
    assert_signed(arrival, method, url)
    assert arrival.body == body


@pytest.mark.parametrize("client", CLIENTS)
def test_chunked_request_body_is_buffered_and_signed(client: str, origin: VerifyingOrigin) -> None:
    url = origin.url("/upload")
    body = b"chunk-one/" * 5000
    status, _ = send(client, "POST", url, body, chunked=True)
    assert status == 200
    arrival = last(origin)
    assert_signed(arrival, "POST", url)
    assert arrival.body == body
    assert arrival.header("transfer-encoding") is None  # re-framed with Content-Length


@pytest.mark.parametrize("client", CLIENTS)
def test_client_authorization_is_kept_and_covered(client: str, origin: VerifyingOrigin) -> None:
    url = origin.url("/private")
    status, _ = send(client, "GET", url, headers={"Authorization": "Bearer agent-token"})
    assert status == 200
    arrival = last(origin)
    assert_signed(arrival, "GET", url)
    assert arrival.header("authorization") == "Bearer agent-token"


def test_forged_signature_headers_from_the_agent_are_replaced(origin: VerifyingOrigin) -> None:
    url = origin.url("/x")
    forged = {
        "Signature": "agent=:AAAA:",
        "Signature-Input": 'agent=("@method");keyid="x"',
        "Content-Digest": "sha-256=:AAAA:",
        "Signature-Agent": '"https://evil.example"',
    }
    status, _ = send("requests", "POST", url, b"data", headers=forged)
    assert status == 200
    arrival = last(origin)
    assert_signed(arrival, "POST", url)
    assert len([n for n, _ in arrival.lines if n.lower() == "signature"]) == 1


def test_target_bytes_are_signed_and_sent_exactly_as_received(
    origin: VerifyingOrigin, proxy: ProxyProcess
) -> None:
    path = "/p%2dq/%7E/a%2Fb?x=%41&y=a%2fb&z=%7e"  # percent-encodings never decoded, case never changed
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
        head = f"GET http://127.0.0.1:{origin.port}{path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        sock.sendall(head.encode())
        assert _read_all(sock).startswith(b"HTTP/1.1 200")
    assert_signed(last(origin), "GET", origin.url(path))


def test_host_case_and_default_port_are_canonicalized(origin: VerifyingOrigin, proxy: ProxyProcess) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
        head = f"GET HTTP://127.0.0.1:{origin.port}/c?#frag HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        sock.sendall(head.encode())
        assert _read_all(sock).startswith(b"HTTP/1.1 200")
    assert_signed(last(origin), "GET", origin.url("/c"))


def test_hop_by_hop_fields_are_dropped(origin: VerifyingOrigin, proxy: ProxyProcess) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
        sock.sendall(
            f"GET {origin.url('/hop')} HTTP/1.1\r\nHost: ignored.example\r\nConnection: close, X-Secret\r\n"
            "X-Secret: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nProxy-Connection: keep-alive\r\n"
            "X-Kept: yes\r\n\r\n".encode()
        )
        data = _read_all(sock)
    assert data.startswith(b"HTTP/1.1 200")
    arrival = last(origin)
    names = {n.lower() for n, _ in arrival.lines}
    assert not names & {"x-secret", "keep-alive", "te", "proxy-connection"}
    assert arrival.header("x-kept") == "yes"
    assert arrival.header("host") == f"127.0.0.1:{origin.port}"  # regenerated from the target
    assert arrival.verified


def test_keep_alive_serves_several_requests_on_one_connection(
    origin: VerifyingOrigin, proxy: ProxyProcess
) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
        request = f"GET {origin.url('/k')} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        sock.sendall(request + request)  # pipelined, too
        buf = b""
        while buf.count(b"HTTP/1.1 200") < 2:
            chunk = sock.recv(65536)
            assert chunk, buf
            buf += chunk
    assert len(origin.arrivals) == 2
    assert all(a.verified for a in origin.arrivals)


def test_expect_100_continue_is_answered_before_the_body(
    origin: VerifyingOrigin, proxy: ProxyProcess
) -> None:
    body = b"x" * 2048
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
        sock.sendall(
            f"POST {origin.url('/e')} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            "Expect: 100-continue\r\nConnection: close\r\n\r\n".encode()
        )
        assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(body)
        data = _read_all(sock)
    assert data.startswith(b"HTTP/1.1 200")
    arrival = last(origin)
    assert arrival.verified
    assert arrival.header("expect") is None


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_health_and_readiness_are_origin_form_paths(proxy: ProxyProcess) -> None:
    assert requests.get(f"{proxy.url}/healthz", timeout=WAIT_S, proxies=DIRECT).json()["status"] == "ok"
    ready = requests.get(f"{proxy.url}/readyz", timeout=WAIT_S, proxies=DIRECT)
    assert ready.status_code == 200
    assert ready.json()["checks"]["signing_key"] == "ok"


def test_access_log_has_one_line_per_request_without_secrets(
    origin: VerifyingOrigin, proxy: ProxyProcess
) -> None:
    # a host name no other test sends to through this proxy: an earlier test's line, still in the
    # buffered access log (issue 21: written a few ms after the answer), cannot pass for this one
    host = "localhost"

    def lines() -> list[dict[str, Any]]:
        return [doc for doc in proxy.access_lines() if doc.get("host") == host]

    send(
        "requests",
        "GET",
        f"http://{host}:{origin.port}/logged",
        headers={"Authorization": "Bearer s3cr3t-token"},
    )
    wait_for(lambda: bool(lines()), "the request's access-log line")
    [entry] = lines()
    assert {
        "client",
        "method",
        "host",
        "status",
        "duration_ms",
        "bytes_in",
        "bytes_out",
        "keyid",
        "outcome",
    } <= set(entry)
    assert entry["keyid"] == KEY.thumbprint
    assert entry["outcome"] == "signed"
    # each field in its place: the exchange builds the log's record itself (AccessLog.request, written out)
    assert (entry["client"], entry["method"], entry["status"], entry["bytes_in"]) == (
        "127.0.0.1",
        "GET",
        200,
        0,
    )
    assert entry["bytes_out"] > 0
    assert entry["profile"] == "svc"
    assert isinstance(entry["duration_ms"], float)
    assert 0 <= entry["duration_ms"] < WAIT_S * 1000
    assert not any("s3cr3t-token" in line for line in proxy.stderr_lines)


# --- refusals: every error is problem+json with a reason, and nothing unsigned leaves --------------


def problem(response: requests.Response) -> dict[str, Any]:
    assert response.headers["Content-Type"] == "application/problem+json"
    doc: dict[str, Any] = response.json()
    assert doc["status"] == response.status_code
    return doc


def test_signing_failure_never_reaches_the_origin(origin: VerifyingOrigin, proxy: ProxyProcess) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
        sock.sendall(
            f"GET {origin.url('/u')} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer caf\xe9\r\n"
            "Connection: close\r\n\r\n".encode("latin-1")
        )
        data = _read_all(sock)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert json.loads(body)["reason"] == "non-ascii-component"
    assert origin.arrivals == []


def test_duplicate_authorization_is_refused(origin: VerifyingOrigin, proxy: ProxyProcess) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
        sock.sendall(
            f"GET {origin.url('/d')} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a\r\n"
            "Authorization: Bearer b\r\nConnection: close\r\n\r\n".encode()
        )
        data = _read_all(sock)
    assert b'"reason":"duplicate-authorization"' in data
    assert origin.arrivals == []


def test_upstream_refused_is_502(proxy: ProxyProcess) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connections are refused
        doc = problem(requests.get(f"http://127.0.0.1:{port}/", timeout=WAIT_S))
    assert doc["reason"] == "upstream-connect-failed"


def test_non_proxy_origin_form_request_is_404(proxy: ProxyProcess) -> None:
    doc = problem(requests.get(f"{proxy.url}/not-a-route", timeout=WAIT_S, proxies=DIRECT))
    assert doc["reason"] == "no-route"


def test_malformed_request_is_400(proxy: ProxyProcess) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
        sock.sendall(b"GET http://x/ HTTP/1.1\r\nBad Header\r\n\r\n")
        assert _read_all(sock).startswith(b"HTTP/1.1 400")


def test_disallowed_scheme_is_400(proxy: ProxyProcess) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as sock:
        sock.sendall(b"GET ftp://x/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = _read_all(sock)
    assert data.startswith(b"HTTP/1.1 400")
    assert b"unsupported-scheme" in data


# --- proxies with their own configuration -------------------------------------------------------


def test_body_over_the_limit_is_413(
    tmp_path: Path, origin: VerifyingOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ProxyProcess(tmp_path, {"limits": {"max_body_bytes": 1000}}, key=KEY) as small:
        use_proxy(monkeypatch, small.url)
        doc = problem(requests.post(origin.url("/big"), data=b"x" * 1001, timeout=WAIT_S))
        assert doc["reason"] == "body-too-large"
        ok = requests.post(origin.url("/ok"), data=b"x" * 1000, timeout=WAIT_S)
        assert ok.status_code == 200
        chunked = requests.post(origin.url("/big"), data=iter([b"x" * 600, b"x" * 600]), timeout=WAIT_S)
        assert problem(chunked)["reason"] == "body-too-large"
    assert [a.target_uri for a in origin.arrivals] == [origin.url("/ok")]


def test_proxy_authentication_is_407_until_credentials_match(
    tmp_path: Path, origin: VerifyingOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = tmp_path / "proxy-users"
    auth.write_text("# user:password\nagent:correct horse\n")
    auth.chmod(0o600)
    with ProxyProcess(tmp_path, {"access": {"proxy_auth_file": str(auth)}}, key=KEY) as guarded:
        use_proxy(monkeypatch, guarded.url)
        refused = requests.get(origin.url("/p"), timeout=WAIT_S)
        assert refused.status_code == 407
        assert refused.headers["Proxy-Authenticate"].startswith("Basic")
        assert problem(refused)["reason"] == "proxy-auth-required"
        wrong = guarded.url.replace("http://", "http://agent:wrong@")
        use_proxy(monkeypatch, wrong)
        assert requests.get(origin.url("/p"), timeout=WAIT_S).status_code == 407
        use_proxy(monkeypatch, guarded.url.replace("http://", "http://agent:correct%20horse@"))
        ok = requests.get(origin.url("/p"), timeout=WAIT_S)
        assert ok.status_code == 200
        assert ok.json()["verified"] is True
    assert len(origin.arrivals) == 1
    assert origin.arrivals[0].header("proxy-authorization") is None
    assert not any("correct horse" in line for line in guarded.stderr_lines)


def test_client_outside_allow_list_is_403(
    tmp_path: Path, origin: VerifyingOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ProxyProcess(tmp_path, {"access": {"allow_clients": ["10.0.0.0/8"]}}, key=KEY) as fenced:
        use_proxy(monkeypatch, fenced.url)
        doc = problem(requests.get(origin.url("/f"), timeout=WAIT_S))
    assert doc["reason"] == "client-not-allowed"
    assert origin.arrivals == []


def test_upstream_read_timeout_is_504(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiohttp import web

    async def slow(_request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(3)
        return web.Response(text="late")

    with (
        VerifyingOrigin(handler=slow) as sluggish,
        ProxyProcess(tmp_path, {"timeouts": {"read_s": 0.5}}, key=KEY) as impatient,
    ):
        use_proxy(monkeypatch, impatient.url)
        doc = problem(requests.get(sluggish.url("/slow"), timeout=WAIT_S))
    assert doc["reason"] == "upstream-timeout"
    assert doc["status"] == 504


def test_configured_bearer_is_injected_for_matching_hosts_only(
    tmp_path: Path, origin: VerifyingOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("file-token\n")
    token_file.chmod(0o600)
    config = {
        "credentials": [
            {"hosts": ["127.0.0.1"], "bearer_file": str(token_file), "allow_plaintext": True},
            {"hosts": ["*.example.net"], "bearer_env": "EXAMPLE_TOKEN", "override": True},
        ],
        "log": {"format": "json"},
    }
    with ProxyProcess(tmp_path, config, key=KEY, env={"EXAMPLE_TOKEN": "env-token"}) as injecting:
        use_proxy(monkeypatch, injecting.url)
        requests.get(origin.url("/inject"), timeout=WAIT_S)
        requests.get(origin.url("/keep"), headers={"Authorization": "Bearer mine"}, timeout=WAIT_S)
        check = subprocess.run(
            [
                sys.executable,
                "-m",
                "signing_proxy",
                "config",
                "check",
                str(tmp_path / "config.yaml"),
            ],
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=False,
        )
    injected, kept = origin.arrivals
    assert injected.header("authorization") == "Bearer file-token"
    assert injected.verified
    assert kept.header("authorization") == "Bearer mine"  # the agent's own credential wins unless override
    assert not any("file-token" in line or "env-token" in line for line in injecting.stderr_lines)
    assert "file-token" not in check.stdout
    assert "env-token" not in check.stdout


def test_unsigned_host_rule_forwards_without_signature(
    tmp_path: Path, origin: VerifyingOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ProxyProcess(tmp_path, {"hosts": {"unsigned": ["localhost"]}}, key=KEY) as selective:
        use_proxy(monkeypatch, selective.url)
        requests.get(f"http://localhost:{origin.port}/internal", timeout=WAIT_S)
        requests.get(origin.url("/external"), timeout=WAIT_S)
    internal, external = origin.arrivals
    assert internal.header("signature") is None
    assert internal.reason == "missing-signature"
    assert external.verified


def test_sidecar_route_signs_for_the_upstream_url(tmp_path: Path, origin: VerifyingOrigin) -> None:
    config = {"routes": [{"prefix": "/exchange/", "upstream": origin.url("/v1/")}]}
    with ProxyProcess(tmp_path, config, key=KEY) as sidecar:
        r = requests.post(
            f"{sidecar.url}/exchange/svc.v1.ExchangeService/DiscoverResources?a=%2F",
            data=b"{}",
            timeout=WAIT_S,
            proxies=DIRECT,
        )
        assert r.status_code == 200
    arrival = last(origin)
    assert_signed(arrival, "POST", origin.url("/v1/svc.v1.ExchangeService/DiscoverResources?a=%2F"), agent="")


def test_streaming_a_200_mib_response_keeps_memory_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiohttp import web

    chunk = b"z" * (256 * 1024)
    total = 200 * 1024 * 1024

    async def big(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = total
        await response.prepare(request)
        for _ in range(total // len(chunk)):
            await response.write(chunk)
        return response

    with VerifyingOrigin(handler=big) as origin, ProxyProcess(tmp_path, key=KEY) as streaming:
        origin.trust(KEY)
        use_proxy(monkeypatch, streaming.url)
        requests.get(origin.url("/warmup-small"), timeout=WAIT_S, stream=True).close()
        before = streaming.rss_kib()
        received = 0
        with requests.get(origin.url("/big"), timeout=60, stream=True) as r:
            for part in r.iter_content(1024 * 1024):
                received += len(part)
        growth_mib = (streaming.hwm_kib() - before) / 1024
    assert received == total
    assert growth_mib < 50, f"proxy peak RSS grew by {growth_mib:.1f} MiB while streaming 200 MiB"


class _OneAnswerPerConnection:
    """An origin that answers the first request on each connection (keep-alive) and silently closes
    the connection when a second one arrives — a server that dropped an idle pooled connection."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.port = self.listener.getsockname()[1]
        self.seen: list[bytes] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(WAIT_S)
            for answer in (True, False):
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                self.seen.append(data.split(b"\r\n", 1)[0])
                if answer:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    def close(self) -> None:
        self.listener.close()


def test_a_dropped_pooled_connection_is_retried_only_for_idempotent_methods(proxy: ProxyProcess) -> None:
    origin = _OneAnswerPerConnection()
    try:
        url = f"http://127.0.0.1:{origin.port}/r"
        assert requests.get(url, timeout=WAIT_S).status_code == 200  # opens a pooled connection
        assert requests.get(url, timeout=WAIT_S).status_code == 200  # reused, dropped, retried fresh
        refused = requests.post(url, data=b"pay", timeout=WAIT_S)  # reused, dropped: never sent twice
    finally:
        origin.close()
    assert refused.status_code == 502
    assert problem(refused)["reason"] == "upstream-reset"
    assert [line.split(b" ")[0] for line in origin.seen] == [b"GET", b"GET", b"GET", b"POST"]
