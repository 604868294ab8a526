"""The access log: one line per request (and per tunnel that ended), text or JSON.

Off with ``log.access_log: false``, and below ``info`` like the ``signing_proxy.access`` logger it
used to be written to. Lines carry the thumbprint of the key that signed, never a key, token or
credential. A line is formatted here, byte for byte what the configured log formatter made of it
(``cli/common.configure_logging``), and handed to ``write`` (the service's buffered line writer):
no ``logging`` record and no system call per request (issue 21).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from json.encoder import encode_basestring_ascii

__all__ = ["AccessLog"]

_log = logging.getLogger("signing_proxy.access")  # its level still decides, as before
_INFO = logging.INFO
_encode = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps(..., separators=(",", ":"))
# the text formatter's "%(asctime)s %(levelname)s %(name)s: " after the seconds: ",mmm INFO name: "
_HUGE = math.inf  # a finite float is written as repr() writes it; inf and NaN take the general path
_MILLIS = tuple(f"{ms:03d} INFO signing_proxy.access: " for ms in range(1000))


class AccessLog:
    """Formats access-log lines (``log.format``: ``text`` or ``json``) and hands them to ``write``."""

    __slots__ = ("_second", "_stamp", "_write", "enabled", "json")

    def __init__(self, *, enabled: bool, fmt: str, write: Callable[[str], None]) -> None:
        self.enabled = enabled
        self.json = fmt == "json"
        self._write = write
        self._second = -1  # the second whose local time _stamp holds
        self._stamp = ""

    def request(  # noqa: PLR0917 - one call per request: positional, no dict of keywords
        self,
        client: str,
        method: str,
        host: str,
        status: int | None,
        duration_ms: float,
        bytes_in: int,
        bytes_out: int,
        keyid: str | None,
        profile: str | None,
        outcome: str,
    ) -> None:
        """One request: ``key=value`` pairs (None values left out), or a JSON object."""
        if not self.enabled or not _log.isEnabledFor(_INFO):
            return
        if (
            self.json
            and status.__class__ is bytes_in.__class__ is bytes_out.__class__ is int  # not bool, not None
            and duration_ms.__class__ is float
            and -_HUGE < duration_ms < _HUGE
        ):
            e = encode_basestring_ascii  # json.dumps's own string encoder; ints and floats as it writes them
            signer = "null" if keyid is None else e(keyid)
            named = "null" if profile is None else e(profile)
            self._write(
                f'{{"event":"request","client":{e(client)},"method":{e(method)},"host":{e(host)},'
                f'"status":{status!r},"duration_ms":{duration_ms!r},"bytes_in":{bytes_in!r},'
                f'"bytes_out":{bytes_out!r},"keyid":{signer},"profile":{named},"outcome":{e(outcome)}}}\n'
            )
            return
        if self.json or status is None or host is None:  # the uncommon shapes: the general writer
            fields = {
                "client": client,
                "method": method,
                "host": host,
                "status": status,
                "duration_ms": duration_ms,
                "bytes_in": bytes_in,
                "bytes_out": bytes_out,
                "keyid": keyid,
                "profile": profile,
                "outcome": outcome,
            }
            if self.json:
                self._write(_json_line("request", fields))
            else:
                pairs = " ".join([f"{k}={v}" for k, v in fields.items() if v is not None])
                self._write(f"{self._prefix()}{pairs}\n")
            return
        # the hot path of the default configuration: one f-string, _prefix() written out
        now = time.time()
        second = int(now)
        if second != self._second:
            self._new_second(now, second)
        signer = "" if keyid is None else f" keyid={keyid}"
        if profile is not None:
            signer += f" profile={profile}"
        self._write(
            f"{self._stamp}{_MILLIS[int((now - second) * 1000)]}client={client} method={method} "
            f"host={host} status={status} duration_ms={duration_ms} bytes_in={bytes_in} "
            f"bytes_out={bytes_out}{signer} outcome={outcome}\n"
        )

    def event(self, event: str, **fields: object) -> None:
        """Something that is not one request (a tunnel that ended)."""
        if not self.enabled or not _log.isEnabledFor(_INFO):
            return
        if self.json:
            self._write(_json_line(event, fields))
        else:
            pairs = " ".join([f"event={event}", *(f"{k}={v}" for k, v in fields.items())])
            self._write(f"{self._prefix()}{pairs}\n")

    def _prefix(self) -> str:
        """What ``logging.Formatter`` puts before a message, for a record made now (Python 3.11 rules)."""
        now = time.time()
        second = int(now)
        if second != self._second:
            self._new_second(now, second)
        return self._stamp + _MILLIS[int((now - second) * 1000)]

    def _new_second(self, now: float, second: int) -> None:
        self._second = second  # strftime once a second: "%(asctime)s" up to its milliseconds
        self._stamp = time.strftime("%Y-%m-%d %H:%M:%S,", time.localtime(now))


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
