"""A loopback publisher for discovery tests, in four servers that verify every request they get.

``edge`` refuses direct crawls with 403 and ``X-Content-Rules`` (plain HTTP, or HTTPS with a test
CA) and serves, on its own origin, a catalogue of good and broken ``svc.json`` documents at
``/m/{name}.json``; ``manifests`` serves the same catalogue from another origin (127.0.0.1, another
port: cross-origin tests); ``exchange`` answers DiscoverResources after verifying layer 1 with the
proxy's own ``RequestVerifier`` and pinned keys (and, as every ``VerifyingOrigin``, with the
independent ``http-message-signatures``); ``internal`` stands for a service behind the proxy that a
publisher must never reach through discovery. Tests count arrivals at each. Every server binds
127.0.0.1 port 0.
"""

from __future__ import annotations

import json
import ssl
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlsplit

from aiohttp import web

from signing_proxy.core.errors import VerificationError
from signing_proxy.core.jwk import SigningKey
from signing_proxy.verify import RequestVerifier, VerifierPolicy, refusal, verify_aiohttp_request
from signing_proxy.verify.directory import DirectoryError, DirectoryResolver, FetchResult
from tests.harness import VerifyingOrigin

EXCHANGE_DOMAIN = "exchange.example"
RESALE_DOMAIN = "resale.example"
EDGE_BODY = b"<h1>direct crawling is not allowed</h1>"
DISCOVER_PATH = "/v1/svc.v1.ExchangeService/DiscoverResources"
HUGE_BODY_BYTES = 3 * 1024 * 1024
DEFAULT_RULES = "licensing required; see our manifest"  # not a URL: {origin}/.well-known/svc.json
INTERNAL_SECRET = "internal-admin-answer"  # what the internal service answers; must never reach an agent


async def _no_directory(url: str) -> FetchResult:
    raise DirectoryError("directory-fetch-failed", f"{url}: the test exchange only pins keys")


class Publisher:
    """The edge, a separate-origin manifest server, the authorized exchange, and an internal service."""

    def __init__(self, key: SigningKey, *, edge_tls: ssl.SSLContext | None = None) -> None:
        self.key = key
        self.edge = VerifyingOrigin(handler=self._edge, tls=edge_tls)
        self.manifests = VerifyingOrigin(handler=self._manifest)
        self.exchange = VerifyingOrigin(handler=self._exchange)
        self.internal = VerifyingOrigin(handler=self._internal)
        self.discover_calls: list[dict[str, Any]] = []
        self.exchange_refusals: list[str] = []
        self._verifier = RequestVerifier(
            DirectoryResolver(_no_directory), VerifierPolicy(pinned_agent_keys=(key.public,))
        )

    @property
    def servers(self) -> tuple[VerifyingOrigin, ...]:
        return (self.edge, self.manifests, self.exchange, self.internal)

    def __enter__(self) -> Publisher:
        for server in reversed(self.servers):
            server.__enter__()
            server.trust(self.key)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for server in self.servers:
            server.__exit__(kind, exc, tb)

    def clear(self) -> None:
        for server in self.servers:
            server.arrivals.clear()
        self.discover_calls.clear()
        self.exchange_refusals.clear()

    # --- addresses ---
    @property
    def exchange_endpoint(self) -> str:
        return self.exchange.url("/v1")

    def manifest_url(self, name: str, *, remote: bool = False) -> str:
        """The catalogue manifest ``name`` on the edge's own origin, or (``remote``) on another one."""
        return (self.manifests if remote else self.edge).url(f"/m/{name}.json")

    def refused(self, name: str, *, remote: bool = False) -> str:
        """An edge URL refused with X-Content-Rules naming ``manifest_url(name, remote=remote)``."""
        return self.edge.url(f"/refuse{'-remote' if remote else ''}/{name}")

    def naming(self, url: str) -> str:
        """An edge URL refused with X-Content-Rules naming ``url``."""
        return self.edge.url(f"/names?url={quote(url, safe='')}")

    def fetches(self, name: str) -> int:
        """How many times the manifest ``name`` was fetched, from either origin."""
        arrivals = [*self.edge.arrivals, *self.manifests.arrivals]
        return sum(1 for a in arrivals if urlsplit(a.target_uri).path == f"/m/{name}.json")

    # --- documents ---
    def manifest(self, domain: str = "127.0.0.1", **changes: Any) -> dict[str, Any]:
        """A valid publisher manifest (DIRECT test exchange, RESELLER elsewhere); ``None`` drops a member."""
        doc: dict[str, Any] = {
            "ver": "1.0",
            "role": "ROLE_PUBLISHER",
            "domain": domain,
            "contact": "licensing@publisher.example",
            "exchanges": [
                {"domain": EXCHANGE_DOMAIN, "endpoint": self.exchange_endpoint, "relationship": "DIRECT"},
                {
                    "domain": RESALE_DOMAIN,
                    "endpoint": "https://resale.example/v1",
                    "relationship": "RESELLER",
                },
            ],
        }
        for name, value in changes.items():
            if value is None:
                doc.pop(name, None)
            else:
                doc[name] = value
        return doc

    def catalogue(self, name: str) -> tuple[dict[str, Any], str]:
        """The manifest served as ``/m/{name}.json`` and its Cache-Control."""
        reseller = {
            "domain": RESALE_DOMAIN,
            "endpoint": "https://resale.example/v1",
            "relationship": "RESELLER",
        }
        partner = {"domain": EXCHANGE_DOMAIN, "endpoint": self.exchange_endpoint, "relationship": "PARTNER"}

        def direct(endpoint: str) -> list[dict[str, str]]:
            return [{"domain": EXCHANGE_DOMAIN, "endpoint": endpoint, "relationship": "DIRECT"}]

        docs: dict[str, dict[str, Any]] = {
            "v1.0": self.manifest(),
            "v1.7": self.manifest(ver="1.7"),
            "v2.0": self.manifest(ver="2.0"),
            "one": self.manifest(ver="one"),
            "empty": self.manifest(ver=""),
            "missing": self.manifest(ver=None),
            "no-exchanges": self.manifest(exchanges=None),
            "bad-relationship": self.manifest(exchanges=[partner]),
            "other-domain": self.manifest(domain="other.example"),
            "reseller-only": self.manifest(exchanges=[reseller]),
            # a DIRECT exchange that is really an internal service (issue 16 item 5), or answers oddly
            "internal": self.manifest(exchanges=direct(self.internal.url("/admin?x="))),
            "internal-plain": self.manifest(exchanges=direct(self.internal.url("/admin"))),
            "internal-name": self.manifest(exchanges=direct(f"http://localhost:{self.internal.port}/admin")),
            "internal-https": self.manifest(
                exchanges=direct(f"https://127.0.0.1:{self.internal.port}/admin")
            ),
            "array-answer": self.manifest(exchanges=direct(self.exchange.url("/array"))),
            "text-answer": self.manifest(exchanges=direct(self.exchange.url("/text"))),
            "error-answer": self.manifest(exchanges=direct(self.exchange.url("/error"))),
            "agent": {"ver": "1.0", "role": "ROLE_AGENT", "domain": "127.0.0.1"},
        }
        cache_control = {"cached": "max-age=600", "nostore": "no-store"}.get(name, "max-age=300")
        return docs.get(name, self.manifest()), cache_control

    # --- handlers ---
    async def _edge(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/.well-known/svc.json":
            return web.json_response(self.manifest(), headers={"Cache-Control": "max-age=600"})
        if request.path.startswith("/m/"):  # the catalogue, on the edge's own origin
            return await self._manifest(request)
        if request.path.startswith("/refuse/"):
            rules = self.manifest_url(request.path.removeprefix("/refuse/"))
        elif request.path.startswith("/refuse-remote/"):
            rules = self.manifest_url(request.path.removeprefix("/refuse-remote/"), remote=True)
        elif request.path == "/default":
            rules = DEFAULT_RULES
        elif request.path == "/names":  # X-Content-Rules names whatever the test asks for
            rules = request.query["url"]
        elif request.path == "/forbidden":
            return web.Response(status=403, body=EDGE_BODY, content_type="text/html")
        elif request.path == "/served-with-rules":  # not a refusal: the rules header means nothing
            headers = {"X-Content-Rules": self.manifest_url("v1.0")}
            return web.Response(status=200, body=EDGE_BODY, content_type="text/html", headers=headers)
        elif request.path == "/huge":  # a 403 whose body is larger than the proxy drains
            headers = {"X-Content-Rules": self.manifest_url("huge")}
            return web.Response(status=403, body=b"x" * HUGE_BODY_BYTES, headers=headers)
        else:
            return web.Response(text="hello")
        headers = {"X-Content-Rules": rules, "X-Edge": "kept", "Cache-Control": "max-age=3600"}
        headers |= {"Connection": "X-Edge-Hop", "X-Edge-Hop": "for-the-next-hop-only"}  # RFC 9110 7.6.1
        return web.Response(status=403, body=EDGE_BODY, content_type="text/html", headers=headers)

    async def _manifest(self, request: web.Request) -> web.StreamResponse:
        name = request.path.removeprefix("/m/").removesuffix(".json")
        if name == "redirect":  # to the internal service: a fetch that followed it would reach it
            raise web.HTTPFound(self.internal.url("/admin"))
        doc, cache_control = self.catalogue(name)
        return web.json_response(doc, headers={"Cache-Control": cache_control})

    async def _exchange(self, request: web.Request) -> web.StreamResponse:
        try:
            await verify_aiohttp_request(self._verifier, request)
        except VerificationError as exc:
            self.exchange_refusals.append(exc.reason)
            return refusal(exc)
        odd = request.path.removesuffix("/svc.v1.ExchangeService/DiscoverResources")
        if odd == "/array":
            return web.json_response([{"admin": INTERNAL_SECRET}])
        if odd == "/text":
            return web.Response(text=f"<h1>{INTERNAL_SECRET}</h1>", content_type="text/html")
        if odd == "/error":
            return web.json_response({"admin": INTERNAL_SECRET}, status=500)
        if request.path != DISCOVER_PATH:
            return web.json_response({"error": "unknown method"}, status=404)
        body = json.loads(await request.read())
        self.discover_calls.append(body)
        groups = [
            {"uri": uri, "offers": [{"offer_id": f"offer-{i}", "price_cents": "25"}]}
            for i, uri in enumerate(body.get("uris", []))
        ]
        return web.json_response({"offer_groups": groups})

    async def _internal(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"admin": INTERNAL_SECRET, "path": request.path_qs})
