"""The requests the engine refuses itself, before any reaches the handler, and who hears of them.

What cannot be parsed, a target or head over its limit, an upgrade we do not proxy: ``net.server``
answers these alone (RFC 9112 section 9.3.2: in their turn, after the answers to the requests read
before them), and tells a handler that is also :class:`Refusals` so that each still gets its
access-log line and its count. Only the refusal path comes here; a request served never does.
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

from ..errors import ProxyError

__all__ = ["Refusals", "parse_refusal", "tell"]

log = logging.getLogger("signing_proxy.proxy")


@runtime_checkable
class Refusals(Protocol):
    """A ``net.server.Handler`` that also hears of the requests the engine refused."""

    def refused(self, client_ip: str, error: ProxyError, method: str) -> None:
        """``error`` was written to the client at ``client_ip`` (whose connection then closes);
        ``method``: the request's, or ``""`` when it was refused before its head was read whole."""


def parse_refusal(exc: Exception) -> ProxyError:
    """The answer to what the parser raised: the ``ProxyError`` one of our callbacks raised in it
    (a limit), or ``400 malformed-request``."""
    cause = exc.__context__ if isinstance(exc.__context__, ProxyError) else exc
    if isinstance(cause, ProxyError):
        return cause
    return ProxyError(400, "malformed-request", f"cannot parse the request ({exc})")


def tell(handler: object, client_ip: str, error: ProxyError, method: str) -> None:
    """Tell ``handler`` of a refusal, if it listens; a failure of its own is logged, never raised
    into the connection that is answering."""
    if isinstance(handler, Refusals):
        try:
            handler.refused(client_ip, error, method)
        except Exception:  # a bug: the refusal is written all the same
            log.exception("unexpected error recording a refusal from %s", client_ip)
