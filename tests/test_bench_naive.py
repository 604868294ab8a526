"""The benchmark's in-run references (bench/naive.py) do the work they stand for.

A reference that skipped the signature would flatter nothing but itself and make every ratio in
the README a lie: its signing mode must produce what our verifier and pyauth accept, and its relay
mode must verify the agent's label (refusing a forged one) before adding its own.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from cryptography.hazmat.primitives import serialization

from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import DIRECTORY_PATH, parse_directory
from signing_proxy.core.signatures import Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_absolute_uri

from .harness import WAIT_S, VerifyingOrigin, started_run

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def write_key(tmp: Path, key: SigningKey, name: str) -> tuple[Path, Path]:
    private, public = tmp / f"{name}.pem", tmp / f"{name}.pub.pem"
    private.write_bytes(key.to_pem())
    private.chmod(0o600)
    spki = key.public.key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    public.write_bytes(spki)
    return private, public


@contextlib.contextmanager
def bench_script(script: str, *args: str, ready: str) -> Iterator[str]:
    """bench/SCRIPT on port 0: yields the last word of its first line, which must start with
    ``ready`` (its address, read back); stopped by PID."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # or EOF if it died
        assert line.startswith(ready), f"bench/{script} did not start: {line!r}"
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(WAIT_S)
        if proc.stdout is not None:
            proc.stdout.close()


@contextlib.contextmanager
def naive(*args: str) -> Iterator[str]:
    """bench/naive.py: yields its proxy URL ("listening on http://127.0.0.1:PORT")."""
    with bench_script("naive.py", *args, ready="listening on ") as url:
        yield url


def test_the_naive_signer_emits_what_both_verifiers_accept(tmp_path: Path) -> None:
    key = SigningKey.generate()
    private, _ = write_key(tmp_path, key, "agent")
    with VerifyingOrigin() as origin, naive("--mode", "sign", "--key", str(private)) as proxy:
        origin.trust(key)
        resp = requests.post(
            origin.url("/bench?q=1"), data=b"x" * 1024, proxies={"http": proxy}, timeout=WAIT_S
        )
        assert resp.status_code == 200
    (arrival,) = origin.arrivals
    assert (arrival.verified, arrival.oracle, arrival.labels) == (True, "ok", ["agent"])


def agent_signed(key: SigningKey, url: str, body: bytes, agent: str = "") -> dict[str, str]:
    fields = Fields(
        [
            ("Content-Digest", content_digest(body)),
            ("Authorization", ""),
            ("Signature-Agent", f'"{agent}"' if agent else ""),
        ]
    )
    created = int(time.time())
    message = Message("POST", parse_absolute_uri(url), fields)
    attach_signature(fields, sign_message(message, key, created=created, expires=created + 300))
    return dict(fields)


def test_the_naive_relay_verifies_the_agent_then_stacks_its_label(tmp_path: Path) -> None:
    agent, broker, stranger = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    _, agent_public = write_key(tmp_path, agent, "agent")
    broker_private, _ = write_key(tmp_path, broker, "broker")
    relay_args = ("--mode", "relay", "--key", str(broker_private), "--agent-public-pem", str(agent_public))
    with VerifyingOrigin() as origin, naive(*relay_args) as relay:
        origin.trust(agent, broker)
        url = origin.url("/x")
        for signer, expected in ((agent, 200), (stranger, 500)):
            headers = agent_signed(signer, url, b"body")
            resp = requests.post(url, data=b"body", headers=headers, proxies={"http": relay}, timeout=WAIT_S)
            assert resp.status_code == expected
    (arrival,) = origin.arrivals  # the stranger's request never reached the origin
    assert (arrival.verified, arrival.oracle, arrival.labels) == (True, "ok", ["agent", "broker"])


def test_the_floor_forwards_each_request_whole_on_a_kept_alive_connection() -> None:
    """bench/floor.py (the floor row) forwards what it is sent, body and all, request after request
    on one client connection: a floor that dropped work would flatter nothing but itself."""
    with (
        bench_script("floor.py", ready="listening on ") as proxy,
        VerifyingOrigin() as origin,
        requests.Session() as session,
    ):
        bodies = [b"a" * 1024, b"b" * 10]
        for i, body in enumerate(bodies):
            resp = session.post(
                origin.url(f"/bench?i={i}"), data=body, proxies={"http": proxy}, timeout=WAIT_S
            )
            assert resp.status_code == 200
        assert [(a.method, a.target_uri, a.body) for a in origin.arrivals] == [
            ("POST", origin.url(f"/bench?i={i}"), body) for i, body in enumerate(bodies)
        ]


@contextlib.contextmanager
def bench_origin(public_pem: Path) -> Iterator[str]:
    """bench/origin.py verifying every request with ``public_pem``: yields its URL."""
    args = ("--public-key-pem", str(public_pem), "--verify-every", "1")
    with bench_script("origin.py", *args, ready="origin listening on ") as port:
        yield f"http://127.0.0.1:{port}"


def test_the_bench_origin_serves_its_key_for_the_gateway_row(tmp_path: Path) -> None:
    # bench/run.py's gateway row: signing-proxy gateway in front of the origin, the agent's key
    # fetched from the origin's directory; a request signed by another key must not pass
    key, stranger = SigningKey.generate(), SigningKey.generate()
    _, public = write_key(tmp_path, key, "agent")
    with bench_origin(public) as origin:
        directory = parse_directory(requests.get(origin + DIRECTORY_PATH, timeout=WAIT_S).content)
        assert [k.thumbprint for k in directory.keys] == [key.public.thumbprint]
        config = tmp_path / "gateway.yaml"
        config.write_text(
            f"mode: gateway\ndata_dir: {tmp_path / 'data'}\n"
            f"gateway:\n  upstream: {origin}\n  external_origin: {origin}\n"
            'egress:\n  allow_private: ["127.0.0.1/32"]\n'
        )
        with started_run("--config", str(config), "--listen", "127.0.0.1:0") as lines:
            gateway = next(w for line in lines for w in line.split() if w.startswith("http://127.0.0.1:"))
            for signer, expected in ((key, 200), (stranger, 401)):
                headers = agent_signed(signer, origin + "/bench", b"x" * 1024, agent=origin)
                resp = requests.post(gateway + "/bench", data=b"x" * 1024, headers=headers, timeout=WAIT_S)
                assert resp.status_code == expected, resp.text
        stats = requests.get(origin + "/stats", timeout=WAIT_S).json()
    assert (stats["verified"], stats["failed"]) == (1, 0)  # the accepted one re-verified at the origin
