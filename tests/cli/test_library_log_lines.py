"""What asyncio and aiohttp log reaches the proxy's own handlers (``configure_logging``) as one line:
the library's first words, up to any quoted value, and the exception's type; no traceback, no
exception text, none of the arguments a callback was given.

Nobody configured their loggers: Python's last-resort handler wrote such a record to stderr, a
traceback over many lines past ``log.format: json`` quoting the exception's text (a stranger's
bytes), in a blocking write.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from signing_proxy.cli.common import LIBRARY_LOGGERS, _unquoted, configure_logging

SECRET = "SECRET-XYZ"


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """``configure_logging("info", "json")`` writing to a buffer; every logger it set put back after."""
    root = logging.getLogger("signing_proxy")
    libraries = [logging.getLogger(name) for name in LIBRARY_LOGGERS]
    saved = root.handlers[:], root.level, root.propagate, sys.unraisablehook
    saved_libraries = [library.handlers[:] for library in libraries]
    configure_logging("info", "json")
    handler = root.handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    stream = io.StringIO()
    handler.setStream(stream)
    yield stream
    root.handlers[:], root.level, root.propagate, sys.unraisablehook = saved
    for library, handlers in zip(libraries, saved_libraries, strict=True):
        library.handlers[:] = handlers


def _objects(stream: io.StringIO) -> list[dict[str, str]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def _fail(value: bytes) -> None:
    raise ValueError(f"cannot parse {value!r}")


def test_an_exception_in_an_event_loop_callback_is_one_line_without_its_text(lines: io.StringIO) -> None:
    loop = asyncio.new_event_loop()
    try:
        loop.call_soon(_fail, f"Authorization: Bearer {SECRET}".encode())
        done = loop.create_future()
        loop.call_soon(done.set_result, None)  # after the callback: the loop runs them in order
        loop.run_until_complete(asyncio.wait_for(done, 10))
    finally:
        loop.close()
    [line] = _objects(lines)
    assert line["logger"] == "asyncio"
    assert line["level"] == "error"
    assert line["message"] == "Exception in callback _fail: ValueError"
    assert "exc" not in line
    assert SECRET not in lines.getvalue()


def test_an_aiohttp_record_with_a_traceback_is_one_line(lines: io.StringIO) -> None:
    try:
        _fail(SECRET.encode())
    except ValueError:
        logging.getLogger("aiohttp.server").exception("Error handling request from %s", "127.0.0.1")
    [line] = _objects(lines)
    assert line["logger"] == "aiohttp.server"
    assert line["message"] == "Error handling request from 127.0.0.1: ValueError"
    assert "exc" not in line
    assert SECRET not in lines.getvalue()


def test_a_line_that_quotes_at_once_says_so_and_a_long_one_is_cut_at_200_characters(
    lines: io.StringIO,
) -> None:
    logging.getLogger("asyncio").error("%r was never awaited", f"Bearer {SECRET}")
    logging.getLogger("asyncio").error("x" * 300 + " %s", SECRET)
    assert [line["message"] for line in _objects(lines)] == ["(details not shown)", "x" * 200]
    assert SECRET not in lines.getvalue()
    assert (
        _unquoted("Task exception was never retrieved future=<Task>")
        == "Task exception was never retrieved future"
    )


class _FailsOnDelete:
    def __del__(self) -> None:
        raise ValueError(f"Authorization: Bearer {SECRET}")


def test_an_error_python_cannot_raise_is_one_line_naming_where_and_the_kind_not_its_text(
    lines: io.StringIO,
) -> None:
    _FailsOnDelete()  # freed at once: its finalizer's error goes to sys.unraisablehook
    [line] = _objects(lines)
    assert line["level"] == "warning"
    assert line["message"] == "Exception ignored: _FailsOnDelete.__del__: ValueError"
    assert SECRET not in lines.getvalue()


def test_the_proxys_level_decides(lines: io.StringIO) -> None:
    logging.getLogger("signing_proxy").setLevel(logging.ERROR)
    logging.getLogger("asyncio").warning("socket.send() raised exception.")  # below: dropped
    logging.getLogger("asyncio").error("Unclosed connection")  # at it: one line
    assert [line["message"] for line in _objects(lines)] == ["Unclosed connection"]


def test_configured_twice_a_record_is_still_one_line(lines: io.StringIO) -> None:
    root = logging.getLogger("signing_proxy")
    handler = root.handlers[0]
    configure_logging("info", "json")  # a reload, a test: the forwarding is replaced, not added
    root.handlers[:] = [handler]
    logging.getLogger("asyncio").error("Fatal error on transport")
    assert [line["message"] for line in _objects(lines)] == ["Fatal error on transport"]
