"""The access log: one line per request (and per tunnel that ended), text or JSON.

Off with ``log.access_log: false``, and with ``log.level`` above ``info``, like the
``signing_proxy.access`` logger it used to be written to. Lines carry the thumbprint of the key that
signed, never a key, token or credential. A line is formatted here, byte for byte what the configured
log formatter made of it (``cli/common.configure_logging``), and handed to ``write`` (the service's
buffered line writer): no ``logging`` record and no system call per request (issue 21).

A request only records its fields (and the time): the exchange appends its record to ``records``
itself, the body of ``request`` written out, since the call alone cost about 1.3 us per request in
place (issue 21). ``later`` (the writer's: before its next flush or close) has ``flush`` format what
gathered in one loop and write it as one block (at once when ``MAX_PENDING`` records wait): formatted
between two requests, a line cost about five times what it costs in that loop. Without ``later`` each
line is formatted and written at once.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from json.encoder import encode_basestring_ascii

__all__ = ["AccessLog"]

_encode = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps(..., separators=(",", ":"))
# the text formatter's "%(asctime)s %(levelname)s %(name)s: " after the seconds: ",mmm INFO name: "
_MILLIS = tuple(f"{ms:03d} INFO signing_proxy.access: " for ms in range(1000))
# A duration d in hundredths of a millisecond is written f"{d // 100}{_HUNDREDTHS[d % 100]}": for
# 0 <= d < _EXACT exactly repr(d / 100), as json.dumps and str() wrote the float the log once held
# ("0.3", "1.25", "7.0"), in a third of the time (a float's shortest repr was the costliest field).
_HUNDREDTHS = tuple(f".{c:02d}".rstrip("0") if c else ".0" for c in range(100))
# Below it a double's spacing is under 0.005, so no shorter decimal reads back as d / 100 (above
# 10**15 repr() may: 99999999999999.98 for d = 10**16 - 1). Three centuries: the general path past it.
_EXACT = 10**15
# lines waiting to be formatted: past this, formatted at once (the flush timer formats fewer). A batch
# this size still formats in one loop, and what waits (~128 tuples, their floats and hosts: ~40 KB)
# stays in the core's cache until formatted; 1,024 (one batch per ~100 ms at 12,000 requests/s, ~300
# KB of records kept alive) cost 0.5 us more per request in place (issue 21: 30 paired rounds, two
# runs). A host is at most 253 characters (core.uri.MAX_HOST_CHARS; a CONNECT target is cut to 259),
# the other fields are shorter: what waits stays small whatever strangers send.
MAX_PENDING = 128
# (whether its log writes JSON, time, client, method, host, status, duration in hundredths of a
#  millisecond, bytes_in, bytes_out, keyid, profile, outcome). Atoms only, not the log itself: the
# cycle collector untracks such a tuple at its first pass. One holding the log stayed tracked, was
# promoted with the others waiting for a flush (~200 then) and walked again by older passes (about 0.2 us
# per request at Python's thresholds, timed with gc.callbacks).
Record = tuple[bool, float, str, str, str, int | None, int, int, int, str | None, str | None, str]
Pending = list[Record | str]  # records, and the lines of events (formatted at once), in order


class AccessLog:
    """Formats access-log lines (``log.format``: ``text`` or ``json``) and hands them to ``write``."""

    __slots__ = ("_later", "_pending", "_second", "_stamp", "_write", "json", "records")

    def __init__(
        self,
        *,
        enabled: bool,
        fmt: str,
        write: Callable[[str], None],
        later: Callable[[Callable[[], None]], None] | None = None,
        pending: Pending | None = None,
    ) -> None:
        """``enabled``: whether lines are written at all (``log.access_log``, and ``log.level`` at
        ``info`` or below: the level of a reload is set after its log is made, so the caller decides).
        ``pending``: where lines wait, shared by the logs of successive reloads (a request in flight
        logs to the log it started with) so that they keep their order."""
        self.json = fmt == "json"
        self._write = write  # one or more whole lines
        self._later = later or _at_once
        self._pending: Pending = [] if pending is None else pending
        self._second = -1  # the second whose local time _stamp holds
        self._stamp = ""
        # where a request's Record goes (then ``recorded``): the queue, or None when no line is written
        self.records: Pending | None = self._pending if enabled else None

    def request(  # noqa: PLR0917 - a line's fields, in its order
        self,
        client: str,
        method: str,
        host: str,
        status: int | None,
        duration_10us: int,
        bytes_in: int,
        bytes_out: int,
        keyid: str | None,
        profile: str | None,
        outcome: str,
    ) -> None:
        """One request: ``key=value`` pairs (None values left out), or a JSON object. The exchange
        appends the same ``Record`` to ``records`` itself (this call, written out: issue 21).

        ``duration_10us``: how long it took, in hundredths of a millisecond (written ``duration_ms``,
        as the float ``duration_10us / 100`` is written)."""
        if self.records is None:
            return
        self._queue(
            (
                self.json,
                time.time(),
                client,
                method,
                host,
                status,
                duration_10us,
                bytes_in,
                bytes_out,
                keyid,
                profile,
                outcome,
            )
        )

    def recorded(self) -> None:
        """After appending the first record to ``records`` (or the ``MAX_PENDING``-th): the flush is
        asked for, or it happens now."""
        if len(self._pending) >= MAX_PENDING:
            self.flush()
        else:
            self._later(self.flush)

    def event(self, event: str, **fields: object) -> None:
        """Something that is not one request (a tunnel that ended)."""
        if self.records is None:
            return
        if self.json:
            line = _json_line(event, fields)
        else:
            pairs = " ".join([f"event={event}", *(f"{k}={v}" for k, v in fields.items())])
            line = f"{self._prefix(time.time())}{pairs}\n"
        self._queue(line)  # after the requests recorded before it

    def _queue(self, item: Record | str) -> None:
        """Wait for the writer's next flush; past ``MAX_PENDING`` waiting, go out now."""
        pending = self._pending
        pending.append(item)
        waiting = len(pending)
        if waiting == 1 or waiting >= MAX_PENDING:
            self.recorded()

    def flush(self) -> None:
        """Format what waits (any log's), in order, and write it as one block; idempotent."""
        pending = self._pending
        if not pending:
            return
        items = pending.copy()
        pending.clear()  # the list is shared: emptied, never replaced
        text, json_ = self._text, self._json  # each record in its own log's format
        try:
            block = "".join(
                [item if isinstance(item, str) else json_(item) if item[0] else text(item) for item in items]
            )
        except Exception:  # a bug: the lines that can be formatted still go out
            block = "".join(self._each_line(items))
        self._write(block)

    def _each_line(self, items: Pending) -> Iterator[str]:
        """The lines of ``items`` that can be formatted; each that cannot is logged as the bug it is."""
        for item in items:
            try:
                yield item if isinstance(item, str) else self._json(item) if item[0] else self._text(item)
            except Exception:
                logging.getLogger("signing_proxy").exception("an access-log line could not be formatted")

    def _text(self, record: Record) -> str:
        # one unpacking: slicing made two tuples per line
        _, now, client, method, host, status, duration, bytes_in, bytes_out, keyid, profile, outcome = record
        if status is None or host is None or not 0 <= duration < _EXACT:  # uncommon: the general writer
            return f"{self._prefix(now)}{_pairs(record)}\n"
        second = int(now)  # the common shape: one f-string, _prefix(now) written out
        if second != self._second:
            self._new_second(now, second)
        signer = "" if keyid is None else f" keyid={keyid}"
        if profile is not None:
            signer += f" profile={profile}"
        return (
            f"{self._stamp}{_MILLIS[int((now - second) * 1000)]}client={client} method={method} "
            f"host={host} status={status} duration_ms={duration // 100}{_HUNDREDTHS[duration % 100]} "
            f"bytes_in={bytes_in} bytes_out={bytes_out}{signer} outcome={outcome}\n"
        )

    @staticmethod
    def _json(record: Record) -> str:
        _, _, client, method, host, status, duration, bytes_in, bytes_out, keyid, profile, outcome = record
        if (
            status.__class__ is duration.__class__ is bytes_in.__class__ is bytes_out.__class__ is int
            and 0 <= duration < _EXACT  # not bool, not None
        ):
            e = encode_basestring_ascii  # json.dumps's own string encoder; ints and floats as it writes them
            signer = "null" if keyid is None else e(keyid)
            named = "null" if profile is None else e(profile)
            return (
                f'{{"event":"request","client":{e(client)},"method":{e(method)},"host":{e(host)},'
                f'"status":{status!r},"duration_ms":{duration // 100}{_HUNDREDTHS[duration % 100]},'
                f'"bytes_in":{bytes_in!r},'
                f'"bytes_out":{bytes_out!r},"keyid":{signer},"profile":{named},"outcome":{e(outcome)}}}\n'
            )
        return _json_line("request", dict(zip(_FIELDS, _values(record), strict=True)))

    def _prefix(self, now: float) -> str:
        """What ``logging.Formatter`` puts before a message, for a record made at ``now`` (3.11 rules)."""
        second = int(now)
        if second != self._second:
            self._new_second(now, second)
        return self._stamp + _MILLIS[int((now - second) * 1000)]

    def _new_second(self, now: float, second: int) -> None:
        self._second = second  # strftime once a second: "%(asctime)s" up to its milliseconds
        self._stamp = time.strftime("%Y-%m-%d %H:%M:%S,", time.localtime(now))


_FIELDS = (
    "client",
    "method",
    "host",
    "status",
    "duration_ms",
    "bytes_in",
    "bytes_out",
    "keyid",
    "profile",
    "outcome",
)


def _at_once(flush: Callable[[], None]) -> None:
    flush()


def _values(record: Record) -> tuple[object, ...]:
    """A request's fields in ``_FIELDS`` order, the duration in milliseconds (a float)."""
    return (*record[2:6], record[6] / 100, *record[7:])


def _pairs(record: Record) -> str:
    """A request's ``key=value`` pairs, None values left out."""
    return " ".join([f"{k}={v}" for k, v in zip(_FIELDS, _values(record), strict=True) if v is not None])


def _json_line(event: str, fields: Mapping[str, object]) -> str:
    """``json.dumps({"event": event, **fields}, separators=(",", ":"))`` and a newline, in half the time.

    Strings, ints, finite floats and None are written here; anything else goes through the encoder.
    Keys are keyword-argument names of our own (ASCII identifiers): nothing in them to escape.
    """
    parts = ['{"event":', encode_basestring_ascii(event)]
    for key, value in fields.items():
        if isinstance(value, str):  # a subclass too, like json
            text = encode_basestring_ascii(value)
        elif value is None:
            text = "null"
        elif value.__class__ is int or (value.__class__ is float and math.isfinite(value)):
            text = repr(value)
        else:  # bool, NaN, anything unusual: exactly what json.dumps writes
            text = _encode(value)
        parts.append(f',"{key}":{text}')
    parts.append("}\n")
    return "".join(parts)
