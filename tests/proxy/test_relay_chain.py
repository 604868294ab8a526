"""End to end on loopback: agent proxy -> relay -> relay -> origin, each hop a real ``signing-proxy``
process with its own key store and publish listener; the origin resolves every keyid through the
directories those listeners serve, and checks each later label covers the one before."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import requests

from signing_proxy.core.keys import parse_directory
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin, free_port

pytestmark = pytest.mark.integration

DIRECTORY = "/.well-known/http-message-signatures-directory"


def hop_config(
    *, publish_port: int, mode: str = "agent", label: str = "agent", next_hop: int | None = None, **extra: Any
) -> dict[str, Any]:
    base = f"http://127.0.0.1:{publish_port}"
    config: dict[str, Any] = {
        "mode": mode,
        "log": {"format": "json"},
        "signing": {"key": None, "label": label, **({"signature_agent": base} if mode == "agent" else {})},
        "publish": {"listen": f"127.0.0.1:{publish_port}", "domain": "127.0.0.1", "public_url": base},
        "egress": {"allow_private": ["127.0.0.1/32"]},  # every directory here is on loopback
        **extra,
    }
    if next_hop is not None:
        config["upstream"] = {"next_hop": f"http://127.0.0.1:{next_hop}"}
    return config


def served_keys(publish_port: int) -> list[Any]:
    resp = requests.get(f"http://127.0.0.1:{publish_port}{DIRECTORY}", timeout=WAIT_S, proxies={})
    resp.raise_for_status()
    return [k.public for k in parse_directory(resp.content).keys]


@contextlib.contextmanager
def chain(
    tmp: Path, *, last_max_hops: int | None = None, final: str | None = None
) -> Iterator[tuple[ProxyProcess, list[int]]]:
    """Start relay2, relay1 and the agent proxy (in that order); yield the agent proxy and publish ports."""
    # publication ports are named in configuration before their process starts (signature_agent,
    # broker_directories); the proxy ports are read back from each started relay
    pub = [free_port() for _ in range(3)]
    relay2 = hop_config(
        publish_port=pub[2],
        mode="relay",
        label="broker",
        relay={"broker_directories": [f"http://127.0.0.1:{pub[1]}"], "max_hops": last_max_hops},
    )
    if final is not None:
        relay2["upstream"] = {"next_hop": final}
    (tmp / "r2").mkdir()
    (tmp / "r1").mkdir()
    (tmp / "a").mkdir()
    with ProxyProcess(tmp / "r2", relay2) as r2:
        relay1 = hop_config(publish_port=pub[1], mode="relay", label="broker", next_hop=r2.port)
        with ProxyProcess(tmp / "r1", relay1) as r1:
            agent = hop_config(publish_port=pub[0], next_hop=r1.port)
            with ProxyProcess(tmp / "a", agent) as a:
                yield a, pub


def test_three_label_stack_each_label_covering_the_one_before(tmp_path: Path) -> None:
    with VerifyingOrigin() as origin, chain(tmp_path) as (agent, pub):
        for port in pub:
            origin.trust(*served_keys(port))
        url = origin.url("/svc.v1.ExchangeService/DiscoverResources?x=%2F")
        resp = requests.post(url, data=b'{"ver":"1.0"}', proxies={"http": agent.url}, timeout=WAIT_S)
        assert resp.status_code == 200, resp.text
    arrival = origin.arrivals[-1]
    assert arrival.verified, arrival.reason
    assert arrival.oracle == "ok", arrival.oracle
    assert arrival.labels == ["agent", "broker", "broker2"]
    assert arrival.target_uri == url
    assert arrival.header("signature-agent") == f'"http://127.0.0.1:{pub[0]}"'  # the agent's, unchanged
    signature_input = arrival.header("signature-input") or ""
    five = '"@method" "@target-uri" "content-digest" "authorization" "signature-agent"'
    assert f'broker=({five} "signature";key="agent")' in signature_input
    assert f'broker2=({five} "signature";key="broker")' in signature_input


def test_the_same_chain_with_max_hops_2_is_refused_with_a_reason(tmp_path: Path) -> None:
    with VerifyingOrigin() as origin, chain(tmp_path, last_max_hops=2) as (agent, _pub):
        resp = requests.post(origin.url("/x"), data=b"{}", proxies={"http": agent.url}, timeout=WAIT_S)
    assert resp.status_code == 403
    assert resp.headers["Content-Type"] == "application/problem+json"
    doc = resp.json()
    assert doc["reason"] == "too-many-hops"
    assert "max_hops=2" in doc["detail"]
    assert origin.arrivals == []


def first_line(stream: IO[str]) -> str:
    """The first line ``stream`` gives, waited for at most WAIT_S ("" when none came)."""
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        lines.append(stream.readline())
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    ready.wait(WAIT_S)
    return lines[0] if lines else ""


def test_verify_origin_reports_the_verdict_for_a_relayed_request(tmp_path: Path) -> None:
    pub1 = free_port()  # named by --broker-directory before the relay that serves it starts
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "signing_proxy",
            "verify-origin",
            "--listen",
            "127.0.0.1:0",
            "--broker-directory",
            f"http://127.0.0.1:{pub1}",
            "--allow-private",
            "127.0.0.1/32",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")},
    )
    try:
        assert proc.stderr is not None
        line = first_line(proc.stderr)
        assert "verify-origin listening on http://127.0.0.1:" in line, line
        port = int(line.rsplit(":", 1)[1])
        pub0 = free_port()
        relay = hop_config(publish_port=pub1, mode="relay", label="broker")
        (tmp_path / "r").mkdir()
        (tmp_path / "a").mkdir()
        with ProxyProcess(tmp_path / "r", relay) as r:
            agent = hop_config(publish_port=pub0, next_hop=r.port)
            with ProxyProcess(tmp_path / "a", agent) as a:
                ok = requests.get(
                    f"http://127.0.0.1:{port}/hello?q=1", proxies={"http": a.url}, timeout=WAIT_S
                )
                direct = requests.get(f"http://127.0.0.1:{port}/hello", proxies={}, timeout=WAIT_S)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(WAIT_S)
        if proc.stderr is not None:
            proc.stderr.close()
    assert ok.status_code == 200, ok.text
    verdict = ok.json()
    assert verdict["verified"] is True
    assert [label["label"] for label in verdict["labels"]] == ["agent", "broker"]
    assert verdict["labels"][1]["key_source"] == f"http://127.0.0.1:{pub1}"
    assert verdict["labels"][0]["signature_base"].startswith(
        '"@method": GET\n"@target-uri": http://127.0.0.1:'
    )
    assert direct.status_code == 401
    assert direct.json()["reason"] == "missing-signature"
