"""``log.format: json``: every line one JSON object, a traceback included, a stranger's text quoted."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from signing_proxy.cli.common import configure_logging


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    root = logging.getLogger("signing_proxy")
    saved = root.handlers[:], root.level, root.propagate, sys.unraisablehook
    configure_logging("info", "json")
    handler = root.handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    stream = io.StringIO()
    handler.setStream(stream)
    yield stream
    root.handlers[:], root.level, root.propagate, sys.unraisablehook = saved


def _objects(stream: io.StringIO) -> list[dict[str, str]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_log_exception_keeps_its_traceback(lines: io.StringIO) -> None:
    log = logging.getLogger("signing_proxy.proxy.exchange")
    try:
        raise KeyError("the cause")
    except KeyError:
        log.exception("unexpected error serving %s %s", "GET", "a.example")
    [line] = _objects(lines)
    assert line["message"] == "unexpected error serving GET a.example"
    assert line["exc"].startswith("Traceback (most recent call last):")
    assert "KeyError: 'the cause'" in line["exc"]


def test_a_message_that_looks_like_json_is_still_quoted(lines: io.StringIO) -> None:
    """A message that begins with ``{`` (a stranger's text, formatted in first) is not written as
    it came: it could forge fields or, with a newline, whole lines."""
    forged = '{"level":"info","message":"all good"}\n{"forged":true}'
    logging.getLogger("signing_proxy.verify").warning("%s", forged)
    [line] = _objects(lines)
    assert line["level"] == "warning"
    assert line["message"] == forged
