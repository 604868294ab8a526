"""The configuration file is a regular file of at most ``MAX_CONFIG_BYTES`` (1 MiB), or at start-up a pipe.

``/dev/zero`` given as the file was read without end (``config check`` never returned); a device
such as ``/dev/null`` was read as an empty file (the defaults). On a SIGHUP reload, a FIFO at the
path held the event loop until written to: ``reloading`` refuses it without waiting.
"""

from __future__ import annotations

import errno
import os
import re
import threading
from pathlib import Path

import pytest

from signing_proxy.config import ConfigError, load_config, loading
from tests.harness import WAIT_S


def test_a_device_is_refused_naming_the_path() -> None:
    with pytest.raises(ConfigError, match=r"^/dev/null: not a regular file; cannot read config file$"):
        load_config(Path("/dev/null"))


def test_a_folder_is_refused_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(tmp_path)


def test_a_file_larger_than_the_cap_is_refused(tmp_path: Path) -> None:
    cap = loading.MAX_CONFIG_BYTES
    assert cap == 1024 * 1024
    path = tmp_path / "config.yaml"
    path.write_bytes(b"listen: 127.0.0.1:8080\n#" + b"x" * cap + b"\n")
    with pytest.raises(ConfigError, match=f"larger than {cap} bytes; not a config file"):
        load_config(path)
    path.write_bytes(b"listen: 127.0.0.1:8081\n#" + b"x" * (cap - 26) + b"\n")
    assert load_config(path).listen == "127.0.0.1:8081"  # cap - 1 bytes


def test_a_fifo_is_refused_at_once_while_reloading(tmp_path: Path) -> None:
    """No writer ever opens it: opened as at start-up, the read would wait for one forever."""
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    with (
        loading.reloading(),
        pytest.raises(ConfigError, match=re.escape("not a regular file (a pipe is read at start-up only)")),
    ):
        load_config(fifo)
    # the refusal closed it: no reader holds it open, so a writer's open finds none
    with pytest.raises(OSError, match=os.strerror(errno.ENXIO)):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_fifo_is_read_at_start_up(tmp_path: Path) -> None:
    """``--config <(...)``: nothing is served yet, the wait for the writer holds nothing."""
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)

    def write() -> None:
        with fifo.open("wb") as out:  # waits for the reader
            out.write(b"listen: 127.0.0.1:8082\n")

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        assert load_config(fifo).listen == "127.0.0.1:8082"
    finally:
        writer.join(WAIT_S)
    assert not writer.is_alive()
