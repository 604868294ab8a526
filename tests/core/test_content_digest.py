"""Issue 16, item 7 ("Smaller holes"): a ``Content-Digest`` naming one algorithm twice is refused by
core's parser (``duplicate-content-digest``), whatever the form, instead of "last wins"."""

from __future__ import annotations

import base64
import hashlib

import pytest

from signing_proxy.core.digest import content_digest, parse_content_digest, verify_content_digest
from signing_proxy.core.errors import FieldError, VerificationError

BODY = b'{"ver":"1.0"}'
GOOD = content_digest(BODY)
WRONG = "sha-256=:" + "A" * 43 + "=:"


@pytest.mark.parametrize(
    "value",
    [
        f"{GOOD}, {GOOD}",  # the same member twice
        f"{WRONG}, {GOOD}",  # "last wins" would accept this one
        f"{GOOD}, {WRONG}",
        f"{GOOD};a=1, sha-512=:{'A' * 86}==:, {GOOD};b=2",  # parameters and another member between
        f"{GOOD},{GOOD}",  # no space
        "md5=:AAAA:, md5=:AAAA:, " + GOOD,  # any algorithm, even one that is ignored
    ],
)
def test_smaller_holes_duplicate_content_digest_members_are_refused(value: str) -> None:
    with pytest.raises(FieldError) as parsed:
        parse_content_digest(value)
    assert parsed.value.reason == "duplicate-content-digest"
    with pytest.raises(VerificationError) as verified:
        verify_content_digest(value, BODY)
    assert verified.value.reason == "duplicate-content-digest"


def test_smaller_holes_single_members_and_repeated_parameters_still_pass() -> None:
    verify_content_digest(GOOD, BODY)
    sha512 = base64.b64encode(hashlib.sha512(BODY).digest()).decode()
    verify_content_digest(f"{GOOD}, sha-512=:{sha512}:", BODY)  # two algorithms, once each
    assert parse_content_digest(f"{GOOD};a=1;a=2") == parse_content_digest(GOOD)  # a parameter, not a member
