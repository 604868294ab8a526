"""``logline``: the one "a record we did not write, as one line" of the package (``cli.common``'s
forwarding of asyncio and aiohttp, ``service.gate``'s filter): the first line, the exception's kind,
never its text nor its traceback."""

from __future__ import annotations

import logging

from signing_proxy.logline import carried, exception_kind, line_of, say_only

SECRET = "SECRET-XYZ"


def _record(
    msg: str, *args: object, exc: BaseException | None = None, traceback_text: str | None = None
) -> logging.LogRecord:
    """A library's record; ``traceback_text``: the formatted traceback a handler cached (``exc_text``)
    and a stack (``stack_info=True``), both holding it."""
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    sinfo = None if traceback_text is None else f"Stack (most recent call last):\n  {traceback_text}"
    record = logging.LogRecord(
        "aiohttp.server", logging.ERROR, __file__, 1, msg, args or None, exc_info, None, sinfo
    )
    record.exc_text = traceback_text
    return record


def test_a_multi_line_record_with_a_traceback_is_one_line_naming_the_exceptions_kind() -> None:
    raised: KeyError | None = None
    try:
        raise KeyError(f"Authorization: Bearer {SECRET}")
    except KeyError as exc:
        raised = exc
    assert raised is not None
    assert raised.__traceback__ is not None
    record = _record(
        "Error handling request from %s\nsecond line %s",
        "127.0.0.1",
        SECRET,
        exc=raised,
        traceback_text=f"Traceback (most recent call last):\n  KeyError: {SECRET}",
    )
    assert carried(record) is raised
    text = line_of(record)
    assert text == "Error handling request from 127.0.0.1: KeyError"
    say_only(record, text)
    shown = logging.Formatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert shown == "ERROR aiohttp.server: Error handling request from 127.0.0.1: KeyError"
    assert SECRET not in shown
    assert (record.args, record.exc_info, record.exc_text, record.stack_info) == (None, None, None, None)


def test_the_kind_is_the_types_name_and_a_shortened_line_still_gets_it() -> None:
    assert exception_kind(ValueError(SECRET)) == "ValueError"
    record = _record("Exception in callback %r\nTraceback", SECRET, exc=OSError(SECRET))
    assert line_of(record, lambda text: text.split(" ", 1)[0]) == "Exception: OSError"
    assert line_of(_record("no exception\nhere")) == "no exception"


def test_format_arguments_that_do_not_fit_give_the_format_alone() -> None:
    record = _record("%d connections\nmore", "not a number")
    assert line_of(record) == "%d connections"
    assert carried(record) is None
