"""Bound retrieval URLs (spec "Bound retrieval URLs"): the exchange's signed URL and its binding (sans-IO).

ExecuteTransaction returns a signed ``retrieval_endpoint``; when binding is on, the URL carries the
query parameter ``agent_id`` (the RFC 7638 thumbprint of the key that signed ExecuteTransaction),
covered by the URL signature and echoed as ``TransactionResponse.agent_identity_hash``. The spec
leaves the URL signature's format open; ours (README, "Where the spec is silent")::

    https://cdn.example/obj/42?agent_id=<jkt>&expires=<unix s>&keyid=<exchange jkt>&sig=<base64url>

``sig`` is the last parameter: the Ed25519 signature of the exchange key ``keyid`` (a key of the
exchange's directory) over ``RETRIEVAL_URL_CONTEXT`` followed by the URL up to ``&sig=``, byte for
byte, in canonical form (lower-case scheme and host, no default port). ``expires`` is exclusive.

``parse_transaction_response`` reads an ExecuteTransaction response, whose shape the spec does not
show beyond ``agent_identity_hash``: every member named ``retrieval_endpoint`` anywhere in it, a
string URL or an object with a ``url`` (or ``uri``) string, with ``expires_at`` (RFC 3339) taken from
that object or from the object holding it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from .b64 import b64url_decode, b64url_encode
from .errors import FieldError, KeyFormatError, ProtocolError, VerificationError
from .jwk import PublicKey, SigningKey
from .keys import is_thumbprint, parse_rfc3339
from .uri import parse_absolute_uri

__all__ = [
    "AGENT_ID",
    "MAX_RETRIEVAL_URL_CHARS",
    "RETRIEVAL_URL_CONTEXT",
    "RetrievalUrl",
    "TransactionBinding",
    "TransactionResult",
    "agent_id_of",
    "parse_retrieval_url",
    "parse_transaction_response",
    "query_param",
    "sign_retrieval_url",
]

AGENT_ID: Final = "agent_id"  # spec: "Bound retrieval URLs" 2
MAX_RETRIEVAL_URL_CHARS: Final = 4096  # our choice: far above a signed URL (~300), bounded memory
RETRIEVAL_URL_CONTEXT: Final = b"svc retrieval url v1\n"  # our choice: this signature is for nothing else
MAX_BINDINGS: Final = 64  # our choice: retrieval URLs read from one ExecuteTransaction response
_MAX_NODES: Final = 100_000  # our choice: JSON values walked in one response (a 1 MiB body has fewer)
_SIGNED_PARAMS: Final = ("agent_id", "expires", "keyid", "sig")


def query_param(path_query: str, name: str) -> str | None:
    """The raw value of query parameter ``name`` (no percent-decoding); None when absent or repeated."""
    _, sep, query = path_query.partition("?")
    if not sep:
        return None
    found = [v for k, _, v in (p.partition("=") for p in query.split("&")) if k == name]
    return found[0] if len(found) == 1 else None


def agent_id_of(path_query: str) -> str | None:
    """The ``agent_id`` a retrieval URL is bound to: one canonical thumbprint, else None."""
    value = query_param(path_query, AGENT_ID)
    return value if value is not None and is_thumbprint(value) else None


def sign_retrieval_url(url: str, key: SigningKey, *, agent_id: str, expires: int) -> str:
    """The exchange's side: ``url`` (canonicalized) bound to ``agent_id`` until ``expires``, signed."""
    target = parse_absolute_uri(url)
    if not is_thumbprint(agent_id):
        raise KeyFormatError("malformed-thumbprint", "agent_id is an RFC 7638 thumbprint")
    if any(query_param(target.path_query, name) is not None for name in _SIGNED_PARAMS):
        raise FieldError("malformed-retrieval-url", "the URL already carries a binding parameter")
    sep = "&" if "?" in target.path_query else "?"
    signed = f"{target.uri}{sep}{AGENT_ID}={agent_id}&expires={int(expires)}&keyid={key.thumbprint}"
    return f"{signed}&sig={b64url_encode(key.sign(RETRIEVAL_URL_CONTEXT + signed.encode('ascii')))}"


@dataclass(frozen=True, slots=True)
class RetrievalUrl:
    """A parsed bound retrieval URL; ``verify`` checks its signature with the exchange's key."""

    signed: str  # the URL up to ``&sig=``: what the exchange signed
    agent_id: str
    expires: int
    keyid: str  # the exchange key that signed it
    signature: bytes

    def verify(self, exchange_key: PublicKey) -> bool:
        return exchange_key.verify(self.signature, RETRIEVAL_URL_CONTEXT + self.signed.encode("ascii"))


def _malformed(detail: str) -> VerificationError:
    return VerificationError("malformed-retrieval-url", detail)


def parse_retrieval_url(url: str) -> RetrievalUrl:
    """Parse a bound retrieval URL (no key needed); ``VerificationError`` ``malformed-retrieval-url``
    or ``retrieval-url-unbound`` (no ``agent_id``: a bearer URL, not what a binding endpoint takes)."""
    if len(url) > MAX_RETRIEVAL_URL_CHARS or not url.isascii():
        raise _malformed(f"a retrieval URL is at most {MAX_RETRIEVAL_URL_CHARS} ASCII characters")
    signed, sep, sig = url.rpartition("&sig=")
    if not sep or "&" in sig or "#" in sig:
        raise _malformed("sig must be the URL's last query parameter")
    _, qsep, query = signed.partition("?")
    if not qsep:
        raise _malformed("a retrieval URL has a query")
    values: dict[str, list[str]] = {}
    for part in query.split("&"):
        name, _, value = part.partition("=")
        values.setdefault(name, []).append(value)
    if any(len(values.get(name, ())) > 1 for name in _SIGNED_PARAMS):
        raise _malformed("a binding parameter appears more than once")
    if AGENT_ID not in values:
        raise VerificationError("retrieval-url-unbound", "the URL carries no agent_id")
    agent_id, keyid = values[AGENT_ID][0], values.get("keyid", [""])[0]
    expires = values.get("expires", [""])[0]
    if not is_thumbprint(agent_id) or not is_thumbprint(keyid):
        raise _malformed("agent_id and keyid are RFC 7638 thumbprints")
    if _unix_seconds(expires) is None:
        raise _malformed("expires is unix seconds")
    try:
        signature = b64url_decode(sig)
    except ValueError:
        raise _malformed("sig is not canonical base64url") from None
    if len(signature) != 64:
        raise _malformed("sig is an Ed25519 signature (64 bytes)")
    return RetrievalUrl(signed, agent_id, int(expires), keyid, signature)


@dataclass(frozen=True, slots=True)
class TransactionBinding:
    """A retrieval URL (canonical form) bound to ``agent_id``, usable until ``expires_at`` if known."""

    url: str
    agent_id: str
    expires_at: int | None


@dataclass(frozen=True, slots=True)
class TransactionResult:
    """What an ExecuteTransaction response binds: its ``agent_identity_hash`` and bound URLs."""

    agent_identity_hash: str | None
    bindings: tuple[TransactionBinding, ...]


def _expiry(value: object) -> int | None:
    try:
        return parse_rfc3339(value)
    except KeyFormatError:
        return None


def _binding(value: object, holder: dict[str, Any]) -> TransactionBinding | None:
    expires_at = _expiry(holder.get("expires_at"))
    if isinstance(value, dict):
        expires_at = _expiry(value.get("expires_at"))
        value = value.get("url", value.get("uri"))
    if not isinstance(value, str) or len(value) > MAX_RETRIEVAL_URL_CHARS:
        return None
    try:
        target = parse_absolute_uri(value)
    except FieldError:
        return None
    agent_id = agent_id_of(target.path_query)
    if agent_id is None:
        return None  # unbound: a bearer URL, any key may fetch it
    if expires_at is None:
        expires = query_param(target.path_query, "expires")
        expires_at = None if expires is None else _unix_seconds(expires)
    return TransactionBinding(target.uri, agent_id, expires_at)


def parse_transaction_response(body: bytes) -> TransactionResult:
    """The bindings of an ExecuteTransaction response body; ``ProtocolError`` when it is not JSON."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise ProtocolError("malformed-transaction-response", "not a JSON document") from None
    if not isinstance(doc, dict):
        raise ProtocolError("malformed-transaction-response", "not a JSON object")
    echoed = doc.get("agent_identity_hash")
    bindings: list[TransactionBinding] = []
    stack: list[Any] = [doc]
    walked = 0
    while stack and walked < _MAX_NODES and len(bindings) < MAX_BINDINGS:
        node = stack.pop()
        walked += 1
        if isinstance(node, list):
            stack.extend(reversed(node))
        elif isinstance(node, dict):
            for name, value in node.items():
                found = _binding(value, node) if name == "retrieval_endpoint" else None
                if found is not None:
                    bindings.append(found)
                elif isinstance(value, dict | list):
                    stack.append(value)
    return TransactionResult(echoed if is_thumbprint(echoed) else None, tuple(bindings[:MAX_BINDINGS]))


def _unix_seconds(text: str) -> int | None:
    """``text`` as unix seconds: ASCII digits, at most 15 of them (None when it is not)."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 15 else None
