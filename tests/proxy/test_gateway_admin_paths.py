"""A gateway with an admin port answers /healthz, /readyz and /metrics only there.

On the public port they were answered to any client in ``access.allow_clients`` (``0.0.0.0/0`` in
the shipped ``config/gateway.yaml``), which made ``admin.allow_clients`` no bound at all (and
shadowed the backend's paths of those names). Now they are requests like any other: verified.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from tests.harness import WAIT_S, ProxyProcess
from tests.proxy.gateway_backend import Backend

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/readyz"])
def test_the_admin_paths_are_not_answered_on_the_public_port(tmp_path: Path, path: str) -> None:
    with Backend() as backend:
        config = {
            "mode": "gateway",
            "gateway": {"upstream": backend.url},
            "access": {"allow_clients": ["0.0.0.0/0"]},
            "admin": {"listen": "127.0.0.1:0", "allow_clients": ["10.0.0.0/8"]},  # not us
        }
        with ProxyProcess(tmp_path, config) as gateway:
            admin = requests.get(f"http://127.0.0.1:{gateway.admin_port}{path}", timeout=WAIT_S)
            public = requests.get(f"http://127.0.0.1:{gateway.port}{path}", timeout=WAIT_S)
    assert admin.status_code == 403  # admin.allow_clients holds
    assert public.status_code == 401  # an unsigned request to the backend's path of that name
    assert json.loads(public.content)["reason"] == "missing-signature"
    assert b"signing_proxy_" not in public.content
