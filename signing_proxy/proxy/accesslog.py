"""The access log: one line per request (and per tunnel that ended), text or JSON.

Written to the ``signing_proxy.access`` logger; off with ``log.access_log: false``. Lines carry the
thumbprint of the key that signed, never a key, token or credential.
"""

from __future__ import annotations

import json
import logging

__all__ = ["AccessLog"]

_log = logging.getLogger("signing_proxy.access")


class AccessLog:
    """Formats and writes access-log lines (``log.format``: ``text`` or ``json``)."""

    __slots__ = ("enabled", "json")

    def __init__(self, *, enabled: bool, fmt: str) -> None:
        self.enabled = enabled
        self.json = fmt == "json"

    def request(self, **fields: object) -> None:
        """One request: ``key=value`` pairs (None values left out), or a JSON object."""
        if not self.enabled or not _log.isEnabledFor(logging.INFO):
            return
        if self.json:
            _log.info(json.dumps({"event": "request", **fields}, separators=(",", ":")))
        else:
            _log.info(" ".join(f"{k}={v}" for k, v in fields.items() if v is not None))

    def event(self, event: str, **fields: object) -> None:
        """Something that is not one request (a tunnel that ended)."""
        if not self.enabled or not _log.isEnabledFor(logging.INFO):
            return
        if self.json:
            _log.info(json.dumps({"event": event, **fields}, separators=(",", ":")))
        else:
            _log.info(" ".join([f"event={event}", *(f"{k}={v}" for k, v in fields.items())]))
