"""A delegation token file that disappears is a refused reload like any other: logged once, naming
the path, while the chain loaded before stays in use (``proxy/requester.py``)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from tests.proxy.test_requester import Clock, apply, injector, make_chain, write_chain

REFUSED = "delegation not reloaded"


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "signing_proxy.requester" and r.levelno == logging.ERROR and REFUSED in r.getMessage()
    ]


def test_a_removed_token_file_is_logged_once_and_the_old_chain_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    inj = injector(tmp_path, clock=clock)
    before = json.loads(apply(inj))["requester"]
    path = tmp_path / "delegation.jwt"
    caplog.set_level(logging.INFO, logger="signing_proxy.requester")
    path.unlink()
    for _ in range(3):
        clock.now += 1.5
        assert not inj.reload()
    lines = refusals(caplog)
    assert len(lines) == 1, lines
    assert str(path) in lines[0]
    assert "cannot read" in lines[0]
    assert json.loads(apply(inj))["requester"] == before  # the chain loaded before is still sent


def test_each_distinct_failure_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    inj = injector(tmp_path, clock=clock)
    path = tmp_path / "delegation.jwt"
    caplog.set_level(logging.INFO, logger="signing_proxy.requester")
    path.unlink()
    assert not inj.reload()
    path.write_text("garbage")  # another failure: logged too
    os.utime(path, ns=(1, 1))
    assert not inj.reload()
    assert not inj.reload()
    path.unlink()  # gone again: a new failure after the garbage one
    assert not inj.reload()
    assert len(refusals(caplog)) == 3
    write_chain(path, make_chain(exp=int(clock.now) + 1800))
    os.utime(path, ns=(2, 2))
    assert inj.reload()  # a good file again; then its removal is logged anew
    path.unlink()
    assert not inj.reload()
    assert not inj.reload()
    assert len(refusals(caplog)) == 4


def test_every_refusal_names_the_token_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A chain refused for what it carries (here: a scope not covering requester.scopes) was logged
    by its reason alone: which file to fix was left to guess. The line names it, whatever the reason."""
    clock = Clock()
    inj = injector(tmp_path, clock=clock)
    path = tmp_path / "delegation.jwt"
    caplog.set_level(logging.INFO, logger="signing_proxy.requester")
    write_chain(path, make_chain(scope=["subscription:news"]))
    os.utime(path, ns=(3, 3))
    assert not inj.reload()
    [line] = refusals(caplog)
    assert "not covered by the delegation's scope" in line
    assert str(path) in line
