"""``signing-proxy publish --out DIR``: the publication listener's documents as static files.

It writes the bytes the publication listener serves (``service/publish.py``'s ``render_publication``),
each file atomically through a temporary file of a random name that it creates (a link planted in the
document root is never followed), mode 0644: they are public by design.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..core.errors import KeyFormatError
from ..core.keys import format_rfc3339
from ..errors import CliError, KeyStoreError
from ..storage.files import PUBLIC_FILE_MODE, write_atomic
from ..storage.keystore import KeyStore
from .common import add_config_flag, add_data_dir_flag, config_from, config_refused, store_refused

__all__ = ["add_publish_parser", "cmd_publish"]


def _write_public_file(path: Path, data: bytes) -> None:
    """``data`` at ``path``, mode 0644 (served to anyone), atomically: through a temporary file of a
    fresh random name created O_EXCL, so nothing another user planted in the document root (a link
    at a name it could guess) is followed, written or renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data, PUBLIC_FILE_MODE)


def cmd_publish(args: argparse.Namespace) -> int:
    # the publication listener's module (and its aiohttp) only for this command
    from ..service.publish import publications, render_publication  # noqa: PLC0415

    config = config_from(args)
    overrides = {}
    if args.domain:
        overrides["publish.domain"] = args.domain
    if args.public_url:
        overrides["publish.public_url"] = args.public_url
    try:
        config = config.with_overrides(**overrides) if overrides else config
        if config.publish.domain is None:  # refused by publications() too, without saying how to give it
            raise ConfigError(
                "publish.domain is required to publish (the manifest's domain): "
                "pass --domain DOMAIN, or set publish.domain"
            )
        targets = publications(config)
    except ConfigError as exc:
        raise config_refused(exc) from None  # names the variable that sets a key it asks for
    except ValueError as exc:
        raise CliError(f"configuration error: {exc}") from None
    now = time.time()
    files: dict[str, bytes] = {}
    valid_until: list[int] = []
    for publication in targets:
        try:
            state = KeyStore(config.data_path, publication.agent).load(private=False)
            files.update(render_publication(publication, state, now))
        except KeyStoreError as exc:
            raise store_refused(exc) from None
        except KeyFormatError as exc:
            hint = "run `signing-proxy keys rotate`"
            raise CliError(f"agent {publication.agent}: {exc.detail}; {hint}") from None
        valid_until.append(max(r.not_after for r in state.records if r.valid_at(now) and not r.revoked))
    out = Path(args.out).expanduser()
    try:
        for path, body in files.items():
            _write_public_file(out / path.lstrip("/"), body)
            print(out / path.lstrip("/"))
    except OSError as exc:
        raise CliError(f"cannot write to {out}: {exc.strerror or exc}") from None
    print(
        f"serve the directory as application/jwk-set+json; valid until {format_rfc3339(min(valid_until))} "
        "at the latest: re-run after every `keys rotate`, `revoke` or `prune`",
        file=sys.stderr,
    )
    return 0


def add_publish_parser(sub: Any) -> None:
    """Add ``publish`` to the top-level subcommands (``keys.add_parsers`` calls it, after ``keys``)."""
    publish = sub.add_parser(
        "publish",
        help="write the key directory, svc.json and revocation list as static files",
        description="Write .well-known/http-message-signatures-directory, .well-known/svc.json and the "
        "revocation list (and /agents/<name>/... for publish.agents) under DIR, byte-identical to what "
        "publish.listen serves, for any web server or CDN.",
    )
    add_config_flag(publish)
    add_data_dir_flag(publish)
    publish.add_argument("--out", required=True, metavar="DIR", help="document root to write into")
    publish.add_argument("--domain", metavar="DOMAIN", help="the manifest's domain (default publish.domain)")
    publish.add_argument(
        "--public-url", metavar="URL", help="where the files will be served (default https://<domain>)"
    )
    publish.set_defaults(func=cmd_publish)
