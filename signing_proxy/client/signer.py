"""One in-process signer for the HTTP library adapters: the proxy's pipeline, without the proxy.

``Signer.sign`` runs ``proxy.pipeline.SigningPipeline``, what the proxy signs every agent request
with, so a request signed here carries the same ``Content-Digest``, ``Authorization``,
``Signature-Agent``, ``Signature-Input`` and ``Signature`` bytes the proxy would have added to it:
the same profile, bearer credentials, Requester injection and key choice. What an adapter gets back
is the set of fields we own (``OWNED``: it removes the request's own lines of those names and adds
ours) and the body to send (changed only by Requester injection). The async adapters sign through
``sign_async``: a key on a PKCS#11 token signs in a worker thread, bounded by
``signing.pkcs11.timeout_s``, never on the event loop.

Keys come from any ``KeyProvider``: a key file (``key_file``), the agent's key store with rotation
(``key_store``; re-read from disk at most every ``refresh_every_s`` through ``refresh``, which the
async adapters run off the event loop), or a source of your own. ``Signer.from_config`` reads the
proxy's YAML (or the same mapping) and picks the key source it names, like ``signing-proxy run``.

A request that cannot be signed raises ``NotSigned`` (a ``ProxyError``: the status and ``reason``
the proxy would answer with) and is never sent: no valid key (503), a body above
``limits.max_body_bytes`` (413), a value the spec cannot sign (400), an ``Authorization`` value
holding a control character (400 ``malformed-request``, as the proxy's parser refuses it), a key's
token that fails or does not sign within ``signing.pkcs11.timeout_s`` (503).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Protocol, cast, runtime_checkable

from ..config import Config, load_config, parse_config
from ..config.profiles import ProfileName
from ..core.errors import FieldError
from ..core.keys import KeyProvider
from ..core.profiles import PROFILES as SIGNING_PROFILES
from ..core.profiles import member_refusal
from ..core.uri import host_authority, parse_absolute_uri
from ..errors import ConfigError, ProxyError
from ..proxy.pipeline import BearerStore, SigningPipeline
from ..proxy.pipeline import Signer as PipelineSigner
from ..proxy.profiles import ProfileSelector
from ..proxy.requester import RequesterInjector, injector_for
from ..service.keys import file_key_provider, key_provider_for
from ..storage.keystore import RELOAD_CHECK_INTERVAL_S, KeyStore, StoreKeyProvider

__all__ = [
    "OWNED",
    "PROFILES",
    "REDACTED",
    "NotSigned",
    "Reloadable",
    "SignedRequest",
    "Signer",
    "key_file",
    "key_store",
    "read_limited",
    "read_limited_async",
    "redacted",
    "too_large",
]

# The fields the signer decides: whatever the request carried under these names is replaced.
OWNED: Final = frozenset(
    {"authorization", "content-digest", "signature-agent", "signature-input", "signature", "signature-key"}
)
# Fields whose value is a credential: never in a repr (``redacted``).
CREDENTIAL_FIELDS: Final = frozenset({"authorization", "proxy-authorization"})
REDACTED: Final = "<redacted>"
# The signing profiles this signer knows (``profile=`` forces one for every host).
PROFILES: Final = tuple(SIGNING_PROFILES)
# RFC 9110 section 5.5: a field value holds no control character but HTAB (no NUL, CR, LF, DEL). The
# proxy's HTTP/1.1 parser refuses such a request, 400 malformed-request, before signing anything.
_CONTROL: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class NotSigned(ProxyError):
    """The request was not sent: it cannot be signed (``status`` and ``reason`` as the proxy answers)."""


@runtime_checkable
class Reloadable(Protocol):
    """A key source that re-reads its keys on demand (the key store); blocking, never on a loop."""

    def reload(self, *, force: bool = False) -> bool: ...


@dataclass(frozen=True, slots=True, repr=False)
class SignedRequest:
    """What to send: ``fields`` (named in ``OWNED``) replace the request's own, ``body`` is its body,
    and ``host``, when set, replaces the caller's ``Host``: its spelling signed (``LocalHost:443``
    goes out ``localhost``), since a verifier rebuilds the target URI from the Host it receives.
    Its ``repr`` shows no credential (``Authorization`` may carry a configured bearer)."""

    fields: tuple[tuple[str, str], ...]
    body: bytes
    keyid: str
    host: str | None = None

    def __repr__(self) -> str:
        return (
            f"SignedRequest(fields={redacted(self.fields)!r}, body=<{len(self.body)} bytes>, "
            f"keyid={self.keyid!r}, host={self.host!r})"
        )


def redacted(fields: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """``fields`` with each credential's value (``Authorization``, ``Proxy-Authorization``) hidden:
    for a ``repr`` or a log line, never for sending."""
    return tuple(
        (name, REDACTED if value and name.lower() in CREDENTIAL_FIELDS else value) for name, value in fields
    )


def key_file(path: str | Path) -> KeyProvider:
    """One key from a PEM or private JWK file (owner-only), always valid: ``signing.key``."""
    return file_key_provider(path)


def key_store(data_dir: str | Path, agent: str = "default") -> StoreKeyProvider:
    """The agent's key store under ``data_dir`` (as ``signing-proxy keys`` manages it), with rotation."""
    return StoreKeyProvider(KeyStore(Path(data_dir).expanduser(), agent))


def too_large(limit: int) -> NotSigned:
    return NotSigned(
        413,
        "body-too-large",
        f"the request body is larger than limits.max_body_bytes ({limit} bytes): it must be read whole "
        "to be digested and signed, so it was not sent",
    )


def read_limited(chunks: Iterable[bytes], limit: int) -> bytes:
    """A streamed body read whole, or ``NotSigned`` 413 as soon as it passes ``limit`` bytes."""
    parts, size = [], 0
    for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        parts.append(bytes(chunk))
    return b"".join(parts)


async def read_limited_async(chunks: AsyncIterable[bytes], limit: int) -> bytes:
    """``read_limited`` for an async stream."""
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        parts.append(bytes(chunk))
    return b"".join(parts)


class Signer:
    """Signs requests in-process exactly as the proxy would, from ``config`` with the keys of ``keys``.

    ``config``: the proxy's configuration (``signing``, ``credentials``, ``requester``, ``hosts``,
    ``limits``, ``profiles``); its key settings are not read here, ``keys`` is the key source.
    ``profile``: one signing profile for every host (``svc``, the spec's, or ``web-bot-auth``); None
    (the default): per host, as the ``profiles`` section says. ``web-bot-auth`` needs
    ``signing.signature_agent`` to be an https origin (or empty), as ``profiles.default`` does:
    ConfigError here otherwise. ``refresh_every_s``: how often a reloadable key source (the key
    store) and the delegation file are looked at again (``refresh_if_due``).
    """

    def __init__(
        self,
        keys: KeyProvider,
        config: Config | None = None,
        *,
        profile: str | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        refresh_every_s: float = RELOAD_CHECK_INTERVAL_S,
        environ: dict[str, str] | None = None,
    ) -> None:
        config = parse_config({}) if config is None else config
        if config.mode != "agent":
            raise ConfigError("mode: the in-process signer signs as an agent (mode: agent)")
        if profile is not None and profile not in PROFILES:
            raise ConfigError(f"profile: {profile!r} is not a known signing profile ({', '.join(PROFILES)})")
        if profile is not None and SIGNING_PROFILES[profile].signature_agent == "dictionary":
            refusal = member_refusal(config.signing.signature_agent)
            if refusal is not None:  # as the configuration refuses it for profiles.default
                raise ConfigError(
                    f"profile: {profile!r} sends signing.signature_agent as a Signature-Agent member "
                    f"on every request, but {refusal}; name the origin serving your key directory, or "
                    "leave profile unset and sign under a profiles rule with signature_agent: string"
                )
        self.config = config
        self.keys = keys
        self.profile = profile
        section = config.profiles
        if profile is not None:  # one profile for every destination, whatever the rules say
            section = replace(section, default=cast("ProfileName", profile), rules=(), learn=False)
        self.max_body_bytes = config.limits.max_body_bytes
        self.refresh_every_s = refresh_every_s
        self._monotonic = monotonic
        self._next_refresh = monotonic() + refresh_every_s
        self._requester: RequesterInjector | None = injector_for(config, keys, clock=clock)
        signer = PipelineSigner(
            keys, label=config.signing.label, validity_s=config.signing.validity_s, clock=clock
        )
        bearers = BearerStore(config.credentials, environ)
        self._pipeline = SigningPipeline(
            config, signer, bearers, self._requester, profiles=ProfileSelector(section)
        )

    @classmethod
    def from_config(
        cls,
        source: str | Path | Mapping[str, Any] | Config,
        *,
        keys: KeyProvider | None = None,
        **options: Any,
    ) -> Signer:
        """From the proxy's YAML file, a mapping shaped like it, or a ``Config``; the keys it names
        (``signing.key``, else the key store of ``signing.agent`` under ``data_dir``) unless ``keys``."""
        if isinstance(source, Config):
            config = source
        elif isinstance(source, Mapping):
            config = parse_config(dict(source))
        else:
            config = load_config(Path(source).expanduser())
        return cls(key_provider_for(config) if keys is None else keys, config, **options)

    # --- keys and the delegation, re-read from disk (blocking) ---
    def refresh_due(self) -> bool:
        """True once every ``refresh_every_s`` (the caller then runs ``refresh``, off any event loop)."""
        now = self._monotonic()
        if now < self._next_refresh:
            return False
        self._next_refresh = now + self.refresh_every_s
        return True

    def refresh(self, *, force: bool = False) -> None:
        """Re-read a reloadable key source (the key store) and the delegation file when they changed."""
        if isinstance(self.keys, Reloadable):
            self.keys.reload(force=force)
        if self._requester is not None:
            self._requester.reload()

    def refresh_if_due(self) -> None:
        if self.refresh_due():
            self.refresh()

    # --- signing ---
    def sign(
        self, method: str, url: str, lines: Sequence[tuple[str, str]], body: bytes
    ) -> SignedRequest | None:
        """Sign ``method url`` with the request's field ``lines`` and whole ``body``; None for a
        ``hosts.unsigned`` host (send it as it is). Raises ``NotSigned`` instead of skipping."""
        # the caller's Authorization is the one value sent as given (the other fields we own are
        # ours, Host is parsed): it is refused as the proxy refuses it, never signed and sent on
        if any(name.lower() == "authorization" and _CONTROL.search(value) for name, value in lines):
            raise NotSigned(
                400,
                "malformed-request",
                "an Authorization value holds a control character (RFC 9110 section 5.5): not sent",
            )
        if len(body) > self.max_body_bytes:
            raise too_large(self.max_body_bytes)
        try:
            sent_to = target = parse_absolute_uri(url)
            hosts = [value for name, value in lines if name.lower() == "host"]
            respelled = None
            if hosts:  # the library sends the caller's Host: the target URI a verifier rebuilds uses it
                authority = host_authority(hosts)
                target = parse_absolute_uri(f"{target.scheme}://{authority}{target.path_query}")
                respelled = target.authority if target.authority != hosts[0] else None
        except FieldError as exc:
            raise NotSigned(400, exc.reason, f"cannot sign a request to this URL: {exc.detail}") from None
        # a bearer or a Requester goes only where the bytes go, as the proxy decides on the URL and
        # never on Host: a Host naming another authority (a caller's, on a request to an address)
        # chooses neither. A redirect to another origin is never signed for the caller's Host: the
        # adapters sign it for its own URL (aiohttp's middleware, httpx's hooks) or not at all
        try:
            signed = self._pipeline.sign_fields(method.upper(), target, lines, body, sent_to=sent_to)
        except ProxyError as exc:
            raise NotSigned(exc.status, exc.reason, exc.detail, exc.headers) from None
        if signed.keyid is None:
            return None
        owned = tuple((name, value) for name, value in signed.fields if name.lower() in OWNED)
        return SignedRequest(owned, signed.body, signed.keyid, respelled)

    async def sign_async(
        self, method: str, url: str, lines: Sequence[tuple[str, str]], body: bytes
    ) -> SignedRequest | None:
        """``sign`` on an event loop. With keys that wait on a device (``keys.blocking``: a PKCS#11
        token) the request is signed in a worker thread, its token call bounded by
        ``signing.pkcs11.timeout_s``: the loop runs meanwhile, and a token that hangs or fails raises
        ``NotSigned`` (503 ``signing-token-unavailable``) after at most that long. Other keys sign
        in-line, as ``sign`` does (no thread hop for a key in memory)."""
        if self.keys.blocking:
            return await asyncio.to_thread(self.sign, method, url, lines, body)
        return self.sign(method, url, lines, body)

    def declared_too_large(self, content_length: str | None) -> None:
        """Refuse (``NotSigned`` 413) a body whose declared length is above the limit, before reading it."""
        declared = (content_length or "").strip()
        if declared.isascii() and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise too_large(self.max_body_bytes)
