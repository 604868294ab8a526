"""A client in a fresh interpreter, configured by nothing but its environment.

``test_connect`` runs ``python -m tests.proxy.https_clients CLIENT OPS`` with the variables that
``signing-proxy env`` printed, as an agent started after ``eval "$(signing-proxy env)"`` would be
(aiohttp, for one, reads ``SSL_CERT_FILE`` when it is imported). ``OPS`` is a JSON list of
``[method, url, body-or-null]``, all sent on one session so keep-alive can reuse one tunnel; the
output is a JSON list of ``[status, body-text]``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

TIMEOUT_S = 15.0


def run_requests(ops: list[list[Any]]) -> list[list[Any]]:
    import requests

    with requests.Session() as session:
        out = []
        for method, url, body in ops:
            r = session.request(method, url, data=body, timeout=TIMEOUT_S)
            out.append([r.status_code, r.text])
        return out


def run_httpx(ops: list[list[Any]]) -> list[list[Any]]:
    import httpx

    with httpx.Client(trust_env=True, timeout=TIMEOUT_S) as client:
        out = []
        for method, url, body in ops:
            r = client.request(method, url, content=body)
            out.append([r.status_code, r.text])
        return out


def run_aiohttp(ops: list[list[Any]]) -> list[list[Any]]:
    import aiohttp

    async def go() -> list[list[Any]]:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        out = []
        async with aiohttp.ClientSession(trust_env=True, timeout=timeout) as session:
            for method, url, body in ops:
                async with session.request(method, url, data=body) as r:
                    out.append([r.status, await r.text()])
        return out

    return asyncio.run(go())


def main() -> None:
    client, ops = sys.argv[1], json.loads(sys.argv[2])
    runner = {"requests": run_requests, "httpx": run_httpx, "aiohttp": run_aiohttp}[client]
    print(json.dumps(runner(ops)))


if __name__ == "__main__":
    main()
