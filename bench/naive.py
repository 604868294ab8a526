"""In-run references for bench/run.py: the forward proxy a user would write in an afternoon.

    python bench/naive.py [--port P] --mode pass|sign|relay [--key PEM] [--agent-public-pem PEM]

An aiohttp server on uvloop that forwards absolute-form requests with one aiohttp ClientSession:
``pass`` forwards as is; ``sign`` adds ``Content-Digest`` and signs the spec's five components with
a signature base built by hand and ``cryptography``'s Ed25519 (the issue's "about 60 lines"); ``relay``
verifies the ``agent`` label with pyauth's ``HTTPMessageVerifier`` (the agent's key pinned), then
adds its own ``broker`` label covering the five components and ``"signature";key="agent"``.
Deliberately plain: no limits, no pool tuning, no access log.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import hashlib
import time
import warnings
from typing import Any

import aiohttp
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from http_message_signatures import HTTPMessageSigner, HTTPMessageVerifier, MappingKeyResolver, algorithms
from multidict import CIMultiDict

FIVE = ("@method", "@target-uri", "content-digest", "authorization", "signature-agent")
HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "host"}


def thumbprint(public: Ed25519PublicKey) -> str:
    """RFC 7638: the agent's keyid."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    canonical = '{"crv":"Ed25519","kty":"OKP","x":"' + x + '"}'
    return base64.urlsafe_b64encode(hashlib.sha256(canonical.encode()).digest()).rstrip(b"=").decode()


class Message:
    """What pyauth reads and writes: method, url, and a case-insensitive header mapping."""

    def __init__(self, method: str, url: str, headers: Any) -> None:
        self.method, self.url, self.headers = method, url, headers


def main() -> None:
    warnings.simplefilter("ignore")  # pyauth warns about label-only selection on every request
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="default 0: any free port, printed")
    parser.add_argument("--mode", choices=["pass", "sign", "relay"], required=True)
    parser.add_argument("--key", help="private key PEM (sign, relay)")
    parser.add_argument("--agent-public-pem", help="the agent's public key PEM (relay)")
    args = parser.parse_args()
    private = Ed25519PrivateKey.generate()
    if args.key:
        loaded = serialization.load_pem_private_key(open(args.key, "rb").read(), None)  # noqa: SIM115
        assert isinstance(loaded, Ed25519PrivateKey)
        private = loaded
    keyid = thumbprint(private.public_key())
    signer = HTTPMessageSigner(
        signature_algorithm=algorithms.ED25519,
        key_resolver=MappingKeyResolver(public_keys={}, private_keys={keyid: private}),
    )
    verifier = None
    if args.agent_public_pem:
        public = serialization.load_pem_public_key(open(args.agent_public_pem, "rb").read())  # noqa: SIM115
        assert isinstance(public, Ed25519PublicKey)
        verifier = HTTPMessageVerifier(
            signature_algorithm=algorithms.ED25519,
            key_resolver=MappingKeyResolver(public_keys={thumbprint(public): public}, private_keys={}),
        )
        verifier.allow_label_only_selection = True

    def sign_by_hand(method: str, url: str, headers: CIMultiDict[str], body: bytes) -> None:
        digest = base64.b64encode(hashlib.sha256(body).digest()).decode()
        headers["Content-Digest"] = f"sha-256=:{digest}:"
        headers.setdefault("Authorization", "")
        headers.setdefault("Signature-Agent", '"https://agent.example"')
        now = int(time.time())
        params = (
            '("@method" "@target-uri" "content-digest" "authorization" "signature-agent")'
            f';keyid="{keyid}";alg="ed25519";created={now};expires={now + 300}'
        )
        base = (
            f'"@method": {method}\n"@target-uri": {url}\n'
            f'"content-digest": {headers["Content-Digest"]}\n"authorization": {headers["Authorization"]}\n'
            f'"signature-agent": {headers["Signature-Agent"]}\n"@signature-params": {params}'
        )
        signature = base64.b64encode(private.sign(base.encode())).decode()
        headers["Signature-Input"] = f"agent={params}"
        headers["Signature"] = f"agent=:{signature}:"

    def relay(method: str, url: str, headers: CIMultiDict[str], body: bytes) -> None:
        assert verifier is not None
        message = Message(method, url, headers)
        verifier.verify(message, expect_label="agent", body=body, require_components=FIVE)
        now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        signer.sign(
            message,
            key_id=keyid,
            covered_component_ids=(*FIVE, '"signature";key="agent"'),
            created=now,
            expires=now + datetime.timedelta(seconds=300),
            label="broker",
            append_if_signature_exists=True,
            body=body,
            use_existing_digest=True,  # the agent's, checked by pyauth and kept
        )

    async def forward(request: web.Request) -> web.StreamResponse:
        session: aiohttp.ClientSession = request.app["session"]
        body = await request.read()
        url = str(request.url)
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in HOP)
        if args.mode == "sign":
            sign_by_hand(request.method, url, headers, body)
        elif args.mode == "relay":
            relay(request.method, url, headers, body)
        async with session.request(request.method, url, headers=headers, data=body) as up:
            answer = await up.read()
            return web.Response(status=up.status, body=answer, content_type="text/plain")

    async def start(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession(auto_decompress=False)

    async def stop(app: web.Application) -> None:
        await app["session"].close()

    app = web.Application(client_max_size=16 << 20)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_route("*", "/{tail:.*}", forward)

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", args.port).start()
        print(f"listening on http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
        try:
            await asyncio.Event().wait()  # until the process is stopped
        finally:
            await runner.cleanup()

    try:
        import uvloop
    except ImportError:
        asyncio.run(serve())
    else:
        uvloop.run(serve())


if __name__ == "__main__":
    main()
