"""What a SIGHUP reload applies, and to what: access rules reach connections already open, and a
change of which key signs is reported as needing a restart (it was reported applied, and ignored)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from signing_proxy.config import Config, parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import StaticKeyProvider
from signing_proxy.service.app import ProxyApp
from signing_proxy.service.keys import key_provider_for
from tests.harness import WAIT_S


def config(tmp: Path, **sections: object) -> Config:
    base: dict[str, object] = {
        "data_dir": str(tmp),
        "listen": "127.0.0.1:0",
        "intercept": {"enabled": False},
        "log": {"access_log": False},
    }
    return parse_config({**base, **sections})


async def status_of(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    await asyncio.wait_for(reader.readexactly(length), WAIT_S)
    return head.split(b"\r\n")[0].decode()


async def test_narrowed_access_reaches_a_connection_opened_before_the_reload(tmp_path: Path) -> None:
    app = ProxyApp(config(tmp_path), StaticKeyProvider(SigningKey.generate()))
    [(host, port)] = await app.start()
    try:
        reader, writer = await asyncio.open_connection(host, port)
        assert await status_of(reader, writer) == "HTTP/1.1 200 OK"
        assert app.reload(config(tmp_path, access={"allow_clients": ["10.0.0.0/8"]})) == []
        assert await status_of(reader, writer) == "HTTP/1.1 403 Forbidden"  # the same connection
        writer.close()
    finally:
        await app.stop(drain_s=0)


def key_file(tmp: Path, name: str) -> tuple[SigningKey, str]:
    key, path = SigningKey.generate(), tmp / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, key.to_pem())
    os.close(fd)
    return key, str(path)


async def test_a_new_signing_key_is_reported_as_needing_a_restart_and_the_label_applies(
    tmp_path: Path,
) -> None:
    old, old_path = key_file(tmp_path, "old.pem")
    new, new_path = key_file(tmp_path, "new.pem")
    first = config(tmp_path, signing={"key": old_path})
    app = ProxyApp(first, key_provider_for(first))
    try:
        pending = app.reload(config(tmp_path, signing={"key": new_path, "label": "agent2"}))
        assert pending == ["signing.key"]  # it was []: "configuration reloaded", the old key signing on
        assert app.config.signing.key == old_path  # what signs, and what the configuration says
        assert app.signer.label == "agent2"  # live
        current = app.signer.keys.current(0)
        assert current is not None
        assert current.thumbprint == old.thumbprint != new.thumbprint
    finally:
        await app.stop(drain_s=0)
