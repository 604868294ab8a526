"""One line of a log record we did not write (asyncio's, aiohttp's), and an exception named in a log
line by its kind: its type's name, never its text, never its traceback.

A library's record carries an exception whose text may quote a stranger's bytes (a malformed header
line, ``Authorization: Bearer ...``), a file, and a PIN or a token in it; its traceback runs over
many lines, past ``log.format: json``. What the command line forwards (``cli.common``) and what our
gated listeners log (``service.gate``) are made one line here, by the same rules.

Beside ``errors``, ``metrics`` and ``ratelog``: every layer may use it, it uses no layer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

__all__ = ["carried", "exception_kind", "line_of", "say_only"]


def exception_kind(exc: BaseException) -> str:
    """An exception that is not ours, for a log line: its type's name, never its text (which may
    quote a file, and a PIN or a token in it)."""
    return type(exc).__name__


def carried(record: logging.LogRecord) -> BaseException | None:
    """The exception ``record`` carries (``log.exception``, ``exc_info=``), if any."""
    return record.exc_info[1] if record.exc_info else None


def line_of(record: logging.LogRecord, shorten: Callable[[str], str] | None = None) -> str:
    """``record``'s message as one line: its first line (its format alone when its arguments do not
    fit it), ``shorten``-ed when given, then ``: KIND`` (:func:`exception_kind`) of the exception it
    carries. Neither the exception's text nor its traceback."""
    try:
        text = record.getMessage()
    except Exception:  # a library's bad format arguments: its format alone
        text = str(record.msg)
    text = text.split("\n", 1)[0]
    if shorten is not None:
        text = shorten(text)
    exc = carried(record)
    return text if exc is None else f"{text}: {exception_kind(exc)}"


def say_only(record: logging.LogRecord, text: str) -> None:
    """``record`` made to say ``text`` and nothing else: no arguments, no exception, no traceback,
    no stack, for whichever handler formats it."""
    record.msg, record.args = text, None
    record.exc_info = record.exc_text = record.stack_info = None
