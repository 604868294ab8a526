from __future__ import annotations

import gc
import json
import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.softhsm import SoftHsm

VECTORS = Path(__file__).parent / "vectors"


def load_vector(name: str) -> Any:
    return json.loads((VECTORS / name).read_text())


@pytest.fixture
def vectors() -> Any:
    return load_vector


@pytest.fixture(autouse=True)
def _package_logger_as_found() -> Iterator[None]:
    """An in-process app sets the package logger's level from its configuration (``info`` by
    default) and routes its handlers: every test leaves the logger as it found it. Left at ``info``,
    a later test's refusals were captured by pytest as records, 70 MB of them in one test."""
    logger = logging.getLogger("signing_proxy")
    saved = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    """The cycle collector off for the test: what a test then finds freed went by reference
    counting alone (the proxy freezes its start-up heap and rarely runs a full pass)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def hsm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SoftHsm:
    """A SoftHSM2 token of its own (in ``tmp_path / "hsm"``), this process's PKCS#11 modules pointed
    at it: not the token an earlier test left initialised."""
    from tests.softhsm import SoftHsm, use_in_this_process  # only for tests asking

    token = SoftHsm(tmp_path / "hsm")
    use_in_this_process(token, monkeypatch)
    return token


@pytest.fixture
def parent_handlers() -> Iterator[None]:
    """A test that runs ``run_workers`` in this process gets the parent's signal handlers installed
    here: the test runner's are put back after it."""
    from signing_proxy.service.workers import SIGNALS

    saved = {sig: signal.getsignal(sig) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
