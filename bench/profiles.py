"""Per-request cost of the agent pipeline by signing profile (micro-figures, no network).

    .venv/bin/python bench/profiles.py [--n 5000]

``SigningPipeline.prepare`` for a GET: the spec's ``svc`` without a profile selector (before profiles
existed), with the default selector (no rules), with rules that do not name the host, and a
``web-bot-auth`` destination. Prints microseconds per request (best of five runs).
"""

from __future__ import annotations

import argparse
import timeit

from signing_proxy.config import parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.proxy.pipeline import BearerStore, Signer, SigningPipeline
from signing_proxy.proxy.profiles import ProfileSelector

LINES = [("Accept", "*/*"), ("User-Agent", "bench")]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=5000, help="requests per run (default 5000)")
    n = parser.parse_args().n
    rules = {"rules": [{"hosts": ["*.shop.example", "news.example"], "profile": "web-bot-auth"}]}
    config = parse_config({"signing": {"signature_agent": "https://agent.example"}, "profiles": rules})
    signer = Signer(StaticKeyProvider(SigningKey.generate()), label="agent", validity_s=300)
    bearers = BearerStore(())
    svc_target = parse_absolute_uri("https://exchange.example/items?q=1")
    web_target = parse_absolute_uri("https://www.shop.example/items?q=1")
    cases = {
        "svc, no selector": (svc_target, None),
        "svc, default selector": (svc_target, ProfileSelector(parse_config({}).profiles)),
        "svc, rules not naming the host": (svc_target, ProfileSelector(config.profiles)),
        "web-bot-auth destination": (web_target, ProfileSelector(config.profiles)),
    }
    for name, (target, selector) in cases.items():
        pipeline = SigningPipeline(config, signer, bearers, profiles=selector)

        def once(target: object = target, pipeline: SigningPipeline = pipeline) -> None:
            pipeline.prepare("GET", target, LINES, b"", framed=False)  # type: ignore[arg-type]

        per = min(timeit.repeat(once, number=n, repeat=5)) / n * 1e6
        print(f"{name:<34} {per:8.1f} us/request")


if __name__ == "__main__":
    main()
