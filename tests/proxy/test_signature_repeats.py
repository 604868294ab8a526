"""No signature base is made twice in one second (``proxy.signer.Repeats``).

The spec's profile has no nonce and Ed25519 is deterministic: two identical requests in one second
(a retry, a poll) went out with byte-identical signatures, and our own gateway with
``replay_protection`` refused the second ``401 signature-replayed``. A repeat is signed with
``expires`` a second earlier (a shorter window any verifier accepts); ``run --workers N`` spreads
its workers apart so that two of them never make the same base either.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import pytest
import requests

from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.proxy.pipeline import BearerStore, SigningPipeline
from signing_proxy.proxy.signer import Repeats, Signer
from tests.harness import WAIT_S, ProxyProcess
from tests.oracle import oracle_verify
from tests.proxy.raw_upstream import raw_backend, request_line
from tests.verify.directory_host import served_directory

KEY = SigningKey.generate()
NOW = 1_800_000_000.25
TARGET = parse_absolute_uri("http://api.example/feed")


def pipeline(repeats: Repeats | None = None, now: float = NOW) -> SigningPipeline:
    config = parse_config({})
    signer = Signer(StaticKeyProvider(KEY), label="agent", validity_s=300, clock=lambda: now, repeats=repeats)
    return SigningPipeline(config=config, signer=signer, bearers=BearerStore(config.credentials, {}))


def windows(p: SigningPipeline, times: int, *, general: bool = False) -> list[tuple[int, int]]:
    """The (created, expires) of ``times`` signatures of one request (the one-pass path, or the
    general path), each checked by an independent verifier."""
    made = []
    for _ in range(times):
        if general:
            fields = list(p.sign_fields("GET", TARGET, [("Host", "api.example")], b"").fields)
        else:
            head = p.prepare("GET", TARGET, [("Host", "api.example")], b"", framed=False).head.decode()
            fields = [(n, v) for n, _, v in (x.partition(": ") for x in head.split("\r\n")[1:] if x)]
        keys = {KEY.thumbprint: KEY.public.key}
        assert oracle_verify("GET", TARGET.uri, fields, b"", keys, check_time=False) == ["agent"]
        signature_input = next(v for n, v in fields if n.lower() == "signature-input")
        found = re.search(r";created=(\d+);expires=(\d+)", signature_input)
        assert found is not None
        made.append((int(found[1]), int(found[2])))
    return made


@pytest.mark.parametrize("general", [False, True], ids=["one-pass", "general"])
def test_a_repeat_in_the_same_second_ends_a_second_earlier(general: bool) -> None:
    created = int(NOW)
    assert windows(pipeline(), 3, general=general) == [(created, created + 300 - k) for k in range(3)]


def test_the_next_second_starts_afresh() -> None:
    repeats = Repeats()
    assert windows(pipeline(repeats), 2) == [(int(NOW), int(NOW) + 300), (int(NOW), int(NOW) + 299)]
    later = int(NOW) + 1
    assert windows(pipeline(repeats, NOW + 1), 1) == [(later, later + 300)]


def test_workers_never_make_the_same_base() -> None:
    """Worker i of N starts i seconds earlier and steps by N: their windows never meet."""
    made = set()
    for index in range(3):
        repeats = Repeats()
        repeats.spread(index, 3)
        ends = [expires for _, expires in windows(pipeline(repeats), 4)]
        assert ends == [int(NOW) + 300 - index - 3 * k for k in range(4)]
        made.update(ends)
    assert len(made) == 12


def test_past_half_the_window_repeats_share_the_first_signature() -> None:
    """Cut to its last second, a window expired on its way (a flood of identical requests had
    samples refused ``signature-expired`` by the bench's origin): half of it is always left."""
    p = pipeline()
    p.signer.validity_s = 4
    created = int(NOW)
    assert windows(p, 5) == [(created, created + e) for e in (4, 3, 2, 4, 4)]


def test_a_repeat_costs_two_builds_whatever_came_before_it() -> None:
    """The k-th repeat tried k earlier windows before (quadratic in the repeats of one second: 1,000
    identical requests took 870 ms to sign), and past ``validity_s`` every one tried them all."""
    signer = pipeline().signer
    created = int(NOW)
    builds: list[int] = []

    def build(expires: int) -> tuple[str, bytes]:
        builds.append(expires)
        return f"expires={expires}", b"the same request, expires %d" % expires

    ends = []
    for _ in range(1000):
        params, _base = signer.unrepeated(created, created + 300, build)
        ends.append(int(params.removeprefix("expires=")))
    assert len(builds) == 1000 + 150  # one build each, two for the 150 repeats moved earlier
    assert ends[:151] == [created + 300 - k for k in range(151)]
    assert set(ends[151:]) == {created + 300}  # past half the window: the first one's signature


def test_a_late_thread_of_the_last_second_does_not_wipe_this_seconds_memory() -> None:
    """The in-process client signs from several threads: one that read the clock in the second
    before another's reset the memory to its own second, and the next identical request of the new
    second got the first one's signature again."""
    repeats = Repeats()
    assert repeats.earlier(101, b"X") == 0
    assert repeats.earlier(100, b"Y") == 0  # late: its second is gone, nothing remembered for it
    assert repeats.earlier(101, b"X") == 1


@pytest.mark.integration
def test_identical_requests_through_the_proxy_all_pass_a_replay_checking_gateway(tmp_path: Path) -> None:
    agent = SigningKey.generate()
    seen: list[bytes] = []

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(WAIT_S)
            while (line := request_line(conn)) is not None:
                seen.append(line)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    with raw_backend(serve) as backend_port, served_directory(agent) as base:
        gateway_config: dict[str, Any] = {
            "mode": "gateway",
            "log": {"access_log": False},
            "egress": {"allow_private": ["127.0.0.1/32"]},
            "gateway": {"upstream": f"http://127.0.0.1:{backend_port}", "replay_protection": True},
        }
        agent_config = {"signing": {"signature_agent": base}, "log": {"access_log": False}}
        (tmp_path / "gw").mkdir()
        (tmp_path / "agent").mkdir()
        with (
            ProxyProcess(tmp_path / "gw", gateway_config) as gateway,
            ProxyProcess(tmp_path / "agent", agent_config, key=agent) as proxy,
        ):
            proxies = {"http": proxy.url}
            answers = [requests.get(f"{gateway.url}/feed", proxies=proxies, timeout=WAIT_S) for _ in range(6)]
    assert [(a.status_code, a.text) for a in answers] == [(200, "ok")] * 6
    assert seen == [b"GET /feed HTTP/1.1"] * 6
