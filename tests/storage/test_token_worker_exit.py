"""A token call that never returns never keeps the process from exiting: the module's signing
thread and the token prober are daemon threads, not a ThreadPoolExecutor's (joined at exit), and
calls still run one at a time in the order submitted."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from signing_proxy.storage.worker import DaemonWorker

ROOT = Path(__file__).resolve().parents[2]
EXIT_WAIT_S = 20  # bounded: far above what a Python start and exit take

_HUNG = """
    import asyncio, threading
    from signing_proxy.core.jwk import SigningKey
    from signing_proxy.core.pkcs11_uri import parse_pkcs11_uri
    from signing_proxy.storage.pkcs11 import Pkcs11KeyProvider, TokenKey, TokenSlot, module_for

    entered = threading.Event()

    def hung(*args):  # a network HSM that stopped answering mid-call
        entered.set()
        threading.Event().wait()

    uri = parse_pkcs11_uri("pkcs11:token=t;object=k")
    slot = TokenSlot(module_for("/nonexistent/module.so"), uri, None, 0.2)
    key = TokenKey(slot, uri, SigningKey.generate().public)
"""

_SIGN = """
    from signing_proxy.errors import TokenError
    TokenKey.sign = hung
    try:
        asyncio.run(key.sign_async(b"base"))
    except TokenError as exc:
        print(exc.reason, flush=True)
    assert entered.wait(10)
    print("returning", flush=True)
"""

_PROBE = """
    from signing_proxy.service.keys import KeyServices
    TokenKey.probe = hung
    slot.failure = "token-unavailable"

    async def main():
        services = KeyServices()
        services.token_providers.append(Pkcs11KeyProvider(key))
        services.start_refresh(interval_s=0.05)
        assert await asyncio.to_thread(entered.wait, 10)
        await services.stop()

    asyncio.run(main())
    print("returning", flush=True)
"""


def run_to_exit(script: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = textwrap.dedent(_HUNG) + textwrap.dedent(script)
    with subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            out, err = proc.communicate(timeout=EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate(timeout=EXIT_WAIT_S)
            pytest.fail(f"still running {EXIT_WAIT_S} s after main returned: {out!r} {err[-2000:]!r}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_signature_that_never_returns_does_not_hold_up_exit() -> None:
    result = run_to_exit(_SIGN)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["token-unavailable", "returning"]


def test_a_probe_that_never_returns_does_not_hold_up_exit() -> None:
    result = run_to_exit(_PROBE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["returning"]


def test_calls_run_one_at_a_time_in_order_on_one_daemon_thread() -> None:
    worker = DaemonWorker("test-worker")
    release = threading.Event()
    seen: list[tuple[int, str, bool]] = []

    def call(n: int) -> int:
        if n == 0:
            assert release.wait(10)
        thread = threading.current_thread()
        seen.append((n, thread.name, thread.daemon))
        return n * 10

    futures = [worker.submit(call, n) for n in range(5)]
    cancelled = worker.submit(call, 99)
    assert cancelled.cancel()  # still waiting behind the first: it never runs
    release.set()
    assert [f.result(timeout=10) for f in futures] == [0, 10, 20, 30, 40]
    assert seen == [(n, "test-worker", True) for n in range(5)]
    failing = worker.submit(int, "not a number")
    with pytest.raises(ValueError, match="invalid literal"):
        failing.result(timeout=10)
    worker.shutdown(wait=True)
    with pytest.raises(RuntimeError):
        worker.submit(call, 1)
