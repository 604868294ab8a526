"""The admin listener: ``/healthz``, ``/readyz`` and ``/metrics`` on their own port.

The proxy port already answers these as origin-form paths; a separate port lets a sidecar keep its
proxy port on pod-loopback while the kubelet probes and Prometheus scrapes from outside the pod.
It serves nothing else, and nothing it serves is secret.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from .. import __version__
from ..metrics import CONTENT_TYPE

if TYPE_CHECKING:
    from .app import ProxyApp

__all__ = ["build_admin_app"]


def build_admin_app(app: ProxyApp) -> web.Application:
    async def healthz(_r: web.Request) -> web.Response:
        return web.json_response(
            {"status": "ok", "version": __version__}, headers={"Cache-Control": "no-store"}
        )

    async def readyz(_r: web.Request) -> web.Response:
        status, doc = app.readiness()
        return web.json_response(doc, status=status, headers={"Cache-Control": "no-store"})

    async def metrics(_r: web.Request) -> web.Response:
        return web.Response(body=app.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    admin = web.Application()
    admin.router.add_get("/healthz", healthz)
    admin.router.add_get("/readyz", readyz)
    admin.router.add_get("/metrics", metrics)
    return admin
