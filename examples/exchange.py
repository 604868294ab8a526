"""A ten-line exchange: every request's signature stack is verified before the handler runs.

python3 examples/exchange.py 9100 [CIDR ...]   (CIDRs: private addresses whose directories may be fetched)
"""

import sys

from aiohttp import web

from signing_proxy.verify import SIGNATURE, EgressPolicy, build_verifier, signature_middleware


async def discover(request: web.Request) -> web.Response:
    stack = request[SIGNATURE]  # the verified result: trust only this
    return web.json_response({"requester_key": stack.agent.keyid, "directory": stack.directory})


async def app() -> web.Application:
    # directories and revocation lists through the package's one HTTP client, public https only
    # unless allow-listed; revocation lists polled every 300 s +/-10 %, failing closed until fetched
    verifier = build_verifier(egress=EgressPolicy(allow_private=tuple(sys.argv[2:])))
    # served on loopback; behind a public name: signature_middleware(verifier, hosts=("exchange.example",))
    exchange = web.Application(middlewares=[signature_middleware(verifier)])
    exchange.router.add_post("/svc.v1.ExchangeService/DiscoverResources", discover)
    exchange.on_cleanup.append(lambda _app: verifier.close())
    return exchange


if __name__ == "__main__":
    web.run_app(app(), host="127.0.0.1", port=int(sys.argv[1]) if len(sys.argv) > 1 else 9100)
