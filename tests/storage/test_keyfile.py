"""``load_public_key_file``: the one reader of a key file given where a public key is wanted
(``relay.pinned_*_keys``, ``gateway.trusted_issuers``, ``verify-origin --pinned-key``).

The command line took the private key file an agent signs with (its public half), while the
configuration refused the same file (``not a PEM public key``); both now read it alike, and a
private file is held to the owner-only rule of every key file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from signing_proxy.core.jwk import SigningKey
from signing_proxy.errors import KeyFileError
from signing_proxy.storage.keyfile import load_public_key_file

KEY = SigningKey.from_seed(b"\x51" * 32)


def written(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("public.pem", KEY.public.key.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)),
        ("public.jwk", json.dumps(KEY.public.jwk()).encode()),
        ("private.pem", KEY.to_pem()),  # its public half
        ("private.jwk", json.dumps(KEY.to_jwk()).encode()),
    ],
)
def test_every_form_of_the_key_reads_as_its_public_key(tmp_path: Path, name: str, data: bytes) -> None:
    assert load_public_key_file(written(tmp_path / name, data)).thumbprint == KEY.thumbprint


def test_a_private_file_others_can_read_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError) as refused:
        load_public_key_file(written(tmp_path / "private.pem", KEY.to_pem(), 0o644))
    assert refused.value.reason == "key-permissions"


@pytest.mark.parametrize(
    ("data", "reason"),
    [(None, "key-unreadable"), (b"{not json", "malformed-jwk"), (b"-----BEGIN NOTHING-----", None)],
)
def test_an_unusable_file_names_its_path_and_reason(
    tmp_path: Path, data: bytes | None, reason: str | None
) -> None:
    path = tmp_path / "key"
    if data is not None:
        written(path, data, 0o644)  # a public key file may be readable by others
    with pytest.raises(KeyFileError) as refused:
        load_public_key_file(path)
    assert str(path) in str(refused.value)
    if reason is not None:
        assert refused.value.reason == reason
