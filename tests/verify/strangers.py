"""What a stranger sends a verifier: requests signed (or not) for any ``Signature-Agent``, directory
and revocation documents, and loopback servers that count every request they receive."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.test_utils import TestServer

from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import (
    DIRECTORY_PATH,
    Directory,
    DirectoryKey,
    RevocationList,
    render_directory,
    render_revocation_list,
)
from signing_proxy.core.signatures import Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.verify import EgressPolicy, FetchResult, VerifierPolicy, build_verify_origin
from signing_proxy.verify.build import build_verifier
from signing_proxy.verify.gateway_aiohttp import GATEWAY, gateway_middleware
from signing_proxy.verify.gateway_build import build_gateway_verifier
from signing_proxy.verify.middleware import SIGNATURE, signature_middleware
from tests.harness import WAIT_S

TARGET = "https://exchange.example/svc.v1.ExchangeService/DiscoverResources"
BODY = b'{"ver":"1.0"}'
LOOPBACK = EgressPolicy(allow_private=("127.0.0.1/32",))  # test servers on 127.0.0.1: allow-listed


def signed(
    agent: str,
    key: SigningKey,
    *,
    now: int,
    created: int | None = None,
    expires: int | None = None,
    url: str = TARGET,
    body: bytes = BODY,
    method: str = "POST",
) -> Fields:
    """Fields of a ``method`` (POST) to ``url`` signed by ``key`` with ``Signature-Agent: agent`` (sent
    as given)."""
    created = now if created is None else created
    expires = created + 60 if expires is None else expires
    fields = Fields(
        [("Content-Digest", content_digest(body)), ("Authorization", ""), ("Signature-Agent", agent)]
    )
    message = Message(method, parse_absolute_uri(url), fields)
    attach_signature(fields, sign_message(message, key, created=created, expires=expires))
    return fields


def forged(agent: str, keyid: str, *, now: int, body: bytes = BODY, **params: object) -> Fields:
    """Fields that pass every check needing no key (fresh window, right components and ``alg``, a
    thumbprint ``keyid``) with a signature of random bytes: cheap for an attacker, costly to verify."""
    created = params.get("created", now)
    expires = params.get("expires", now + 60)
    alg = params.get("alg", "ed25519")
    components = '("@method" "@target-uri" "content-digest" "authorization" "signature-agent")'
    signature_input = f'agent={components};keyid="{keyid}";alg="{alg}";created={created};expires={expires}'
    return Fields(
        [
            ("Content-Digest", content_digest(body)),
            ("Authorization", ""),
            ("Signature-Agent", agent),
            ("Signature-Input", signature_input),
            ("Signature", f"agent=:{base64.b64encode(bytes(64)).decode()}:"),
        ]
    )


def directory_doc(*keys: SigningKey, now: int, revocation_url: str | None = None) -> bytes:
    return render_directory(
        Directory(tuple(DirectoryKey(k.public, now - 60, now + 3600) for k in keys), revocation_url)
    )


def revocation_doc(*thumbprints: str, as_of: int) -> bytes:
    return render_revocation_list(RevocationList(as_of, frozenset(thumbprints)))


class CountingFetch:
    """A fake fetcher answering from ``answers`` (url -> FetchResult or exception); counts calls."""

    def __init__(self) -> None:
        self.answers: dict[str, FetchResult | BaseException] = {}
        self.calls: list[str] = []

    async def __call__(self, url: str) -> FetchResult:
        self.calls.append(url)
        await asyncio.sleep(0)  # a real fetch yields: concurrent requests meet the one in flight
        answer = self.answers.get(url, FetchResult(404, b"", None))
        if isinstance(answer, BaseException):
            raise answer
        return answer


@dataclass
class Host:
    """A loopback server: serves ``documents`` by path (404 otherwise) and records every request."""

    documents: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    seen: list[str] = field(default_factory=list)
    base: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(request.raw_path)
        status, body = self.documents.get(request.path, (404, b""))
        return web.Response(status=status, body=body, content_type="application/json")

    def serve(self, path: str, body: bytes, status: int = 200) -> None:
        self.documents[path] = (status, body)

    def directory(self, body: bytes) -> None:
        self.serve(DIRECTORY_PATH, body)


@contextlib.asynccontextmanager
async def host(address: str = "127.0.0.1") -> AsyncIterator[Host]:
    """A counting ``Host`` on ``address``, port 0."""
    found = Host()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", found.handle)
    async with TestServer(app, host=address) as server:
        found.base = f"http://{address}:{server.port}"
        yield found


@contextlib.asynccontextmanager
async def verifying_face(kind: str, policy: VerifierPolicy) -> AsyncIterator[int]:
    """The port of a verifying face on 127.0.0.1 (``signature_middleware``, ``verify-origin`` or
    ``gateway_middleware``) whose handler answers 200 ``{"verified": true}`` for a verified request;
    a refusal is the face's 401 problem+json."""
    if kind == "verify-origin":
        async with TestServer(build_verify_origin(policy, egress=LOOPBACK), host="127.0.0.1") as s:
            assert s.port is not None
            yield s.port
        return
    if kind == "gateway_middleware":
        gateway = build_gateway_verifier(policy, egress=LOOPBACK)
        middleware = gateway_middleware(gateway)
        close = gateway.close

        async def handler(req: web.Request) -> web.Response:
            return web.json_response({"verified": req[GATEWAY] is not None})

    else:
        verifier = build_verifier(policy, egress=LOOPBACK)
        middleware = signature_middleware(verifier)
        close = verifier.close

        async def handler(req: web.Request) -> web.Response:
            return web.json_response({"verified": req[SIGNATURE] is not None})

    app = web.Application(middlewares=[middleware])
    app.router.add_route("*", "/{tail:.*}", handler)
    try:
        async with TestServer(app, host="127.0.0.1") as s:
            assert s.port is not None
            yield s.port
    finally:
        await close()


async def raw_post(
    port: int, lines: list[tuple[str, str]], body: bytes, connection: str = "close"
) -> tuple[int, bytes, dict[str, object]]:
    """A POST of ``body`` with field ``lines`` on a raw socket to 127.0.0.1:``port`` (no client
    library adds or merges a line); the status, the response head and its JSON body."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
    try:
        head = (
            f"POST /x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: {connection}\r\n"
            f"Content-Length: {len(body)}\r\n" + "".join(f"{n}: {v}\r\n" for n, v in lines) + "\r\n"
        )
        writer.write(head.encode("latin-1") + body)
        data = await asyncio.wait_for(reader.read(), WAIT_S)
    finally:
        writer.close()
    status_head, _, answer = data.partition(b"\r\n\r\n")
    doc: dict[str, object] = json.loads(answer)
    return int(status_head.split(b" ", 2)[1]), status_head, doc
