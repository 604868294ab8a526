"""``signing-proxy config check FILE | head``: once ``head`` has its lines and exits, the next write
to stdout raised ``BrokenPipeError`` (Python ignores SIGPIPE) and the command ended with a
traceback; with the output still buffered, the flush at exit printed "Exception ignored" and the
status was 120. Now it ends quietly with exit status 1, as the Python documentation recommends.

stdout here is a pipe whose read end is closed before the command starts: every write fails."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import WAIT_S

GATEWAY_YAML = Path(__file__).resolve().parents[2] / "config" / "gateway.yaml"


@pytest.fixture
def reader_gone() -> Iterator[int]:
    """The write end of a pipe nobody reads."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        yield write_end
    finally:
        os.close(write_end)


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize(
    "args", [["config", "check", str(GATEWAY_YAML)], ["config", "check"]], ids=["gateway-yaml", "defaults"]
)
def test_a_reader_that_went_away_ends_the_command_quietly(
    args: list[str], buffered: bool, reader_gone: int
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNING_PROXY_")}
    env.pop("PYTHONUNBUFFERED", None)
    if not buffered:  # each print written at once: the print itself raises
        env["PYTHONUNBUFFERED"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "signing_proxy", *args],
        stdout=reader_gone,
        stderr=subprocess.PIPE,
        text=True,
        timeout=WAIT_S * 2,
        check=False,
        env=env,
    )
    assert done.stderr == ""  # no traceback, no "Exception ignored ... BrokenPipeError"
    assert done.returncode == 1


@pytest.mark.parametrize("args", [["--version"], ["config", "check", "--help"]])
def test_help_and_version_end_quietly_too(args: list[str], reader_gone: int) -> None:
    """argparse prints them and exits: the text was still buffered, flushed at exit ("Exception
    ignored", status 120)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIGNING_PROXY_", "PYTHONUNBUFFERED"))}
    done = subprocess.run(
        [sys.executable, "-m", "signing_proxy", *args],
        stdout=reader_gone,
        stderr=subprocess.PIPE,
        text=True,
        timeout=WAIT_S * 2,
        check=False,
        env=env,
    )
    assert done.stderr == ""
    assert done.returncode == 1


def test_a_reader_that_stays_sees_everything(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNING_PROXY_")}
    with out.open("w") as fh:
        done = subprocess.run(
            [sys.executable, "-m", "signing_proxy", "config", "check", str(GATEWAY_YAML)],
            stdout=fh,
            stderr=subprocess.PIPE,
            text=True,
            timeout=WAIT_S * 2,
            check=False,
            env=env,
        )
    assert done.returncode == 0, done.stderr
    assert out.read_text().startswith(f"# {GATEWAY_YAML}: OK\n")
