"""Bearer credentials the proxy adds for configured hosts (``credentials``), read once, never logged."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from ..config import CredentialRule, host_matches
from ..core.uri import Target
from ..errors import ConfigError
from ..storage.files import PrivateFileError, read_private

__all__ = ["MAX_BEARER_FILE_BYTES", "BearerStore", "read_secret_text"]

log = logging.getLogger("signing_proxy.proxy.pipeline")  # the logger its lines always had


class BearerStore:
    """Bearer credentials per host pattern, read once from files or the environment (never logged).

    A rule's token goes only where the rule allows (``https`` unless ``allow_plaintext``, its
    ``ports``); the first rule allowing the target wins. A rule that names the host but not the
    scheme or port sends nothing, logged once per rule and origin.
    """

    def __init__(self, rules: Sequence[CredentialRule], environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if environ is None else environ
        self._rules: list[tuple[CredentialRule, str]] = []
        self._told: set[tuple[int, str]] = set()  # (rule index, origin) already logged as withheld
        for i, rule in enumerate(rules):
            if rule.bearer_file is not None:
                token = _read_bearer_file(
                    Path(rule.bearer_file).expanduser(), f"credentials[{i}].bearer_file"
                )
            else:
                token = env.get(rule.bearer_env or "", "").strip()
                if not token:
                    detail = f"credentials[{i}].bearer_env: {rule.bearer_env} is not set"
                    raise ConfigError(detail, reason="credential-missing")
            if not token:  # "Authorization: Bearer " went out
                detail = f"credentials[{i}].bearer_file: {rule.bearer_file} is empty"
                raise ConfigError(detail, reason="credential-missing")
            if not _TOKEN_CHARS.issuperset(token):  # the value is never shown, only what is wrong
                detail = (
                    f"credentials[{i}]: a bearer token is one word of visible ASCII, "
                    "without spaces or control characters"
                )
                raise ConfigError(detail, reason="credential-malformed")
            self._rules.append((rule, token))

    def for_target(self, target: Target) -> tuple[CredentialRule, str] | None:
        """The first rule whose hosts, scheme and ports all admit ``target``, with its token."""
        withheld: list[tuple[int, str]] = []
        for i, (rule, token) in enumerate(self._rules):
            if not any(host_matches(p, target.host) for p in rule.hosts):
                continue
            why = rule.refusal(target.scheme, target.port)
            if why is None:
                return rule, token
            withheld.append((i, why))
        for i, why in withheld:  # nothing is sent: say why each rule naming the host stayed silent
            self._withheld(i, target, why)
        return None

    def _withheld(self, index: int, target: Target, why: str) -> None:
        origin = f"{target.scheme}://{target.host}:{target.port}"
        if (index, origin) in self._told:
            return
        if len(self._told) >= _TOLD_MAX:
            self._told.clear()  # bounded: an agent choosing many origins cannot grow it without end
        self._told.add((index, origin))
        log.warning("credentials[%d] not sent to %s: %s", index, origin, why)


_TOKEN_CHARS = frozenset(map(chr, range(0x21, 0x7F)))  # visible ASCII: what one header word may be
_TOLD_MAX = 4096  # our choice: distinct (rule, origin) pairs remembered as already logged
MAX_BEARER_FILE_BYTES = 16 * 1024  # our choice: far above any real token, far below a header limit


def _read_bearer_file(path: Path, where: str) -> str:
    """One owner-only file's token, stripped; ConfigError naming ``where`` with a stable reason."""
    return read_secret_text(path, where, max_bytes=MAX_BEARER_FILE_BYTES, reasons="credential").strip()


def read_secret_text(path: Path, where: str, *, max_bytes: int, reasons: str) -> str:
    """The UTF-8 text of a file of secrets (tokens, passwords), which must be its owner's only; else
    ConfigError naming ``where``, its reason ``<reasons>-permissions``, ``-unreadable`` or
    ``-malformed`` (larger than ``max_bytes``, or not text)."""
    try:
        data = read_private(path, max_bytes=max_bytes)
    except PrivateFileError as exc:
        if exc.reason == "too-open":
            raise ConfigError(
                f"{where}: {path} mode is {exc.mode:04o}; it must be readable by its owner only "
                f"(run: chmod 600 {path})",
                reason=f"{reasons}-permissions",
            ) from None
        raise ConfigError(f"{where}: {path} {exc.detail}", reason=f"{reasons}-unreadable") from None
    if len(data) > max_bytes:
        raise ConfigError(f"{where}: {path} is larger than {max_bytes} bytes", reason=f"{reasons}-malformed")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: {path} is not text", reason=f"{reasons}-malformed") from None
