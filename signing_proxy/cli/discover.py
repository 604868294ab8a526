"""``signing-proxy discover URL``: where to obtain what a publisher refuses to serve to a direct crawl.

The command fetches URL through the signing pipeline in-process (no listener; signed exactly as the
running proxy would send it, with the same key, upstream trust and next hop). When the publisher's
edge refuses with 403 and ``X-Content-Rules``, it follows the header to the publisher's manifest
with the proxy's discovery (same site rules, size bound, validation; ``discover_resources`` too
when configured) and prints the manifest and its authorized exchanges as a table, or with ``--json``
the members the proxy would put in its 403 problem body plus ``status``, ``usable`` and ``profile``
(the signing profile the request went out under; the table's last line says it too).

Exit status: 0 a usable exchange was found (a valid publisher manifest listing at least one
authorized exchange); 1 none (URL not refused with ``X-Content-Rules``, URL or manifest unreachable,
manifest refused); 2 bad input (arguments, configuration, signing key).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from ..config import Config, host_matches
from ..core.errors import FieldError
from ..core.keys import KeyProvider
from ..core.uri import authority_end, parse_absolute_uri
from ..errors import CliError, ProxyError
from ..proxy.discovery import Discovery, Finding
from ..service.app import ProxyApp
from ..service.keys import key_provider_for
from .common import add_config_flag, config_from, error_line

__all__ = ["EXIT_NONE", "EXIT_USABLE", "add_parsers", "cmd_discover", "without_userinfo"]

EXIT_USABLE = 0  # a usable exchange was found
EXIT_NONE = 1  # none was found (the reason is printed)
PAGE_MAX_BYTES = 1024 * 1024  # our choice: only the head of URL's answer matters; the body is cut here


def add_parsers(sub: Any) -> None:
    """Add ``discover`` to the ``signing-proxy`` sub-commands."""
    discover = sub.add_parser(
        "discover",
        help="follow a publisher's 403 + X-Content-Rules to its manifest and authorized exchanges",
        description="Fetch URL signed (in-process, as the proxy would send it). When the publisher "
        "refuses it with 403 and X-Content-Rules, fetch and validate the manifest it names and print "
        "the authorized exchanges. Exit status: 0 a usable exchange was found, 1 none, 2 bad input.",
    )
    discover.add_argument("url", metavar="URL", help="an absolute http(s) URL of the publisher")
    add_config_flag(discover)
    discover.add_argument("--json", action="store_true", help="machine-readable output")
    discover.set_defaults(func=cmd_discover)


def cmd_discover(args: argparse.Namespace) -> int:
    try:
        parse_absolute_uri(args.url)
    except FieldError as exc:
        raise CliError(f"URL: {exc.detail or exc.reason}") from None
    config = config_from(args)
    if config.mode != "agent":
        raise CliError("discover signs as the agent: use a configuration with mode: agent")
    # no CONNECT is served here: do not load (or create) the interception CA
    config = config.with_overrides(**{"intercept.enabled": False})
    keys = key_provider_for(config)
    return asyncio.run(_discover(config, keys, without_userinfo(args.url), as_json=args.json))


def without_userinfo(url: str) -> str:
    """``url`` without ``user:password@``: it is never sent (``parse_authority`` drops it), and every
    line and ``--json`` document naming the URL showed the password. The authority ends where the
    parser ends it (the first ``/``, ``?`` or ``#``), its userinfo at its last ``@``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    cut = authority_end(rest)
    return f"{scheme}{sep}{rest[:cut].rpartition('@')[2]}{rest[cut:]}"


async def _discover(config: Config, keys: KeyProvider, url: str, *, as_json: bool) -> int:
    try:
        app = ProxyApp(config, keys)
    except ProxyError as exc:
        raise CliError(error_line(exc)) from None
    profile = _profile(config, app, url)
    try:
        try:
            answer = await app.signed_fetch("GET", url, max_bytes=PAGE_MAX_BYTES, truncate=True)
        except ProxyError as exc:
            if exc.status in {400, 503}:  # the request itself (or our key) is unusable
                raise CliError(f"{url}: {exc.reason}: {exc.detail}") from None
            error = {"reason": exc.reason, "detail": exc.detail}
            _emit(as_json, {"uri": url, "usable": False, "error": error, "profile": profile})
            if not as_json:
                print(f"{url}: {exc.reason}: {exc.detail}", file=sys.stderr)
            return EXIT_NONE
        rules = answer.header("x-content-rules")
        if answer.status != 403 or rules is None:
            detail = f"answered {answer.status} without X-Content-Rules: nothing to discover"
            if answer.status == 403:
                detail = "answered 403 without X-Content-Rules: no manifest is named"
            doc = {"uri": url, "status": answer.status, "usable": False, "detail": detail, "profile": profile}
            _emit(as_json, doc)
            if not as_json:
                print(f"{_safe(url)} {detail}")
                print(f"signed as: {profile}")
            return EXIT_NONE
        discovery = Discovery(lambda: config.discovery, app.signed_fetch, requester=lambda: app.requester)
        finding = await discovery.find(rules, parse_absolute_uri(url))
    finally:
        await app.stop(drain_s=0)
    if as_json:
        _emit(True, {"status": answer.status, "usable": finding.usable, **finding.doc, "profile": profile})
    else:
        print(_table(url, rules, finding))
        print(f"signed as: {profile}")
    return EXIT_USABLE if finding.usable else EXIT_NONE


def _profile(config: Config, app: ProxyApp, url: str) -> str:
    """The signing profile the fetch of ``url`` goes out under (``unsigned`` for ``hosts.unsigned``)."""
    target = parse_absolute_uri(url)
    if any(host_matches(p, target.host) for p in config.hosts.unsigned):
        return "unsigned"
    return app.profiles.select(target.host, target.scheme, target.port).name


def _emit(as_json: bool, doc: dict[str, object]) -> None:
    if as_json:
        print(json.dumps(doc, indent=2))


def _safe(value: object) -> str:
    """Text from the network, with control characters escaped (no terminal escapes get through)."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _table(url: str, rules: str, finding: Finding) -> str:
    doc = finding.doc
    lines = [
        f"refused:   {_safe(url)} (403, X-Content-Rules: {_safe(rules)})",
        f"manifest:  {_safe(doc.get('manifest_url', '-'))}",
    ]
    error = doc.get("manifest_error")
    if isinstance(error, dict):
        lines.append(f"unusable:  {_safe(error['reason'])}: {_safe(error['detail'])}")
        lines.append("no usable exchange")
        return "\n".join(lines)
    manifest = doc.get("manifest")
    assert isinstance(manifest, dict)
    shown = ("ver", "role", "domain", "contact")
    lines.append("           " + "  ".join(f"{k} {_safe(v)}" for k, v in manifest.items() if k in shown))
    exchanges = doc.get("exchanges")
    assert isinstance(exchanges, list)
    rows = [("DOMAIN", "RELATIONSHIP", "ENDPOINT")]
    rows += [(_safe(x["domain"]), x["relationship"], _safe(x["endpoint"])) for x in exchanges]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    lines.append("")
    lines += [f"{d:<{widths[0]}}  {r:<{widths[1]}}  {e}".rstrip() for d, r, e in rows]
    offers = doc.get("discover_resources")
    if isinstance(offers, dict):
        lines.append("")
        where = offers.get("exchange", "-")
        if "error" in offers:
            failure = offers["error"]
            assert isinstance(failure, dict)
            lines.append(f"DiscoverResources at {_safe(where)}: {_safe(failure['reason'])}")
        else:
            lines.append(f"DiscoverResources at {_safe(where)}: {offers.get('status')}")
        if "note" in offers:
            lines.append(f"  ({_safe(offers['note'])})")
        if "response" in offers:
            lines.append(json.dumps(offers["response"], indent=2))  # ASCII only: control characters escaped
    if not exchanges:
        lines.append("no usable exchange")
    return "\n".join(lines)
