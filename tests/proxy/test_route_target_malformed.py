"""A route's target the proxy cannot read (a lone ``%``, a character RFC 3986 has percent-encoded:
``|``, ``"``, ``{``...) is the client's ``400 malformed-target``, as an absolute-form one is. On a
route (every gateway request, an agent's or a relay's sidecar route) it escaped as a ``FieldError``
into the catch-all: ``500 internal-error`` and a logged traceback per request, for anyone who asks,
before any check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.core.errors import FieldError
from signing_proxy.proxy.exchange import Routes
from tests.harness import ProxyProcess
from tests.proxy.test_gateway_spelling import get, recording_backend

MALFORMED = ["/api/a%zz", "/api/a|b", '/api/a"b', "/api/a{b", "/api/a%"]


@pytest.mark.parametrize("raw", MALFORMED)
def test_routes_refuse_what_they_cannot_read_as_a_field_error(raw: str) -> None:
    with pytest.raises(FieldError) as refused:
        Routes([("/api/", "http://127.0.0.1:9000/")], as_received=True).target_for(raw)
    assert refused.value.reason == "malformed-target"


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["gateway", "agent"])
def test_a_malformed_target_on_a_route_is_400_and_logs_no_error(tmp_path: Path, mode: str) -> None:
    with recording_backend() as (backend_port, seen):
        backend = f"http://127.0.0.1:{backend_port}"
        config: dict[str, Any] = {"log": {"format": "json"}}
        if mode == "gateway":
            config |= {"mode": "gateway", "gateway": {"upstream": backend}}
        else:
            config |= {"routes": [{"prefix": "/api/", "upstream": f"{backend}/"}]}
        with ProxyProcess(tmp_path, config) as proxy:
            answers = [get(proxy.port, raw, f"127.0.0.1:{proxy.port}", []) for raw in MALFORMED]
            lines = list(proxy.stderr_lines)
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["reason"] == "malformed-target"
    assert seen == []  # nothing reached the backend
    assert not [line for line in lines if '"level":"error"' in line or "Traceback" in line], lines
