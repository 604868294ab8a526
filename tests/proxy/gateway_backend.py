"""Loopback parts of the gateway tests: the backend behind the gateway (it records what arrives and
answers with the ``X-Verified-*`` fields it got), a delegation issuer's key directory, and the
requester bodies an agent sends."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import Directory, DirectoryKey, render_directory
from signing_proxy.core.requester import DelegationDoc, RequesterDoc
from tests.harness import OnItsOwnLoop

DISCOVER = "/v1/svc.v1.ExchangeService/DiscoverResources"
OWNER_ISS = "https://owner.example"


@dataclass
class Backend(OnItsOwnLoop):
    """The service behind the gateway; also serves key directories: ``/<name>`` -> ``directories[name]``."""

    thread_name = "backend"

    directories: dict[str, list[DirectoryKey]] = field(default_factory=dict)
    manifest: bytes | None = None  # served at /.well-known/svc.json (max-age=1)
    arrivals: list[dict[str, str]] = field(default_factory=list)
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _ready: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def issuer_directory(self) -> str:
        return f"{self.url}/issuer"

    async def _any(self, request: web.Request) -> web.Response:
        await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.arrivals.append(headers)
        # what a CGI or WSGI backend would read as X-Verified-*: "_" and "-" folded together
        verified = {k: v for k, v in headers.items() if k.replace("_", "-").startswith("x-verified-")}
        return web.json_response({"path": request.path, "verified": verified})

    async def _directory(self, request: web.Request) -> web.Response:
        keys = self.directories.get(request.match_info["name"])
        if keys is None:
            raise web.HTTPNotFound()
        body = render_directory(Directory(tuple(keys)))
        return web.Response(body=body, content_type="application/http-message-signatures-directory+json")

    async def _manifest(self, _request: web.Request) -> web.Response:
        if self.manifest is None:
            raise web.HTTPNotFound()
        return web.Response(
            body=self.manifest, content_type="application/json", headers={"Cache-Control": "max-age=1"}
        )

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application()
        app.router.add_get("/{name}/.well-known/http-message-signatures-directory", self._directory)
        app.router.add_get("/.well-known/svc.json", self._manifest)
        app.router.add_route("*", "/{tail:.*}", self._any)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)

        async def start() -> None:
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = runner.addresses[0][1]

        loop.run_until_complete(start())
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()


def issuer_key(key: SigningKey, *, ended_ago_s: int | None = None) -> DirectoryKey:
    """A published issuer key: valid now, or rotated out ``ended_ago_s`` seconds ago."""
    now = int(time.time())
    if ended_ago_s is None:
        return DirectoryKey(key.public, now - 3600, now + 86_400)
    return DirectoryKey(key.public, now - 86_400, now - ended_ago_s)


def exchange_body(chain: str | None = None, *, expires_at: float | None = None, **requester: Any) -> bytes:
    """A DiscoverResources body whose requester carries ``chain`` (mirrors no wider than its claims)."""
    delegation = None
    if chain is not None:
        delegation = DelegationDoc(
            principal_domain="corp.example",
            principal_id="alice",
            expires_at=expires_at if expires_at is not None else time.time() + 600,
            token=chain,
        )
    doc = RequesterDoc(
        id="agent-7",
        domain="agent.example",
        type="REQUESTER_TYPE_AGENT" if delegation is None else "REQUESTER_TYPE_DELEGATED",
        delegation=delegation,
    ).proto_json()
    doc.update(requester)
    return json.dumps({"ver": "1.0", "uris": ["https://pub.example/a"], "requester": doc}).encode()
