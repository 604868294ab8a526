"""A ten-line exchange: every request's signature stack is verified before the handler runs.

python3 examples/exchange.py 9100
"""

import sys

from aiohttp import web

from signing_proxy.verify import (
    SIGNATURE,
    DirectoryResolver,
    HttpClient,
    RequestVerifier,
    http_fetcher,
    signature_middleware,
)


async def discover(request: web.Request) -> web.Response:
    stack = request[SIGNATURE]  # the verified result: trust only this
    return web.json_response({"requester_key": stack.agent.keyid, "directory": stack.directory})


async def app() -> web.Application:
    client = HttpClient.standalone()  # directories come through the package's one HTTP client
    verifier = RequestVerifier(DirectoryResolver(http_fetcher(client)))
    exchange = web.Application(middlewares=[signature_middleware(verifier)])
    exchange.router.add_post("/svc.v1.ExchangeService/DiscoverResources", discover)
    exchange.on_cleanup.append(lambda _app: client.close())
    return exchange


if __name__ == "__main__":
    web.run_app(app(), host="127.0.0.1", port=int(sys.argv[1]) if len(sys.argv) > 1 else 9100)
