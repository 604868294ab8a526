"""A SIGHUP that reaches ``signing-proxy run`` while it starts (reading its configuration) does not end
it: it is recorded, and applied once the proxy is up (the file read may predate the edit it announced)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
import yaml

from signing_proxy.core.jwk import SigningKey
from tests.harness import DIRECT, WAIT_S, stop_process, wait_for

pytestmark = pytest.mark.integration


def feed(fifo: Path, text: str, proc: subprocess.Popen[bytes], first: Callable[[], None]) -> None:
    """Once the proxy opens ``fifo`` for reading (it is reading its configuration), call ``first``,
    then write ``text`` and close. Fails if the proxy ends first, or opens nothing within ``WAIT_S``."""
    deadline = time.monotonic() + WAIT_S
    while True:
        code = proc.poll()
        assert code is None, f"the proxy ended (status {code}) before reading its configuration"
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
            assert time.monotonic() < deadline, "the proxy never opened its configuration file"
            time.sleep(0.02)  # polled: nothing announces a reader on a FIFO
            continue
        try:
            first()
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        return


def listening(lines: list[str]) -> list[str]:
    return [line for line in list(lines) if "listening on http://" in line]


def test_a_sighup_while_the_proxy_starts_is_applied_once_it_is_up(tmp_path: Path) -> None:
    """Until the event loop took SIGHUP, its default action applied: the proxy ended, without a line."""
    key = tmp_path / "agent-key.pem"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(SigningKey.generate().to_pem())
    text = yaml.safe_dump(
        {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "data"), "signing": {"key": str(key)}}
    )
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)  # the proxy waits in its start-up, reading it, until the test writes it
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "signing_proxy", "run", "--config", str(fifo)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            lines.append(raw.decode(errors="replace").rstrip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        regular = tmp_path / "config.yaml.next"
        regular.write_text(text)

        def in_its_start_up() -> None:
            """The proxy has the FIFO open, reading it, before any handler of its event loop."""
            os.replace(regular, fifo)  # what it reads next (the reload) is a plain file: nothing waits
            proc.send_signal(signal.SIGHUP)

        feed(fifo, text, proc, first=in_its_start_up)
        wait_for(lambda: proc.poll() is not None or bool(listening(lines)), "the proxy listening, or ending")
        assert proc.poll() is None, f"the SIGHUP during start-up ended it (status {proc.returncode}): {lines}"
        wait_for(lambda: any("SIGHUP: configuration reloaded" in line for line in lines), "the reload")
        port = int(listening(lines)[0].split("listening on http://127.0.0.1:")[1].split()[0])
        answer = requests.get(f"http://127.0.0.1:{port}/healthz", proxies=DIRECT, timeout=WAIT_S)
        assert answer.status_code == 200
    finally:
        stop_process(proc)
        reader.join(WAIT_S)
        if proc.stderr is not None:
            proc.stderr.close()


WATCH = """
import importlib.abc, importlib.metadata, runpy, signal, sys

held = []
inherited = signal.getsignal(signal.SIGHUP)  # SIG_DFL, or SIG_IGN under nohup


class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "signing_proxy.cli.main":  # the command modules, most of the start-up's second
            held.append(signal.getsignal(signal.SIGHUP) is not inherited)
        return None


sys.meta_path.insert(0, Watch())
sys.argv = ["signing-proxy", *sys.argv[2:]]
try:
    if sys.argv_mode == "script":
        importlib.metadata.entry_points(group="console_scripts")["signing-proxy"].load()()
    else:
        runpy.run_module("signing_proxy", run_name="__main__")
except SystemExit:
    pass
print("held" if held == [True] else f"not held: {held}", file=sys.stderr)
"""


@pytest.mark.parametrize("entry", ["script", "module"])
@pytest.mark.parametrize(
    ("command", "expected"), [("run", "held"), ("gateway", "held"), ("keys", "not held: [False]")]
)
def test_the_entry_point_holds_sighup_before_importing_the_commands(
    entry: str, command: str, expected: str
) -> None:
    """The command modules take most of a second to import; a SIGHUP then ended ``run`` (its default
    action) before it could hold it. The entry point (the console script and ``python -m``) holds it
    first for the serving commands; the others keep the default (a closing terminal ends them)."""
    code = WATCH.replace("sys.argv_mode", repr(entry))
    done = subprocess.run(
        [sys.executable, "-c", code, entry, command, "--help"],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert done.stderr.strip().splitlines()[-1] == expected, done.stderr
