"""An independent RFC 9421 check: the PyPI package ``http-message-signatures`` (pyauth) verifies
what our code emits, so our signer is never only checked by our own verifier; and signs as a third
party would, so our verifier is never only checked against our own signer."""

from __future__ import annotations

import datetime
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from http_message_signatures import HTTPMessageSigner, HTTPMessageVerifier, MappingKeyResolver, algorithms
from http_message_signatures.signatures import SignatureVerifyWarning

from signing_proxy.core.digest import content_digest
from signing_proxy.core.jwk import SigningKey

SPEC_FIVE = ("@method", "@target-uri", "content-digest", "authorization", "signature-agent")
WEB_BOT_AUTH_REQUIRED = ("@authority",)  # the web-bot-auth profile's one required component


class _Headers:
    def __init__(self, lines: Iterable[tuple[str, str]]) -> None:
        self._lines = list(lines)

    def items(self) -> list[tuple[str, str]]:
        return list(self._lines)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(n for n, _ in self._lines))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(n.lower() == name.lower() for n, _ in self._lines)

    def __getitem__(self, name: str) -> str:
        return ", ".join(v for n, v in self._lines if n.lower() == name.lower())


class _WritableHeaders(_Headers):
    def __setitem__(self, name: str, value: str) -> None:
        self._lines = [(n, v) for n, v in self._lines if n.lower() != name.lower()] + [(name, value)]

    def __delitem__(self, name: str) -> None:
        self._lines = [(n, v) for n, v in self._lines if n.lower() != name.lower()]


@dataclass
class OracleRequest:
    method: str
    url: str
    headers: _Headers


def oracle_sign(
    method: str,
    url: str,
    lines: Iterable[tuple[str, str]],
    body: bytes,
    *,
    keyid: str,
    private_key: Ed25519PrivateKey,
    now: int,
    label: str = "agent",
    components: Iterable[str] = SPEC_FIVE,
    tag: str | None = None,
) -> list[tuple[str, str]]:
    """``lines`` with a signature of ``label`` that pyauth made over ``method`` and ``url`` exactly as
    given (its ``@target-uri`` is ``url``, no normal form), valid from ``now`` for 300 s; appended to
    any signature the lines carry."""
    request = OracleRequest(method, url, _WritableHeaders(lines))
    resolver = MappingKeyResolver(public_keys={}, private_keys={keyid: private_key})
    signer = HTTPMessageSigner(signature_algorithm=algorithms.ED25519, key_resolver=resolver)
    created = datetime.datetime.fromtimestamp(now, datetime.UTC)
    signer.sign(
        request,
        key_id=keyid,
        created=created,
        expires=created + datetime.timedelta(seconds=300),
        label=label,
        tag=tag,
        covered_component_ids=tuple(components),
        append_if_signature_exists=True,
        body=body,
        use_existing_digest=True,
    )
    return request.headers.items()


def oracle_agent_sign(
    method: str,
    url: str,
    body: bytes,
    key: SigningKey,
    *,
    signature_agent: str,
    authorization: str = "",
    head: Iterable[tuple[str, str]] = (),
    now: int | None = None,
) -> list[tuple[str, str]]:
    """An agent's request as a third party signs it: ``head``, the spec's covered fields for ``body``
    (``Content-Digest``, ``Authorization``, ``Signature-Agent`` as given), and pyauth's signature by
    ``key`` over ``url`` exactly (``oracle_sign``), valid from ``now`` (default: this second)."""
    lines = [
        *head,
        ("Content-Digest", content_digest(body)),
        ("Authorization", authorization),
        ("Signature-Agent", signature_agent),
    ]
    signed_at = int(time.time()) if now is None else now
    return oracle_sign(
        method, url, lines, body, keyid=key.thumbprint, private_key=key._private, now=signed_at
    )


def oracle_verify(
    method: str,
    url: str,
    lines: Iterable[tuple[str, str]],
    body: bytes,
    public_keys: dict[str, Ed25519PublicKey],
    *,
    labels: Iterable[str] = ("agent",),
    check_time: bool = True,
    require_components: Iterable[str] = SPEC_FIVE,
) -> list[str]:
    """Verify each label with pyauth's verifier and return the labels it accepted (raises otherwise)."""
    request = OracleRequest(method, url, _Headers(lines))
    verifier = HTTPMessageVerifier(
        signature_algorithm=algorithms.ED25519,
        key_resolver=MappingKeyResolver(public_keys=public_keys, private_keys={}),
    )
    verifier.allow_label_only_selection = True
    if not check_time:
        verifier.validate_created_and_expires = lambda *_a, **_k: None  # type: ignore[method-assign]
    accepted: list[str] = []
    for label in labels:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SignatureVerifyWarning)
            results = verifier.verify(
                request,
                expect_label=label,
                max_age=datetime.timedelta(hours=1) if check_time else None,
                body=body,
                require_components=tuple(require_components),
            )
        accepted.extend(r.label for r in results)
    return accepted
