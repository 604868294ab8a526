"""A delivery endpoint for bound retrieval URLs: only the key the transaction was bound to may fetch.

python3 examples/delivery.py 9200 https://exchange.example [CIDR ...]
  (the exchange's directory base: its key signs our URLs; CIDRs: private addresses it may be at)

Each GET checks the URL's signature against the exchange's key (its directory, cached), the key the
fetcher presents in Signature-Key against the URL's agent_id, and the fetcher's RFC 9421 signature
with that key; the fetcher's own directory is never fetched. A refusal is 401 problem+json.
"""

import sys

from aiohttp import web

from signing_proxy.verify import (
    DeliveryPolicy,
    DeliveryVerifier,
    EgressPolicy,
    VerificationError,
    build_delivery_verifier,
    refusal,
    verify_delivery_request,
)


def delivery_app(verifier: DeliveryVerifier) -> web.Application:
    async def fetch(request: web.Request) -> web.Response:
        try:
            verified = await verify_delivery_request(verifier, request)
        except VerificationError as exc:
            return refusal(exc)
        content = f"object {request.match_info['name']}\n".encode()  # what the transaction bought
        return web.Response(body=content, headers={"X-Bound-Key": verified.agent_id})

    app = web.Application()
    app.router.add_get("/objects/{name}", fetch)
    app.on_cleanup.append(lambda _app: verifier.close())
    return app


async def app() -> web.Application:
    policy = DeliveryPolicy(exchange_directories=(sys.argv[2],))
    return delivery_app(
        build_delivery_verifier(policy, egress=EgressPolicy(allow_private=tuple(sys.argv[3:])))
    )


if __name__ == "__main__":
    web.run_app(app(), host="127.0.0.1", port=int(sys.argv[1]) if len(sys.argv) > 1 else 9200)
