"""One way to send a request through each in-process adapter: httpx (sync and async), requests, aiohttp.

Every driver sends ``method url`` with one of: no body, a JSON document, or a streamed body (chunks
given as a list, sent as each library streams: a generator, an async generator), with
``trust_env`` off so no proxy from the environment gets in the way. A driver keeps its client
session open between calls (``open``/``close``), as an agent does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import httpx
import requests

from signing_proxy.client import HttpxAuth, RequestsAuth, Signer, SigningMiddleware

TIMEOUT_S = 15.0


class Driver:
    name = ""

    def __init__(self, signer: Signer) -> None:
        self.signer = signer

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def send(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        stream: list[bytes] | None = None,
        headers: dict[str, str] | None = None,
    ) -> int:
        raise NotImplementedError


def _chunks(stream: list[bytes]) -> Iterator[bytes]:
    yield from stream


async def _achunks(stream: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in stream:
        yield chunk


class HttpxSync(Driver):
    name = "httpx"

    async def open(self) -> None:
        self.client = httpx.Client(auth=HttpxAuth(self.signer), trust_env=False, timeout=TIMEOUT_S)

    async def close(self) -> None:
        self.client.close()

    async def send(
        self, method: str, url: str, *, json: Any = None, stream: Any = None, headers: Any = None
    ) -> int:
        content = None if stream is None else _chunks(stream)
        return self.client.request(method, url, json=json, content=content, headers=headers).status_code


class HttpxAsync(Driver):
    name = "httpx-async"

    async def open(self) -> None:
        self.client = httpx.AsyncClient(auth=HttpxAuth(self.signer), trust_env=False, timeout=TIMEOUT_S)

    async def close(self) -> None:
        await self.client.aclose()

    async def send(
        self, method: str, url: str, *, json: Any = None, stream: Any = None, headers: Any = None
    ) -> int:
        content = None if stream is None else _achunks(stream)
        response = await self.client.request(method, url, json=json, content=content, headers=headers)
        return response.status_code


class Requests(Driver):
    name = "requests"

    async def open(self) -> None:
        self.session = requests.Session()
        self.session.trust_env = False
        self.session.auth = RequestsAuth(self.signer)

    async def close(self) -> None:
        self.session.close()

    async def send(
        self, method: str, url: str, *, json: Any = None, stream: Any = None, headers: Any = None
    ) -> int:
        data = None if stream is None else _chunks(stream)
        response = self.session.request(method, url, json=json, data=data, headers=headers, timeout=TIMEOUT_S)
        return response.status_code


class Aiohttp(Driver):
    name = "aiohttp"

    async def open(self) -> None:
        self.session = aiohttp.ClientSession(
            middlewares=(SigningMiddleware(self.signer),),
            trust_env=False,
            timeout=aiohttp.ClientTimeout(total=TIMEOUT_S),
        )

    async def close(self) -> None:
        await self.session.close()

    async def send(
        self, method: str, url: str, *, json: Any = None, stream: Any = None, headers: Any = None
    ) -> int:
        data = None if stream is None else _achunks(stream)
        async with self.session.request(method, url, json=json, data=data, headers=headers) as response:
            await response.read()
            return response.status


DRIVERS: list[type[Driver]] = [HttpxSync, HttpxAsync, Requests, Aiohttp]
