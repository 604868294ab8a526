"""``load_public_key_file``: the one reader of a key file given where a public key is wanted
(``relay.pinned_*_keys``, ``gateway.trusted_issuers``, ``verify-origin --pinned-key``).

The command line took the private key file an agent signs with (its public half), while the
configuration refused the same file (``not a PEM public key``); both now read it alike, and a
private file is held to the owner-only rule of every key file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from signing_proxy.core.jwk import SigningKey
from signing_proxy.errors import KeyFileError
from signing_proxy.storage.keyfile import (
    MAX_KEY_FILE_BYTES,
    load_key_file,
    load_public_key_file,
    read_public_file,
)

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


# --- read_public_file: a regular file, bounded -----------------------------------------------------


def test_a_public_file_is_read_up_to_the_bound_and_refused_past_it(tmp_path: Path) -> None:
    path = written(tmp_path / "keys.jwks", b" " * MAX_KEY_FILE_BYTES, 0o644)
    assert len(read_public_file(path)) == MAX_KEY_FILE_BYTES
    path.write_bytes(b" " * (MAX_KEY_FILE_BYTES + 1))
    with pytest.raises(KeyFileError) as refused:
        read_public_file(path, what="JWK Set")
    assert (refused.value.reason, refused.value.path) == ("key-too-large", path)
    assert refused.value.detail == f"larger than {MAX_KEY_FILE_BYTES} bytes; not a JWK Set"
    with pytest.raises(KeyFileError) as refused:
        load_public_key_file(path)
    assert refused.value.reason == "key-too-large"


@pytest.mark.parametrize("special", ["/dev/zero", "folder"])
def test_what_is_not_a_regular_file_is_refused_before_a_read(tmp_path: Path, special: str) -> None:
    """``/dev/zero`` never ends: read whole, it filled the memory (MemoryError)."""
    path = tmp_path if special == "folder" else Path(special)
    with pytest.raises(KeyFileError) as refused:
        load_public_key_file(path)
    assert (refused.value.reason, refused.value.path) == ("key-unreadable", path)
    assert refused.value.detail == "not a regular file; a key file is read from one"


def test_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    """A FIFO with no writer blocked the reader for ever: checked in a child with a deadline."""
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)
    code = (
        "import sys; from pathlib import Path; from signing_proxy.errors import KeyFileError\n"
        "from signing_proxy.storage.keyfile import load_public_key_file\n"
        "try:\n    load_public_key_file(Path(sys.argv[1]))\n"
        "except KeyFileError as exc:\n    print(exc.reason, exc.detail)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=30, check=False
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "key-unreadable not a regular file; a key file is read from one\n"


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        (b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}", "not valid JSON: nested too deep"),
        (b'{"kty":"OKP","crv":"Ed25519","x":"a","x":"b"}', "not valid JSON: member 'x' appears twice"),
    ],
)
def test_a_public_jwk_nested_too_deep_or_given_a_member_twice_is_malformed(
    tmp_path: Path, data: bytes, detail: str
) -> None:
    path = written(tmp_path / "key.jwk", data, 0o644)
    with pytest.raises(KeyFileError) as refused:
        load_public_key_file(path)
    assert (refused.value.reason, refused.value.detail) == ("malformed-jwk", detail)


def test_a_private_key_file_past_the_bound_is_refused_unread(tmp_path: Path) -> None:
    path = written(tmp_path / "agent.pem", KEY.to_pem() + b"\n" * MAX_KEY_FILE_BYTES)
    with pytest.raises(KeyFileError) as refused:
        load_key_file(path)
    assert refused.value.reason == "key-too-large"
