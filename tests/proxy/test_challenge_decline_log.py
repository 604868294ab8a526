"""A hostile origin answering every request with a web-bot-auth challenge, while our
``signing.signature_agent`` is no https origin, got one WARNING line per request. Now one line at
most every ``DECLINE_WARN_EVERY_S`` for all origins, counting the declines between (in-process, an
injected clock)."""

from __future__ import annotations

import logging

import pytest

from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.net.framing import Outgoing
from signing_proxy.net.upstream import ResponseHead
from signing_proxy.proxy import challenges
from signing_proxy.proxy.challenges import challenge_hold
from signing_proxy.ratelog import RateGate

REGISTRY = "https://registry.example/agents/alice"  # right for the spec's profile, no web-bot-auth member
CHALLENGE = ResponseHead(
    status=401,
    reason="",
    version="1.1",
    content_length=0,
    keep_alive=True,
    headers=[(b"Accept-Signature", b'sig1=("@authority");tag="web-bot-auth"')],
)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The process's rate, replaced for the test by one on a clock the test moves."""
    now = [1_000.0]
    monkeypatch.setattr(challenges, "_declines", RateGate(challenges.DECLINE_WARN_EVERY_S, lambda: now[0]))
    return now


def _declined(url: str) -> None:
    target = parse_absolute_uri(url)
    hold = challenge_hold(Outgoing(target, "GET", b"", b"", "kid", target, "svc"), None, None, REGISTRY)
    assert hold is not None
    assert not hold(CHALLENGE, target)  # declined: the challenge goes back to the agent


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "signing_proxy.challenges"]


def test_a_challenging_origin_gets_one_warning_a_minute_not_one_per_request(
    clock: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="signing_proxy.challenges"):
        for i in range(1_000):
            _declined(f"https://hostile{i % 7}.example/")
        (line,) = _lines(caplog)
        assert line.startswith("https://hostile0.example asked for a web-bot-auth signature; retry declined")
        assert "(1 declined since the last line" in line
        clock[0] += challenges.DECLINE_WARN_EVERY_S - 0.001
        _declined("https://hostile.example/")
        assert len(_lines(caplog)) == 1
        clock[0] += 0.001  # a minute since the line: the next decline says how many went unlogged
        _declined("https://hostile.example/")
    last = _lines(caplog)[-1]
    assert len(_lines(caplog)) == 2
    assert "(1001 declined since the last line" in last


def test_a_clock_stepped_back_is_never_silent_until_it_catches_up(
    clock: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="signing_proxy.challenges"):
        _declined("https://hostile.example/")
        clock[0] -= 3_600.0
        _declined("https://hostile.example/")
    assert len(_lines(caplog)) == 2
