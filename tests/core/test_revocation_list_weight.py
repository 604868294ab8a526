"""A revocation list's parse stays near what its entries need: one object and one array of thumbprints,
its other members (not shown by the spec) let through, but not 4 MiB of ``[]``/``{}``/``1,`` in them,
which took 0.4 s of the verifier's event loop to parse, for every directory a stranger names."""

from __future__ import annotations

import hashlib
import json

import pytest

from signing_proxy.core.b64 import b64url_encode
from signing_proxy.core.errors import KeyFormatError
from signing_proxy.core.keys import MAX_LIST_CONTAINERS, MAX_LIST_OTHER_VALUES, parse_revocation_list
from signing_proxy.verify.revocation import (
    MAX_REVOCATION_LIST_BYTES,
    MAX_REVOKED_PER_DIRECTORY,
    parse_bounded_list,
)

AS_OF = '"as_of":"2026-11-27T00:00:00Z"'


def thumbprints(count: int) -> list[str]:
    return [b64url_encode(hashlib.sha256(str(i).encode()).digest()) for i in range(count)]


def padded(filler: bytes) -> bytes:
    """A list naming one thumbprint, an unknown member filled with ``filler`` up to about 4 MiB."""
    head = f'{{{AS_OF},"revoked":["{thumbprints(1)[0]}"],"pad":['.encode()
    room = MAX_REVOCATION_LIST_BYTES - len(head) - 2
    body = (filler + b",") * (room // (len(filler) + 1))
    return head + body.rstrip(b",") + b"]}"


@pytest.mark.parametrize("filler", [b"{}", b"[]", b"1", b'"x"', b"null"])
def test_a_list_padded_with_values_is_refused_before_parsing(filler: bytes) -> None:
    body = padded(filler)
    assert len(body) <= MAX_REVOCATION_LIST_BYTES  # inside the size bound: only its weight refuses it
    with pytest.raises(KeyFormatError) as caught:
        parse_bounded_list(body)
    assert caught.value.reason == "revocation-list-too-large"


def test_the_longest_list_with_other_members_still_parses() -> None:
    names = thumbprints(MAX_REVOKED_PER_DIRECTORY)
    others = {f"x{i}": [1, 2] if i % 2 else {"a": i} for i in range(MAX_LIST_CONTAINERS - 2)}
    doc = json.loads(f"{{{AS_OF}}}") | {"revoked": names} | others
    body = json.dumps(doc).encode()
    assert body.count(b"{") + body.count(b"[") == MAX_LIST_CONTAINERS
    assert parse_bounded_list(body).revoked == frozenset(names)


def test_the_bounds_are_what_they_say() -> None:
    names = json.dumps(thumbprints(2))
    values = ",".join(["1"] * MAX_LIST_OTHER_VALUES)
    at_most = f'{{{AS_OF},"revoked":{names},"n":[{values}]}}'.encode()  # commas: 1 + 2 + 255
    with pytest.raises(KeyFormatError, match="other values"):
        parse_revocation_list(at_most, max_entries=1)
    assert parse_revocation_list(at_most, max_entries=2).revoked == frozenset(json.loads(names))
    deep = f'{{{AS_OF},"revoked":[],"n":{"[" * MAX_LIST_CONTAINERS}{"]" * MAX_LIST_CONTAINERS}}}'.encode()
    with pytest.raises(KeyFormatError, match="arrays and objects"):
        parse_revocation_list(deep)
