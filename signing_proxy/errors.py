"""The proxy's own error responses: RFC 9457 problem+json with a stable ``reason``.

The status says whose fault it was (400 the request, 403/407 the client, 413 the body, 502/504
the upstream, 503 us). ``detail`` is for people and never carries a secret.
"""

from __future__ import annotations

import json
from http import HTTPStatus

__all__ = ["ProxyError", "problem_body"]

PROBLEM_TYPE_BASE = "https://signing-proxy.dev/problems/"  # documentation anchors, one per reason


class ProxyError(Exception):
    """An error the proxy answers itself, instead of forwarding."""

    def __init__(self, status: int, reason: str, detail: str = "", headers: tuple[tuple[str, str], ...] = ()):
        super().__init__(f"{status} {reason}: {detail}")
        self.status = status
        self.reason = reason
        self.detail = detail
        self.headers = headers


def problem_body(status: int, reason: str, detail: str = "", **extra: object) -> bytes:
    """A problem+json document; ``reason`` is the stable machine code."""
    doc: dict[str, object] = {
        "type": PROBLEM_TYPE_BASE + reason,
        "title": HTTPStatus(status).phrase,
        "status": status,
        "reason": reason,
    }
    if detail:
        doc["detail"] = detail
    doc.update(extra)
    return json.dumps(doc, separators=(",", ":")).encode()
