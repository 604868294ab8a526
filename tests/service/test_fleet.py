"""A fleet: two ``signing-proxy run`` processes on one shared key store directory (as replicas on one
volume, or one Secret). A rotation with ``--activate-in`` is written once; both replicas pick it up,
publish byte-identical directories, and switch to the new key at the activation time: every request
either signs with the old key and a ``created`` before the activation, or with the new key and a
``created`` at or after it, whichever replica signed it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import requests

from signing_proxy.core.keys import DIRECTORY_PATH, parse_directory, parse_rfc3339
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin, run_cli, wait_for

pytestmark = pytest.mark.integration

ACTIVATE_IN_S = 4  # long enough for both replicas to notice the index (they look every second)


def replica(tmp: Path, name: str, data: Path) -> ProxyProcess:
    home = tmp / name
    home.mkdir()
    config = {
        "data_dir": str(data),  # the shared store: <data>/keys/default/
        "signing": {"key": None},
        "publish": {"listen": "127.0.0.1:0", "domain": "agent.example"},
        "log": {"format": "json"},
    }
    return ProxyProcess(home, config)


def directory(proxy: ProxyProcess) -> bytes:
    resp = requests.get(f"http://127.0.0.1:{proxy.publish_port}{DIRECTORY_PATH}", timeout=WAIT_S)
    assert resp.status_code == 200, resp.text
    return resp.content


def created(signature_input: str) -> int:
    match = re.search(r";created=(\d+)", signature_input)
    assert match is not None, signature_input
    return int(match.group(1))


def test_two_replicas_on_one_store_switch_together_and_publish_the_same_directory(tmp_path: Path) -> None:
    data = tmp_path / "shared"
    first = run_cli("keys", "rotate", "--data-dir", str(data))  # the store, with its first key
    assert first.returncode == 0, first.stderr
    with (
        VerifyingOrigin() as origin,
        replica(tmp_path, "a", data) as a,
        replica(tmp_path, "b", data) as b,
    ):
        old = json.loads(run_cli("keys", "list", "--json", "--data-dir", str(data)).stdout)["signing"]
        assert directory(a) == directory(b)
        origin.keys.update({k.thumbprint: k.public for k in parse_directory(directory(a)).keys})
        for name, proxy in (("a", a), ("b", b)):  # before the rotation: the old key, on both
            requests.get(origin.url(f"/{name}"), proxies={"http": proxy.url}, timeout=WAIT_S)
        assert [arrival.keyids for arrival in origin.arrivals] == [[old], [old]]

        rotated = run_cli("keys", "rotate", "--data-dir", str(data), "--activate-in", f"{ACTIVATE_IN_S}s")
        assert rotated.returncode == 0, rotated.stderr
        listed = json.loads(run_cli("keys", "list", "--json", "--data-dir", str(data)).stdout)
        new = next(k for k in listed["keys"] if k["thumbprint"] != old)
        activation = parse_rfc3339(new["activates_at"])
        both = {old, new["thumbprint"]}

        def published(proxy: ProxyProcess) -> set[str]:
            return {k.thumbprint for k in parse_directory(directory(proxy)).keys}

        wait_for(  # both replicas publish the new key beside the old one, the same bytes
            lambda: published(a) == both and published(b) == both and directory(a) == directory(b),
            "both replicas publishing the new key",
        )
        origin.keys.update({k.thumbprint: k.public for k in parse_directory(directory(a)).keys})

        switched: set[str] = set()

        def send_until_both_switched() -> bool:
            for name, proxy in (("a", a), ("b", b)):
                answer = requests.get(origin.url(f"/{name}"), proxies={"http": proxy.url}, timeout=WAIT_S)
                assert answer.status_code == 200
                if origin.arrivals[-1].keyids == [new["thumbprint"]]:
                    switched.add(name)
            return switched == {"a", "b"}

        wait_for(send_until_both_switched, "both replicas signing with the new key", ACTIVATE_IN_S + WAIT_S)
        assert directory(a) == directory(b)

    assert all(arrival.verified for arrival in origin.arrivals)
    assert all(arrival.oracle == "ok" for arrival in origin.arrivals)
    for arrival in origin.arrivals:  # the switch happened at the activation time, on both replicas
        when = created(arrival.header("signature-input") or "")
        expected = new["thumbprint"] if when >= activation else old
        assert arrival.keyids == [expected], (arrival.target_uri, when, activation)
