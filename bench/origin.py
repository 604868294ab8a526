"""A fast loopback origin for the benchmark: a fixed 200 answer, and a sample of requests verified.

Every ``--verify-every``-th request is checked with the core verifier (key pinned by thumbprint);
``GET /stats`` returns the counts, ``GET /stream?mib=N`` streams N MiB, and the key directory
(``/.well-known/http-message-signatures-directory``) holds the ``--public-key-pem`` key. Plain
asyncio protocol with llhttp so the origin costs far less CPU than the proxy in front of it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time

import httptools

from signing_proxy.core.errors import VerificationError
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import PublicKey
from signing_proxy.core.keys import DIRECTORY_PATH, Directory, DirectoryKey, render_directory
from signing_proxy.core.signatures import Message, VerificationKey, verify_stack
from signing_proxy.core.uri import parse_absolute_uri

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


class Stats:
    requests = 0
    verified = 0
    failed = 0
    unsigned = 0
    reasons: dict[str, int] = {}  # noqa: RUF012 - process-wide counters


def directory_for(key: PublicKey) -> bytes:
    """A key directory holding ``key``, valid from a minute ago for a day (no revocation list)."""
    now = int(time.time())
    return render_directory(Directory((DirectoryKey(key, now - 60, now + 86_400),), None))


class Origin(asyncio.Protocol):
    def __init__(self, key: PublicKey | None, every: int, scheme: str) -> None:
        self.key = key
        self.every = every
        self.scheme = scheme
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: list[tuple[str, str]] = []
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url, self.headers, self.body = b"", [], []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        Stats.requests += 1
        path = self.url.decode()
        if path.startswith("/stats"):
            doc = {k: getattr(Stats, k) for k in ("requests", "verified", "failed", "unsigned", "reasons")}
            body = json.dumps(doc).encode()
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
            return
        if path == DIRECTORY_PATH and self.key is not None:  # the key, for a gateway that fetches it
            body = directory_for(self.key)
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nCache-Control: max-age=3600\r\n"
                b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
            )
            return
        if path.startswith("/stream"):
            mib = int(path.split("mib=", 1)[1]) if "mib=" in path else 100
            asyncio.get_running_loop().create_task(self._stream(mib))
            return
        if self.key is not None and Stats.requests % self.every == 0:
            self._verify(path)
        self.transport.write(RESPONSE)

    async def _stream(self, mib: int) -> None:
        assert self.transport is not None
        chunk = b"x" * (1024 * 1024)
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (mib * len(chunk)))
        for _ in range(mib):
            self.transport.write(chunk)
            while self.transport.get_write_buffer_size() > 4 * len(chunk):  # noqa: ASYNC110 - bench pacing
                await asyncio.sleep(0.001)

    def _verify(self, path: str) -> None:
        fields = Fields(self.headers)
        if fields.combined("signature") is None:
            Stats.unsigned += 1
            return
        host = fields.combined("host") or ""
        message = Message(self._method(), parse_absolute_uri(f"{self.scheme}://{host}{path}"), fields)
        key = self.key
        assert key is not None
        try:
            verify_stack(
                message,
                b"".join(self.body),
                lambda e, _i: VerificationKey(key) if e.keyid == key.thumbprint else None,
                now=time.time(),
            )
            Stats.verified += 1
        except VerificationError as exc:
            Stats.failed += 1
            Stats.reasons[exc.reason] = Stats.reasons.get(exc.reason, 0) + 1

    def _method(self) -> str:
        return self.parser.get_method().decode()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--public-key-pem", help="verify a sample of requests against this key")
    parser.add_argument("--verify-every", type=int, default=50)
    parser.add_argument("--tls-ca-out", help="serve HTTPS with a fresh test CA, written to this file")
    args = parser.parse_args()
    key = None
    if args.public_key_pem:
        with open(args.public_key_pem, "rb") as fh:  # noqa: ASYNC230 - read once at start
            key = PublicKey.from_pem(fh.read())
    loop = asyncio.get_running_loop()
    tls = None
    if args.tls_ca_out:
        from signing_proxy.net.leaves import LeafContextCache
        from signing_proxy.storage.ca import CertificateAuthority

        ca = CertificateAuthority.generate()
        with open(args.tls_ca_out, "wb") as fh:  # noqa: ASYNC230 - once, before serving
            fh.write(ca.cert_pem())
        tls = LeafContextCache(ca, 4).get("127.0.0.1")
    scheme = "https" if tls else "http"
    server = await loop.create_server(
        lambda: Origin(key, args.verify_every, scheme), "127.0.0.1", args.port, backlog=4096, ssl=tls
    )
    print(f"origin listening on {server.sockets[0].getsockname()[1]}", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
