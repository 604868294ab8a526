"""Possession proofs on a key directory response (the web-bot-auth drafts' signed directory).

``draft-ietf-webbotauth-httpsig-protocol`` (spec-notes 6.3): the server of
``/.well-known/http-message-signatures-directory`` signs its response once per published key,
covering ``"@authority";req`` and ``content-digest``, with ``created``, ``expires``, ``keyid`` and
``tag="http-message-signatures-directory"``; a client checks Content-Digest against the body and
ignores every key without a valid proof. ``sign_directory_response`` makes the three fields,
``proven_keys`` returns the thumbprints whose proofs hold. Sans-IO: times are parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .b64 import b64_encode
from .digest import content_digest, verify_content_digest
from .errors import FieldError, VerificationError
from .fields import Fields
from .jwk import PublicKey, SigningKey
from .keys import MAX_DIRECTORY_KEYS
from .sfv import is_string, serialize_member
from .signature_components import ALG_ED25519, parse_field_dictionary
from .signature_verify import DEFAULT_SKEW_S

__all__ = [
    "DIRECTORY_SIGNATURE_TAG",
    "WEB_DIRECTORY_MEDIA_TYPE",
    "directory_proof_base",
    "directory_proof_bases",
    "directory_proof_fields",
    "directory_proof_params",
    "proven_keys",
    "sign_directory_response",
]

DIRECTORY_SIGNATURE_TAG = "http-message-signatures-directory"
WEB_DIRECTORY_MEDIA_TYPE = "application/http-message-signatures-directory+json"
_INNER = '("@authority";req "content-digest")'
_COMPONENTS = (("@authority", (("req", True),)), ("content-digest", ()))
_REQUIRED = frozenset({"created", "expires", "keyid", "tag"})
_ALLOWED = _REQUIRED | {"alg", "nonce"}


def directory_proof_params(keyid: str, created: int, expires: int) -> str:
    """The Signature-Input member value, in the drafts' order ``created``, ``expires``, ``keyid``, ``tag``."""
    return f'{_INNER};created={created};expires={expires};keyid="{keyid}";tag="{DIRECTORY_SIGNATURE_TAG}"'


def directory_proof_base(authority: str, digest: str, params_value: str) -> bytes:
    """RFC 9421 section 2.5 base of a directory proof: the request's authority, the digest, the params."""
    base = f'"@authority";req: {authority}\n"content-digest": {digest}\n"@signature-params": {params_value}'
    if not base.isascii():
        raise FieldError("non-ascii-component", "a directory proof's authority is ASCII")
    return base.encode("ascii")


def sign_directory_response(
    body: bytes, authority: str, keys: Sequence[SigningKey], *, created: int, expires: int
) -> list[tuple[str, str]]:
    """Content-Digest, Signature-Input and Signature with one proof per key (labels ``binding0``…)."""
    digest, planned = directory_proof_bases(
        body, authority, [key.thumbprint for key in keys], created=created, expires=expires
    )
    signatures = [key.sign(base) for key, (_, base) in zip(keys, planned, strict=True)]
    return directory_proof_fields(digest, planned, signatures)


def directory_proof_bases(
    body: bytes, authority: str, keyids: Sequence[str], *, created: int, expires: int
) -> tuple[str, list[tuple[str, bytes]]]:
    """The body's Content-Digest, and per key its Signature-Input value and the base it signs (for a
    caller that signs elsewhere: a key on a token signs off the event loop)."""
    digest = content_digest(body)
    planned = []
    for keyid in keyids:
        params = directory_proof_params(keyid, created, expires)
        planned.append((params, directory_proof_base(authority, digest, params)))
    return digest, planned


def directory_proof_fields(
    digest: str, planned: Sequence[tuple[str, bytes]], signatures: Sequence[bytes]
) -> list[tuple[str, str]]:
    """The three fields from ``directory_proof_bases``' plan and the signatures, in key order; with no
    key to prove, Content-Digest alone (an empty Dictionary is not serialized: RFC 8941 section 4.1)."""
    if not planned:
        return [("Content-Digest", digest)]
    return [
        ("Content-Digest", digest),
        ("Signature-Input", ", ".join(f"binding{i}={params}" for i, (params, _base) in enumerate(planned))),
        ("Signature", ", ".join(f"binding{i}=:{b64_encode(sig)}:" for i, sig in enumerate(signatures))),
    ]


def proven_keys(
    body: bytes,
    authority: str,
    fields: Fields,
    publics: Iterable[PublicKey],
    *,
    now: float,
    skew_s: int = DEFAULT_SKEW_S,
    max_proofs: int = MAX_DIRECTORY_KEYS,
) -> frozenset[str] | None:
    """Thumbprints of ``publics`` whose possession proof on this response holds at ``now``; None when
    the response carries no directory proof at all (a spec directory: nothing to check).

    A proof holds when its label covers exactly ``"@authority";req`` and ``content-digest``, carries
    the directory tag, a ``keyid`` of a published key, ``created`` no later than ``now + skew_s`` and
    ``expires`` after ``now``, and verifies over the base rebuilt for ``authority`` (the authority
    the client asked). A Content-Digest that does not match the body proves nothing.

    Bounded for a stranger's response (the drafts: "Verifiers SHOULD enforce a maximum key count",
    "Each key SHOULD be used to provide one signature"): a field that may hold more than
    ``max_proofs`` members proves nothing, and only a listed key's first current proof is verified,
    so there are at most as many verifications as listed keys.
    """
    raw_input, raw_sig = fields.combined("signature-input"), fields.combined("signature")
    if raw_input is None:
        return None
    if _may_exceed(raw_input, max_proofs):
        return frozenset()  # before the parse: a 64 KiB field costs milliseconds to parse
    try:
        inputs = parse_field_dictionary(raw_input, "Signature-Input")
    except FieldError:
        return frozenset()  # something claimed to be a signature and is malformed: nothing proven
    if not any(_tag(member) == DIRECTORY_SIGNATURE_TAG for member in inputs.values()):
        return None
    digest = fields.combined("content-digest")
    if (
        raw_sig is None
        or digest is None
        or _may_exceed(raw_sig, max_proofs)
        or _may_exceed(digest, max_proofs)
    ):
        return frozenset()
    try:
        verify_content_digest(digest, body)
        signatures = parse_field_dictionary(raw_sig, "Signature")
    except (FieldError, VerificationError):
        return frozenset()
    by_id = {key.thumbprint: key for key in publics}
    proven: set[str] = set()
    tried: set[str] = set()  # each listed key is tried once: at most len(by_id) verifications
    for label, member in inputs.items():
        if len(tried) == len(by_id):
            break
        keyid = _proof_keyid(member, now, skew_s)
        sig = signatures.get(label)
        if (
            keyid is None
            or keyid not in by_id
            or keyid in tried
            or sig is None
            or not isinstance(sig[0], bytes)
        ):
            continue
        tried.add(keyid)
        params = serialize_member(member)  # RFC 9421 3.2: the @signature-params value as received
        if by_id[keyid].verify(sig[0], directory_proof_base(authority, digest, params)):
            proven.add(keyid)
    return frozenset(proven)


def _may_exceed(raw: str, max_members: int) -> bool:
    """Whether a Dictionary field may hold more than ``max_members`` members, before any parse: its
    members are separated by commas (a comma inside a String counts too: no proof's String has one)."""
    return raw.count(",") >= max_members


def _tag(member: Any) -> object:
    return member[1].get("tag") if isinstance(member, tuple) and isinstance(member[1], dict) else None


def _proof_keyid(member: Any, now: float, skew_s: int) -> str | None:
    """The keyid of a well-formed, current directory proof (exactly the drafts' shape), else None."""
    if not (isinstance(member, tuple) and isinstance(member[0], list)):
        return None
    items, params = member
    shape = tuple((str(value), tuple(sorted(p.items()))) for value, p in items)
    if shape != _COMPONENTS or any(not isinstance(value, str) for value, _ in items):
        return None
    if not _REQUIRED <= set(params) <= _ALLOWED:
        return None
    # RFC 9421 section 2.3: tag is a String. A Token equals its text (http_sf's Token is a UserString):
    # `tag=http-message-signatures-directory` is caught as a proof (``_tag``) and proves nothing.
    if not is_string(params["tag"], DIRECTORY_SIGNATURE_TAG):
        return None
    if not is_string(params.get("alg", ALG_ED25519), ALG_ED25519):
        return None
    created, expires, keyid = params["created"], params["expires"], params["keyid"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (created, expires)):
        return None
    if not isinstance(keyid, str) or created > now + skew_s or now >= expires or expires <= created:
        return None
    return keyid
