"""``net.framing.regenerated`` restates the Host and Content-Length lines ``serialize_head`` writes (a
relay signs over the first, the wire carries the second): the two must never drift apart."""

from __future__ import annotations

import pytest

from signing_proxy.core.uri import Target, parse_absolute_uri, spelled
from signing_proxy.net.framing import regenerated, serialize_head

TARGETS = {
    "canonical": parse_absolute_uri("https://shop.example/cart?x=1"),
    "port": parse_absolute_uri("http://shop.example:8080/"),
    "ipv6": parse_absolute_uri("https://[::1]:8443/p"),
    "as-received": spelled(parse_absolute_uri("https://Shop.Example:443/cart"), "/cart"),
}


@pytest.mark.parametrize("target", TARGETS.values(), ids=TARGETS.keys())
@pytest.mark.parametrize(
    ("method", "body_len", "framed"),
    [("GET", 0, False), ("POST", 0, False), ("POST", 7, True), ("GET", 3, False), ("DELETE", 0, True)],
)
@pytest.mark.parametrize("absolute_form", [False, True])
def test_regenerated_lines_are_the_ones_the_head_writes(
    target: Target, method: str, body_len: int, framed: bool, absolute_form: bool
) -> None:
    head = serialize_head(method, target, [("Accept", "*/*")], body_len, framed, absolute_form=absolute_form)
    written = [
        tuple(line.split(": ", 1))
        for line in head.decode("latin-1").split("\r\n")[1:]
        if line.lower().startswith(("host:", "content-length:"))
    ]
    assert written == regenerated(method, target, body_len, framed)
