"""HTTPS through the proxy: CONNECT, TLS interception with our CA, blind tunnels, refusals.

Clients run as fresh processes configured only by what ``signing-proxy env`` prints (the proxy
URLs and the CA bundle it writes), against a real ``signing-proxy run`` process and a loopback
HTTPS origin with its own test CA that verifies every signature twice (our verifier and the
independent ``http-message-signatures``). A second part runs the proxy in-process on both the
asyncio and the uvloop event loop, for what needs a socket in hand (early bytes, half-close,
handshake timeout, backpressure through the TLS adapter).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests
from aiohttp import web

from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.net.leaves import LeafContextCache
from signing_proxy.service.app import ProxyApp
from signing_proxy.storage.ca import CertificateAuthority
from tests.harness import WAIT_S, Arrival, ProxyProcess, VerifyingOrigin, wait_for
from tests.proxy.raw_upstream import loop_factories

pytestmark = pytest.mark.integration

KEY = SigningKey.generate()
ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ["requests", "httpx", "aiohttp", *(["curl"] if shutil.which("curl") else [])]
PROXY_VARS = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
TRUST_VARS = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


def clean_env() -> dict[str, str]:
    """The test process's environment without any proxy or trust-store variable."""
    env = dict(os.environ)
    for name in (*PROXY_VARS, *TRUST_VARS, "NO_PROXY", "no_proxy"):
        env.pop(name, None)
    return env


def signing_proxy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "signing_proxy", *args],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
        cwd=ROOT,
        env=clean_env(),
    )


def parse_exports(text: str) -> dict[str, str]:
    """``export NAME=VALUE`` lines as a shell would evaluate them (no expansions needed here)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            out[name] = shlex.split(value)[0]
    return out


# --- fixtures: a test CA and its origins, the proxy, and what `signing-proxy env` prints ---------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The origin's own CA (trusted by the proxy for 127.0.0.1 only), and a rogue CA nobody trusts."""
    tmp = tmp_path_factory.mktemp("pki")
    origin_ca, rogue_ca = CertificateAuthority.generate(), CertificateAuthority.generate()
    (tmp / "origin-ca.pem").write_bytes(origin_ca.cert_pem())
    with LeafContextCache(origin_ca, 8) as origin_leaves, LeafContextCache(rogue_ca, 8) as rogue_leaves:
        yield {
            "origin_ca_file": tmp / "origin-ca.pem",
            # a 127.0.0.1 leaf; the cache's SNI callback switches to a localhost leaf on SNI "localhost"
            "origin_tls": origin_leaves.get("127.0.0.1"),
            "rogue_tls": rogue_leaves.get("127.0.0.1"),
        }


@pytest.fixture(scope="module")
def origin(pki: dict[str, Any]) -> Iterator[VerifyingOrigin]:
    with VerifyingOrigin(tls=pki["origin_tls"]) as server:
        server.trust(KEY)
        yield server


@pytest.fixture(scope="module")
def rogue(pki: dict[str, Any]) -> Iterator[VerifyingOrigin]:
    with VerifyingOrigin(tls=pki["rogue_tls"]) as server:
        server.trust(KEY)
        yield server


@pytest.fixture(scope="module")
def plain(pki: dict[str, Any]) -> Iterator[VerifyingOrigin]:
    with VerifyingOrigin() as server:
        server.trust(KEY)
        yield server


@pytest.fixture(scope="module")
def proxy(
    tmp_path_factory: pytest.TempPathFactory,
    pki: dict[str, Any],
    origin: VerifyingOrigin,
    rogue: VerifyingOrigin,
    plain: VerifyingOrigin,
) -> Iterator[ProxyProcess]:
    config = {
        "log": {"format": "json"},
        "signing": {"signature_agent": "https://agent.example"},
        "upstream": {"pin_ca_files": {"127.0.0.1": str(pki["origin_ca_file"])}},
        "intercept": {
            "allowed_ports": [origin.port, rogue.port, plain.port],
            "tunnel": ["localhost"],
            "no_proxy": ["internal.example"],
        },
    }
    with ProxyProcess(tmp_path_factory.mktemp("proxy"), config, key=KEY) as process:
        yield process


@pytest.fixture(scope="module")
def agent_env(proxy: ProxyProcess) -> dict[str, str]:
    """What ``eval "$(signing-proxy env)"`` puts in an agent's environment."""
    done = signing_proxy(
        "env", "--config", str(proxy.tmp / "config.yaml"), "--listen", f"127.0.0.1:{proxy.port}"
    )
    assert done.returncode == 0, done.stderr
    exports = parse_exports(done.stdout)
    assert exports["HTTPS_PROXY"] == proxy.url
    return exports


@pytest.fixture(autouse=True)
def _fresh(origin: VerifyingOrigin, rogue: VerifyingOrigin, plain: VerifyingOrigin) -> None:
    for server in (origin, rogue, plain):
        server.arrivals.clear()


def assert_signed(arrival: Arrival, method: str, url: str, agent: str = '"https://agent.example"') -> None:
    assert arrival.verified, arrival.reason
    assert arrival.oracle == "ok", arrival.oracle
    assert arrival.method == method
    assert arrival.target_uri == url
    assert arrival.labels == ["agent"]
    assert arrival.keyids == [KEY.thumbprint]
    assert arrival.header("signature-agent") == agent


def connects(proxy: ProxyProcess, authority: str) -> list[dict[str, Any]]:
    return [d for d in proxy.access_lines() if d["method"] == "CONNECT" and d["host"] == authority]


Ops = list[tuple[str, str, str | None]]


def start_client(client: str, ops: Ops, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Send ``ops`` on one session from a fresh process whose environment is ``env`` only."""
    if client == "curl":
        args = ["curl"]
        for i, (method, url, body) in enumerate(ops):
            if i:
                args.append("--next")  # a new operation; the connection cache (the tunnel) is kept
            args += ["-sS", "--max-time", str(int(WAIT_S)), "-X", method, "-w", "\n%{http_code}\n", url]
            if body is not None:
                args += ["--data-binary", body]
    else:
        args = [sys.executable, "-m", "tests.proxy.https_clients", client, json.dumps(ops)]
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
        env={**clean_env(), **env},
        cwd=ROOT,
        check=False,
    )


def run_client(client: str, ops: Ops, env: dict[str, str]) -> list[Any]:
    """``start_client``, which must succeed; returns ``[status, body-text]`` per request."""
    done = start_client(client, ops, env)
    assert done.returncode == 0, done.stderr[-2000:]
    if client == "curl":
        lines = [line for line in done.stdout.splitlines() if line]
        return [[int(lines[i + 1]), lines[i]] for i in range(0, len(lines), 2)]
    result: list[Any] = json.loads(done.stdout)
    return result


def connect_raw(proxy: ProxyProcess, authority: str, extra: bytes = b"") -> tuple[socket.socket, bytes]:
    """Send CONNECT on a fresh socket; return it and the proxy's answer head (up to CRLFCRLF)."""
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S)
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode() + extra)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        if not chunk:
            break
        head += chunk
    return sock, head


def read_to_eof(sock: socket.socket | ssl.SSLSocket) -> bytes:
    chunks = []
    with contextlib.suppress(ssl.SSLError, ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def our_ca_context(proxy: ProxyProcess) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(proxy.tmp / "data" / "ca.pem"))


# --- the acceptance path: real clients, only the environment, one tunnel for several requests ----


@pytest.mark.parametrize("client", CLIENTS)
def test_clients_reach_the_https_origin_signed_over_one_tunnel(
    client: str, proxy: ProxyProcess, origin: VerifyingOrigin, agent_env: dict[str, str]
) -> None:
    authority = f"127.0.0.1:{origin.port}"
    before = len(connects(proxy, authority))
    ops = [
        ("GET", origin.url("/svc/items?q=a-b&x=1"), None),
        ("POST", origin.url("/svc.v1.ExchangeService/DiscoverResources"), '{"hello": "world"}'),
        ("GET", origin.url("/third"), None),
    ]
    results = run_client(client, ops, agent_env)
    assert [status for status, _ in results] == [200, 200, 200], results
    assert all(json.loads(body)["verified"] for _, body in results)
    assert len(origin.arrivals) == 3
    for (method, url, body), arrival in zip(ops, origin.arrivals, strict=True):
        assert url.startswith("https://")
        assert_signed(arrival, method, url)
        assert arrival.body == (body or "").encode()
    # the CONNECT is logged when it is answered, before any of the three responses came back
    wait_for(lambda: len(connects(proxy, authority)) == before + 1, "the CONNECT's access-log line")
    tunnels = connects(proxy, authority)[before:]
    assert len(tunnels) == 1, tunnels  # keep-alive: three requests, one CONNECT
    assert tunnels[0]["status"] == 200
    assert tunnels[0]["outcome"] == "intercepted"


def test_env_output_points_at_the_proxy_and_a_bundle_with_our_ca(
    proxy: ProxyProcess, agent_env: dict[str, str]
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert agent_env[name] == proxy.url
    assert agent_env["NO_PROXY"] == agent_env["no_proxy"] == "internal.example"
    bundle = Path(agent_env["SSL_CERT_FILE"])
    assert agent_env["REQUESTS_CA_BUNDLE"] == agent_env["CURL_CA_BUNDLE"] == str(bundle)
    assert bundle == proxy.tmp / "data" / "ca-bundle.pem"
    ca_pem = (proxy.tmp / "data" / "ca.pem").read_bytes()
    assert bundle.read_bytes().endswith(ca_pem)
    assert bundle.read_bytes().count(b"BEGIN CERTIFICATE") > 1  # the system store comes first
    assert agent_env["NODE_EXTRA_CA_CERTS"] == str(proxy.tmp / "data" / "ca.pem")
    assert agent_env["NODE_USE_ENV_PROXY"] == "1"


def test_ca_files_are_created_owner_only(proxy: ProxyProcess) -> None:
    data = proxy.tmp / "data"
    assert stat.S_IMODE((data / "ca-key.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE((data / "ca.pem").stat().st_mode) == 0o644
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    exported = signing_proxy("ca", "export", "--config", str(proxy.tmp / "config.yaml"))
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.encode() == (data / "ca.pem").read_bytes()


def test_readyz_reports_the_interception_ca(proxy: ProxyProcess) -> None:
    ready = requests.get(f"{proxy.url}/readyz", timeout=WAIT_S, proxies={"http": "", "https": ""})
    assert ready.status_code == 200
    assert ready.json()["checks"]["interception_ca"] == "ok"


# --- what is not intercepted, and what is refused -------------------------------------------------


def test_blind_tunnel_host_passes_through_unsigned(
    proxy: ProxyProcess, origin: VerifyingOrigin, pki: dict[str, Any]
) -> None:
    url = f"https://localhost:{origin.port}/blind"
    env = {"HTTPS_PROXY": proxy.url, "REQUESTS_CA_BUNDLE": str(pki["origin_ca_file"])}
    [(status, _body)] = run_client("requests", [("GET", url, None)], env)
    assert status == 200
    [arrival] = origin.arrivals
    assert arrival.header("signature") is None
    assert arrival.header("signature-input") is None
    assert arrival.reason == "missing-signature"
    authority = f"localhost:{origin.port}"
    wait_for(
        lambda: any(d["outcome"] == "tunnelled" for d in connects(proxy, authority)), "a tunnelled CONNECT"
    )

    def tunnel_closed() -> list[dict[str, Any]]:
        lines = []
        for line in proxy.stderr_lines:
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict) and doc.get("event") == "tunnel" and doc.get("host") == authority:
                    lines.append(doc)
        return lines

    wait_for(lambda: bool(tunnel_closed()), "the tunnel's closing log line")
    closed = tunnel_closed()[-1]
    assert closed["outcome"] == "tunnelled"
    assert closed["bytes_up"] > 0
    assert closed["bytes_down"] > 0


def test_sni_naming_another_host_is_refused(proxy: ProxyProcess, origin: VerifyingOrigin) -> None:
    sock, head = connect_raw(proxy, f"127.0.0.1:{origin.port}")
    with sock:
        assert head.startswith(b"HTTP/1.1 200 Connection Established\r\n")
        context = our_ca_context(proxy)
        context.check_hostname = False  # the point is the SNI we send, not what we accept
        with pytest.raises(ssl.SSLError) as refused:
            context.wrap_socket(sock, server_hostname="evil.example").close()
    assert "UNRECOGNIZED_NAME" in str(refused.value).upper()
    assert origin.arrivals == []
    wait_for(
        lambda: any("SNI mismatch" in line and "evil.example" in line for line in proxy.stderr_lines),
        "the SNI mismatch log line",
    )


def test_a_server_name_that_is_not_ascii_is_refused_in_one_log_line(
    proxy: ProxyProcess, origin: VerifyingOrigin
) -> None:
    """ssl reads a ClientHello's server name as ASCII before the SNI callback: "\u00e9vil.example"
    failed there, and Python wrote a raw traceback to stderr beside the JSON log (five lines a
    handshake, any stranger's), and counted it a plain handshake failure."""
    sock, head = connect_raw(proxy, f"127.0.0.1:{origin.port}")
    with sock:
        assert head.startswith(b"HTTP/1.1 200 Connection Established\r\n")
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        outgoing = ssl.MemoryBIO()
        hello_of = context.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="aavil.example")
        with contextlib.suppress(ssl.SSLWantReadError):
            hello_of.do_handshake()
        hello = outgoing.read()
        assert hello.count(b"aavil.example") == 1
        before = len(proxy.stderr_lines)
        sock.sendall(hello.replace(b"aavil.example", "\u00e9vil.example".encode()))  # as many bytes
        answer = read_to_eof(sock)
    assert answer[:1] == b"\x15"  # a TLS alert, and the connection closed
    assert origin.arrivals == []
    wait_for(
        lambda: any("not ASCII (SNI mismatch)" in line for line in proxy.stderr_lines[before:]),
        "the SNI mismatch log line",
    )
    lines = proxy.stderr_lines[before:]
    assert not [line for line in lines if "Traceback" in line or "Exception ignored" in line]
    for line in lines:
        json.loads(line)  # log.format json: every line one object


@pytest.mark.parametrize("ending", ["fin", "close_notify+fin"])
def test_a_half_closed_tunnel_still_gets_its_answer(
    proxy: ProxyProcess, origin: VerifyingOrigin, ending: str
) -> None:
    """A request, then the client's TCP half-close (and close_notify first, or not): plain HTTP gets
    its answer (RFC 9112 section 9.6), and close_notify closes only the sender's side (RFC 8446
    section 6.1). Inside a tunnel the raw transport closed itself at the FIN: the request was signed
    and sent, and its answer never came back; with close_notify, it was not even sent."""
    sock, head = connect_raw(proxy, f"127.0.0.1:{origin.port}")
    with sock:
        assert head.startswith(b"HTTP/1.1 200 Connection Established\r\n")
        context = our_ca_context(proxy)
        context.check_hostname = False  # an IP literal: no name to check
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = context.wrap_bio(incoming, outgoing)
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.sendall(outgoing.read())
                incoming.write(sock.recv(65536))
        tls.write(b"GET /half HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        if ending.startswith("close_notify"):
            with contextlib.suppress(ssl.SSLWantReadError):
                tls.unwrap()
        sock.sendall(outgoing.read())
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while data := sock.recv(65536):
            incoming.write(data)
            with contextlib.suppress(ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                while chunk := tls.read(65536):
                    answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:80]
    [arrival] = origin.arrivals
    assert arrival.verified


def test_errors_inside_an_intercepted_tunnel_are_problem_responses(
    proxy: ProxyProcess, origin: VerifyingOrigin
) -> None:
    sock, head = connect_raw(proxy, f"127.0.0.1:{origin.port}")
    assert head.startswith(b"HTTP/1.1 200 Connection Established\r\n")
    with our_ca_context(proxy).wrap_socket(sock, server_hostname="127.0.0.1") as tls:
        tls.sendall(b"CONNECT elsewhere.example:443 HTTP/1.1\r\nHost: elsewhere.example:443\r\n\r\n")
        answer = read_to_eof(tls)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert b"Content-Type: application/problem+json" in head
    assert json.loads(body)["reason"] == "connect-in-tunnel"
    assert origin.arrivals == []


def test_connect_to_a_host_no_certificate_can_name_is_400(
    proxy: ProxyProcess, origin: VerifyingOrigin
) -> None:
    sock, head = connect_raw(proxy, f"bad..example:{origin.port}")
    with sock:
        body = read_to_eof(sock)
    assert head.startswith(b"HTTP/1.1 400 ")
    assert json.loads(body)["reason"] == "malformed-target"  # an empty label: refused before any CA work


def test_connect_to_a_port_not_allowed_is_a_problem_response(proxy: ProxyProcess) -> None:
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]
    sock, head = connect_raw(proxy, f"127.0.0.1:{port}")
    with sock:
        rest = read_to_eof(sock)
    assert head.startswith(b"HTTP/1.1 403 ")
    assert b"Content-Type: application/problem+json" in head
    assert b"Connection: close" in head
    doc = json.loads(rest)
    assert doc["reason"] == "connect-port-not-allowed"
    assert doc["status"] == 403


def test_upstream_certificate_that_fails_verification_is_502_inside_the_tunnel(
    proxy: ProxyProcess, rogue: VerifyingOrigin, agent_env: dict[str, str]
) -> None:
    [(status, body)] = run_client("requests", [("GET", rogue.url("/rogue"), None)], agent_env)
    assert status == 502
    doc = json.loads(body)
    assert doc["reason"] == "upstream-certificate-invalid"
    assert doc["status"] == 502
    assert rogue.arrivals == []


def test_plain_http_inside_a_connect_tunnel_is_signed_as_http(
    proxy: ProxyProcess, plain: VerifyingOrigin
) -> None:
    authority = f"127.0.0.1:{plain.port}"
    sock, head = connect_raw(proxy, authority)
    with sock:
        assert head.startswith(b"HTTP/1.1 200 Connection Established\r\n")
        request = f"GET /plain?x=%41 HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()
        last = (
            f"POST /again HTTP/1.1\r\nHost: {authority}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
        )
        sock.sendall(request + last.encode())
        answer = read_to_eof(sock)
    assert answer.count(b"HTTP/1.1 200 OK") == 2
    first, second = plain.arrivals
    assert_signed(first, "GET", f"http://{authority}/plain?x=%41")
    assert_signed(second, "POST", f"http://{authority}/again")
    assert second.body == b"hi"


def test_a_client_that_does_not_trust_the_ca_fails_the_handshake_and_the_log_says_how_to_fix_it(
    proxy: ProxyProcess, origin: VerifyingOrigin, pki: dict[str, Any]
) -> None:
    env = {"HTTPS_PROXY": proxy.url, "REQUESTS_CA_BUNDLE": str(pki["origin_ca_file"])}
    hints_before = sum("signing-proxy ca export" in line for line in proxy.stderr_lines)
    done = start_client("requests", [("GET", origin.url("/untrusted"), None)], env)
    assert done.returncode != 0
    assert "CERTIFICATE_VERIFY_FAILED" in done.stderr
    assert origin.arrivals == []

    def hints() -> list[str]:
        return [line for line in proxy.stderr_lines if "signing-proxy ca export" in line]

    wait_for(lambda: len(hints()) > hints_before, "the CA install hint in the log")
    hint = hints()[-1]
    assert "signing-proxy env" in hint
    assert "rejected our certificate" in hint


def test_proxy_auth_and_allow_list_apply_to_connect(tmp_path: Path) -> None:
    auth = tmp_path / "proxy-users"
    auth.write_text("agent:s3cret\n")
    auth.chmod(0o600)
    with ProxyProcess(tmp_path, {"access": {"proxy_auth_file": str(auth)}}, key=KEY) as guarded:
        sock, head = connect_raw(guarded, "example.com:443")
        with sock:
            body = read_to_eof(sock)
        assert head.startswith(b"HTTP/1.1 407 ")
        assert b"Proxy-Authenticate: Basic" in head
        assert json.loads(body)["reason"] == "proxy-auth-required"
    with ProxyProcess(tmp_path, {"access": {"allow_clients": ["10.0.0.0/8"]}}, key=KEY) as fenced:
        sock, head = connect_raw(fenced, "example.com:443")
        with sock:
            body = read_to_eof(sock)
        assert head.startswith(b"HTTP/1.1 403 ")
        assert json.loads(body)["reason"] == "client-not-allowed"


def test_streaming_a_large_response_through_an_intercepted_tunnel_keeps_memory_bounded(
    tmp_path: Path, pki: dict[str, Any]
) -> None:
    chunk = b"z" * (256 * 1024)
    total = 100 * 1024 * 1024

    async def big(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = total if request.path == "/big" else len(chunk)
        await response.prepare(request)
        for _ in range(response.content_length // len(chunk)):
            await response.write(chunk)
        return response

    with VerifyingOrigin(tls=pki["origin_tls"], handler=big) as server:
        config = {
            "upstream": {"pin_ca_files": {"127.0.0.1": str(pki["origin_ca_file"])}},
            "intercept": {"allowed_ports": [server.port]},
        }
        with ProxyProcess(tmp_path, config, key=KEY) as streaming:
            proxies = {"https": streaming.url}
            verify = str(tmp_path / "data" / "ca.pem")
            with requests.Session() as session:
                session.get(server.url("/warm"), proxies=proxies, verify=verify, timeout=WAIT_S).close()
                before = streaming.rss_kib()
                received = 0
                with session.get(
                    server.url("/big"), proxies=proxies, verify=verify, stream=True, timeout=60
                ) as r:
                    for part in r.iter_content(1024 * 1024):
                        received += len(part)
                growth_mib = (streaming.hwm_kib() - before) / 1024
    assert received == total
    assert growth_mib < 50, f"proxy peak RSS grew by {growth_mib:.1f} MiB while streaming 100 MiB over TLS"


def test_operator_ca_is_used_instead_of_a_generated_one(
    tmp_path: Path, origin: VerifyingOrigin, pki: dict[str, Any]
) -> None:
    operator = CertificateAuthority.generate(common_name="operator test CA")
    (tmp_path / "op-ca.pem").write_bytes(operator.cert_pem())
    fd = os.open(tmp_path / "op-ca-key.pem", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(operator._ca_key_pem())
    config = {
        "upstream": {"pin_ca_files": {"127.0.0.1": str(pki["origin_ca_file"])}},
        "intercept": {
            "allowed_ports": [origin.port],
            "ca_cert": str(tmp_path / "op-ca.pem"),
            "ca_key": str(tmp_path / "op-ca-key.pem"),
        },
    }
    with ProxyProcess(tmp_path, config, key=KEY) as operated:
        r = requests.get(
            origin.url("/op"),
            proxies={"https": operated.url},
            verify=str(tmp_path / "op-ca.pem"),
            timeout=WAIT_S,
        )
    assert r.status_code == 200
    assert_signed(origin.arrivals[-1], "GET", origin.url("/op"), agent="")
    assert not (tmp_path / "data" / "ca-key.pem").exists()


def test_an_unusable_ca_stops_start_up_with_exit_status_2(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    ca = CertificateAuthority.generate()
    (data / "ca.pem").write_bytes(ca.cert_pem())
    (data / "ca-key.pem").write_bytes(ca._ca_key_pem())
    (data / "ca-key.pem").chmod(0o644)
    key_path = tmp_path / "agent-key.pem"
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(KEY.to_pem())
    (tmp_path / "config.yaml").write_text(
        json.dumps({"listen": "127.0.0.1:0", "data_dir": str(data), "signing": {"key": str(key_path)}})
    )
    done = signing_proxy("run", "--config", str(tmp_path / "config.yaml"))
    assert done.returncode == 2
    assert "interception CA" in done.stderr
    assert "chmod 600" in done.stderr


# --- in-process, on asyncio and on uvloop ------------------------------------------------------------


async def _echo_until_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    data = await reader.read()  # to EOF: the tunnel must pass our half-close on
    writer.write(b"echo:" + data + b":bye")
    await writer.drain()
    writer.close()
    await writer.wait_closed()


async def _until(condition: Callable[[], bool], step_s: float = 0.01) -> None:
    for _ in range(int(WAIT_S / step_s)):  # bounded polling of a state we cannot subscribe to
        if condition():
            return
        await asyncio.sleep(step_s)
    assert condition()


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)


async def _in_process(
    tmp: Path, pki: dict[str, Any], tls_origin: VerifyingOrigin, plain_origin: VerifyingOrigin
) -> None:
    echo = await asyncio.start_server(_echo_until_eof, "127.0.0.1", 0)
    echo_port = echo.sockets[0].getsockname()[1]
    config = parse_config(
        {
            "listen": "127.0.0.1:0",
            "data_dir": str(tmp / "data"),
            "upstream": {"pin_ca_files": {"127.0.0.1": str(pki["origin_ca_file"])}},
            "intercept": {
                "allowed_ports": [tls_origin.port, plain_origin.port, echo_port],
                "tunnel": ["localhost"],
                "handshake_timeout_s": 0.5,
            },
            "log": {"access_log": False},
        }
    )
    app = ProxyApp(config, StaticKeyProvider(KEY))
    [(_host, port)] = await app.start()
    proxy_url = f"http://127.0.0.1:{port}"
    assert app.interception.ca is not None
    ours = ssl.create_default_context(cadata=app.interception.ca.cert_pem().decode())
    try:
        # TLS interception: a body in, a large body out (read slowly: backpressure through the adapter)
        timeout = aiohttp.ClientTimeout(total=WAIT_S * 2)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            body = os.urandom(1024 * 1024)
            async with session.post(tls_origin.url("/up"), data=body, proxy=proxy_url, ssl=ours) as r:
                assert r.status == 200
                assert (await r.json())["verified"] is True
            async with session.get(tls_origin.url("/big"), proxy=proxy_url, ssl=ours) as r:
                assert r.status == 200
                received = 0
                async for part in r.content.iter_chunked(256 * 1024):
                    received += len(part)
                    await asyncio.sleep(0.001)
                assert received == BIG_BYTES
        await _until(lambda: not app.connections)  # the tunnel ended with the session
        up = tls_origin.arrivals[0]
        assert_signed(up, "POST", tls_origin.url("/up"), agent="")
        assert up.body == body

        # plain HTTP sent in the same packet as the CONNECT head (early bytes)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        authority = f"127.0.0.1:{plain_origin.port}"
        writer.write(
            f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n"
            f"GET /early HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n".encode()
        )
        assert (await _read_head(reader)).startswith(b"HTTP/1.1 200 Connection Established")
        assert (await asyncio.wait_for(reader.read(), WAIT_S)).startswith(b"HTTP/1.1 200 OK")
        writer.close()
        await writer.wait_closed()
        assert_signed(plain_origin.arrivals[-1], "GET", f"http://{authority}/early", agent="")

        # a blind tunnel passes a half-close on and still carries the answer back
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"CONNECT localhost:{echo_port} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        assert (await _read_head(reader)).startswith(b"HTTP/1.1 200 Connection Established")
        writer.write(b"ping")
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b"echo:ping:bye"
        writer.close()
        await writer.wait_closed()

        # nothing after the 200: closed once intercept.handshake_timeout_s has passed
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"CONNECT 127.0.0.1:{tls_origin.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert (await _read_head(reader)).startswith(b"HTTP/1.1 200 Connection Established")
        started = time.monotonic()
        with contextlib.suppress(ConnectionResetError):
            assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
        assert time.monotonic() - started < WAIT_S / 2
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    finally:
        await app.stop()
        await asyncio.sleep(0.1)  # pooled upstream TLS connections finish their close_notify exchange
        echo.close()
        await echo.wait_closed()


BIG_BYTES = 16 * 1024 * 1024


@pytest.mark.parametrize("loop_factory", loop_factories())
def test_interception_on_each_event_loop(loop_factory: Any, tmp_path: Path, pki: dict[str, Any]) -> None:
    chunk = b"y" * (256 * 1024)

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path != "/big":
            return web.json_response({"verified": tls_origin.arrivals[-1].verified})
        response = web.StreamResponse()
        response.content_length = BIG_BYTES
        await response.prepare(request)
        for _ in range(BIG_BYTES // len(chunk)):
            await response.write(chunk)
        return response

    with (
        VerifyingOrigin(tls=pki["origin_tls"], handler=handler) as tls_origin,
        VerifyingOrigin() as plain_origin,
    ):
        tls_origin.trust(KEY)
        plain_origin.trust(KEY)
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(_in_process(tmp_path, pki, tls_origin, plain_origin))


# --- unit level -----------------------------------------------------------------------------------


def test_leaf_cache_bound_comes_from_config(tmp_path: Path) -> None:
    config = parse_config({"data_dir": str(tmp_path / "data"), "intercept": {"leaf_cache_size": 2}})
    app = ProxyApp(config, StaticKeyProvider(KEY))
    try:
        leaves = app.interception.leaves
        assert leaves is not None
        assert leaves.max_entries == 2
        for host in ("a.example", "b.example", "c.example", "a.example"):
            app.interception._context_for(host)
        assert len(leaves) == 2
        assert leaves.evictions == 2
        assert "a.example" in leaves
        assert "b.example" not in leaves
    finally:
        app.interception.close()


def test_interception_disabled_loads_no_ca(tmp_path: Path) -> None:
    config = parse_config({"data_dir": str(tmp_path / "data"), "intercept": {"enabled": False}})
    app = ProxyApp(config, StaticKeyProvider(KEY))
    assert app.interception.ca is None
    assert app.interception.ca_check() is None
    assert not (tmp_path / "data" / "ca.pem").exists()
