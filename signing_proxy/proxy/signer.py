"""The signer: one signature on a message with our current key, or a named one, never skipped.

``Signer.sign`` builds the ``@signature-params`` and the signature base and attaches the member;
``sign_off_loop`` does the same for keys on a device (a PKCS#11 token) off the event loop. A token
key signs on the token's thread either way, waited for at most ``signing.pkcs11.timeout_s``: a token
that hangs refuses the request, it never holds its caller (a thread, or a loop signing in-line) for
longer. A signature never outlives its key: ``expires`` is ``signing.validity_s`` after
``created``, or the key's ``not_after`` when that comes first (the spec refuses a signature from
then on). Every failure is a ``ProxyError`` (503 no key, 400 a request no base can be built from):
nothing goes out unsigned. No signature base is made twice in one second (``Repeats``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypedDict, Unpack

from ..core.errors import SigningError
from ..core.jwk import SigningKey
from ..core.keys import KeyProvider
from ..core.signature_components import signature_base, signing_params_value
from ..core.signature_key import SIGNATURE_KEY, SIGNATURE_KEY_COMPONENT, signature_key_member
from ..core.signatures import SPEC_COMPONENTS, Component, Message, SignedMember, attach_signature
from ..errors import ProxyError, TokenError
from ..storage.pkcs11 import TokenKey

if TYPE_CHECKING:
    from ..metrics import Metrics

__all__ = ["Repeats", "SignOptions", "Signer"]


class SignOptions(TypedDict, total=False):
    """How ``Signer.sign`` signs, beyond the defaults (the spec's five components, the current key)."""

    label: str | None  # a label other than the configured one (a relay's, made unique)
    components: Sequence[Component]
    keyid: str | None  # sign with that key of ours only, or raise ``missing()`` if it may not sign now
    present: bool  # add a ``Signature-Key`` member for the label and cover it (a retrieval fetch)
    missing: Callable[[], ProxyError] | None
    extra_params: Sequence[tuple[str, str | int]]  # after the spec's four (a profile's nonce, tag)
    max_validity_s: int | None  # caps signing.validity_s (a profile's longest validity)


class Repeats:
    """How often each signature base was made in the current second (by its hash), so that none is
    made twice.

    The spec's profile has no nonce and Ed25519 is deterministic: two identical requests in one
    second (a retry, a poll) went out with the same signature, and a verifier refusing replays
    (``gateway.replay_protection``) refused the second. The k-th repeat is signed with ``expires``
    k * ``step`` seconds earlier (a shorter window is always acceptable) while at least half the
    window is left (``Signer.unrepeated``); past that, repeats share the first one's signature, as
    they did before: a window cut to its last second expired on its way (a flood of identical
    requests, 6,000 a second, had samples refused ``signature-expired``). ``run --workers N``
    spreads its processes apart (``spread``): worker i starts ``i`` seconds earlier and steps by N,
    so two workers never make the same base either. A hash that collides costs a second of window,
    nothing else; each request costs one lookup, whatever came before it.
    """

    __slots__ = ("_lock", "_second", "_seen", "offset", "step")

    def __init__(self) -> None:
        self.offset, self.step = 0, 1
        self._second = -1
        self._seen: dict[int, int] = {}
        self._lock = threading.Lock()  # the in-process client signs from several threads

    def spread(self, index: int, count: int) -> None:
        """This process is worker ``index`` of ``count`` sharing one key store."""
        self.offset, self.step = index, count

    def earlier(self, created: int, base: bytes) -> int:
        """How many seconds before its latest ``expires`` the signature whose base at that latest
        ``expires`` is ``base`` ends: 0 the first time this second, then ``step``, 2 * ``step``..."""
        digest = hash(base)
        with self._lock:
            if created < self._second:  # a thread that read the clock before another's new second:
                return 0  # its second is forgotten (and was not to be reset to, wiping the new one's)
            if created > self._second:
                self._second, self._seen = created, {}
            made = self._seen.get(digest, 0)
            self._seen[digest] = made + 1
        return made * self.step


class Signer:
    """Signs messages with the current key, or a named one; the window is ``[now, now + validity_s)``,
    cut at the key's ``not_after``, and earlier for a repeat (``Repeats``)."""

    def __init__(
        self,
        keys: KeyProvider,
        *,
        label: str,
        validity_s: int,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
        repeats: Repeats | None = None,
    ):
        self.keys = keys
        self.label = label
        self.repeats = Repeats() if repeats is None else repeats  # a reload's signer keeps the app's
        self.validity_s = validity_s
        self.clock = clock
        self.metrics = metrics

    def sign(self, message: Message, **how: Unpack[SignOptions]) -> str:
        """Sign and attach; return the keyid. Raises ProxyError (503/400) instead of ever skipping."""
        key, label, params, base = self._prepare(message, how)
        return self._attach(message, key, self.member(key, label, params, base))

    async def sign_off_loop(self, message: Message, **how: Unpack[SignOptions]) -> str:
        """``sign`` for keys that wait on a device (``key.blocking``: a PKCS#11 token): the signature
        is made on the token's thread, so the loop serves other requests meanwhile. A token that
        fails or does not answer in time raises ProxyError 503 ``signing-token-unavailable``: the
        request is refused, never forwarded unsigned. Other keys sign in-line, as ``sign`` does."""
        key, label, params, base = self._prepare(message, how)
        if not isinstance(key, TokenKey):
            return self._attach(message, key, self.member(key, label, params, base))
        try:
            signature = await key.sign_async(base)
        except TokenError as exc:
            raise self.token_failure(exc) from None
        return self._attach(message, key, SignedMember(label, params, signature, base))

    def member(self, key: SigningKey, label: str, params: str, base: bytes) -> SignedMember:
        """``key``'s signature over ``base``, waited for here. A token key (one a reload brought in as
        the request began, or any in a thread of a synchronous caller) signs on the token's thread,
        bounded as off the loop; one that fails or hangs is refused as there: 503, never a 500."""
        try:
            signature = key.sign_within(base) if isinstance(key, TokenKey) else key.sign(base)
        except TokenError as exc:
            raise self.token_failure(exc) from None
        return SignedMember(label, params, signature, base)

    def token_failure(self, exc: TokenError) -> ProxyError:
        """The refusal of a request whose key's token did not sign (counted): 503, never unsigned.
        The same answer whichever path signed (off the loop, or in-line: ``sign``, ``_sign_plain``)."""
        if self.metrics is not None:
            self.metrics.signing_failure("signing-token-unavailable")
        return ProxyError(
            503, "signing-token-unavailable", f"the signing key's token did not sign ({exc.reason})"
        )

    def _prepare(self, message: Message, how: SignOptions) -> tuple[SigningKey, str, str, bytes]:
        """The key, label, ``@signature-params`` value and signature base of one signature."""
        now = self.clock()
        key = self._key(now, how.get("keyid"), how.get("missing"))
        label = how.get("label") or self.label
        components = how.get("components", SPEC_COMPONENTS)
        if how.get("present", False):
            message.fields.add(SIGNATURE_KEY, signature_key_member(label, key.public))
            components = (*components, SIGNATURE_KEY_COMPONENT)
        created = int(now)
        cap = how.get("max_validity_s")
        validity = self.validity_s if cap is None else min(self.validity_s, cap)
        try:
            if validity <= 0:
                raise SigningError("bad-signature-window", "expires must be after created")
            extra = how.get("extra_params", ())

            def build(expires: int) -> tuple[str, bytes]:
                params = signing_params_value(components, key.thumbprint, created, expires, extra)
                return params, signature_base(message, components, params)

            params, base = self.unrepeated(created, self.expires(key, created, validity), build)
        except SigningError as exc:  # a field the base cannot be built from (component_value says why)
            if self.metrics is not None:
                self.metrics.signing_failure(exc.reason)
            raise ProxyError(400, exc.reason, f"cannot sign this request: {exc.detail}") from None
        return key, label, params, base

    def expires(self, key: SigningKey, created: int, validity_s: int) -> int:
        """``expires`` of a signature ``key`` makes at ``created``: ``validity_s`` later, or the key's
        ``not_after`` when that comes first (a verifier refuses the signature from then on, however
        long the parameters say). ``key`` may sign at ``created``, so its window ends after it."""
        expires = created + validity_s
        ends = self.keys.not_after_of(key.thumbprint)
        return expires if ends is None or ends >= expires else max(created + 1, int(ends))

    def unrepeated(
        self, created: int, expires: int, build: Callable[[int], tuple[str, bytes]]
    ) -> tuple[str, bytes]:
        """``build(e)``'s ``@signature-params`` value and signature base for this worker's latest
        ``e`` up to ``expires``, moved earlier for a repeat this second while half the window is
        left (``Repeats``): one build, two for such a repeat."""
        repeats = self.repeats
        expires = max(created + 1, expires - repeats.offset)
        params, base = build(expires)
        earlier = repeats.earlier(created, base)
        if 0 < earlier <= (expires - created) // 2:
            params, base = build(expires - earlier)
        return params, base

    def _attach(self, message: Message, key: SigningKey, member: SignedMember) -> str:
        attach_signature(message.fields, member)
        if self.metrics is not None:  # the configured label: a relay's made unique (broker2, ...) is not
            self.metrics.signed(self.label)  # a metric label a request may choose
        return key.thumbprint

    def _key(self, now: float, keyid: str | None, missing: Callable[[], ProxyError] | None) -> SigningKey:
        key = self.keys.current(now) if keyid is None else self.keys.key_for(keyid, now)
        if key is not None:
            return key
        if keyid is None:
            error = ProxyError(
                503, "no-valid-signing-key", "no signing key is valid now; see `signing-proxy keys list`"
            )
        elif missing is not None:
            error = missing()
        else:
            error = ProxyError(503, "signing-key-unavailable", f"key {keyid} may not sign now")
        if self.metrics is not None:
            self.metrics.signing_failure(error.reason)
        raise error
