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
from signing_proxy.core.signatures import Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_absolute_uri

from .harness import WAIT_S, VerifyingOrigin

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
def naive(*args: str) -> Iterator[str]:
    """bench/naive.py on a free port (port 0, read back): yields its proxy URL; stopped by PID."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench/naive.py"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "listening on http://127.0.0.1:PORT", or EOF if it died
        assert line.startswith("listening on "), f"bench/naive.py did not start: {line!r}"
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(WAIT_S)
        if proc.stdout is not None:
            proc.stdout.close()


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


def agent_signed(key: SigningKey, url: str, body: bytes) -> dict[str, str]:
    fields = Fields(
        [("Content-Digest", content_digest(body)), ("Authorization", ""), ("Signature-Agent", "")]
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
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench/floor.py")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on "), f"bench/floor.py did not start: {line!r}"
        proxy = line.split()[-1]
        with VerifyingOrigin() as origin, requests.Session() as session:
            bodies = [b"a" * 1024, b"b" * 10]
            for i, body in enumerate(bodies):
                resp = session.post(
                    origin.url(f"/bench?i={i}"), data=body, proxies={"http": proxy}, timeout=WAIT_S
                )
                assert resp.status_code == 200
            assert [(a.method, a.target_uri, a.body) for a in origin.arrivals] == [
                ("POST", origin.url(f"/bench?i={i}"), body) for i, body in enumerate(bodies)
            ]
    finally:
        proc.terminate()
        proc.wait(WAIT_S)
        if proc.stdout is not None:
            proc.stdout.close()
