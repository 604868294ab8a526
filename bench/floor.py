"""The floor under any Python forward proxy: the least an HTTP/1.1 keep-alive forwarder on uvloop and
llhttp does per request, with nothing else.

    python bench/floor.py [--port P]

Parses each absolute-form request with httptools (the parser the proxy uses), forwards it in origin
form over one upstream connection per client connection (never pooled across clients, never
reconnected), and streams the upstream's bytes back unchanged, parsing them only to find where the
response ends. No signing, no digest, no header rules, no limits, no timeouts, no log, no metrics:
not a proxy anyone should run, only what the proxy's per-request CPU is compared with (``bench/run.py``
prints it beside the proxy's). The proxy spends this plus its signer and its rules.
"""

from __future__ import annotations

import argparse
import asyncio
from urllib.parse import urlsplit

import httptools
import uvloop


class Upstream(asyncio.Protocol):
    def __init__(self, client: Client) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        assert self.client.transport is not None
        self.client.transport.write(data)  # the answer goes back as it came
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.client.next()


class Client(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.upstream: Upstream | None = None
        self.queue: list[bytes] = []  # requests read ahead of the one in flight
        self.busy = False
        self.url = b""
        self.headers: list[bytes] = []
        self.body: list[bytes] = []
        self.origin: tuple[str, int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append(name + b": " + value + b"\r\n")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        url = urlsplit(self.url.decode("latin-1"))
        self.origin = (url.hostname or "127.0.0.1", url.port or 80)
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        method = self.parser.get_method()
        head = b"%s %s HTTP/1.1\r\n" % (method, path.encode("latin-1"))
        self.queue.append(head + b"".join(self.headers) + b"\r\n" + b"".join(self.body))
        self.url, self.headers, self.body = b"", [], []
        if not self.busy:
            self.next()

    def next(self) -> None:
        self.busy = bool(self.queue)
        if not self.busy:
            return
        request = self.queue.pop(0)
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.write(request)
        else:  # the first request of this client: connect once
            asyncio.get_running_loop().create_task(self.connect(request))

    async def connect(self, request: bytes) -> None:
        assert self.origin is not None
        loop = asyncio.get_running_loop()
        transport, self.upstream = await loop.create_connection(lambda: Upstream(self), *self.origin)
        transport.write(request)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()


async def serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Client, "127.0.0.1", port)
    print(f"listening on http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=0, help="default 0: a free port, printed")
    args = parser.parse_args()
    uvloop.run(serve(args.port))


if __name__ == "__main__":
    main()
