"""Ed25519 keys held on a PKCS#11 token (an HSM, SoftHSM2): the private key never leaves it.

A ``TokenKey`` is a ``SigningKey`` whose ``sign`` asks the token (``CKM_EDDSA``); its public key is
read from the token's public key object (``CKA_EC_POINT``) and named by its thumbprint like any
other key, once the token has signed a random challenge that verifies under it (a private key
object of another pair is refused). One ``Pkcs11Module`` per module path owns the loaded module,
one logged-in session per token (pooled: opened once, re-used by every signature, reopened after a
failure) and one worker thread, a daemon: a token call that never returns does not keep the
process from exiting. python-pkcs11 initialises a module without locking callbacks
(``C_Initialize(NULL)``), which by PKCS#11 means the application must not call it from several
threads at once; so every call into a module holds the module's lock, and signatures run on the
module's thread, never on the event loop (``TokenKey.sign_async``). A call that fails resets the
module (sessions closed, module re-initialised) and is tried once more, so a token that comes back
is used again without a restart; until then ``failure`` says why, for ``/readyz`` (another key
under the URI stays ``token-key-mismatch``). A refusal the token's own answer makes final is not
tried again and resets nothing (``_FINAL``). A key object the token holds but cannot sign with
(``token-key-unsupported``: not Ed25519, CKA_SIGN false) is a property of that object, which no
reset changes: its ``TokenKey`` refuses every signature at once, no call queued into the module,
until the probe finds the object usable (without a reset) or a reload makes a new key (``_KEPT``).
A PIN the token refused is never tried again by this process (the token would lock it after a few
tries): that needs a restart. The PIN is read once (``storage.tokenpin``), never blank, and never
appears in a message, a log line or a ``repr``.

python-pkcs11 is optional (extra ``hsm``): it is imported when a token is first used.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Final, TypeVar

from ..core.errors import KeyFormatError
from ..core.jwk import PublicKey, SigningKey
from ..core.keys import KeyProvider
from ..core.pkcs11_uri import Pkcs11Uri
from ..errors import TokenError
from ..logline import exception_kind
from .tokenpin import read_pin
from .worker import DaemonWorker

__all__ = [
    "ED25519_CURVE_OID",
    "Pkcs11KeyProvider",
    "Pkcs11Module",
    "TokenKey",
    "TokenSlot",
    "generate_token_key",
    "module_for",
    "open_token_key",
    "read_pin",
]

ED25519_CURVE_OID: Final = "1.3.101.112"  # RFC 8410 id-Ed25519: CKA_EC_PARAMS of an Ed25519 key
T = TypeVar("T")

# the token's answer, not a fault of the module or the session: a reset and a second try change nothing
_FINAL: Final = frozenset(
    {
        "token-pin-incorrect",
        "token-module-unloadable",
        "token-key-exists",
        "token-key-mismatch",
        "token-key-unsupported",
    }
)
# kept by the key: the object under its URI cannot sign (its type, CKA_SIGN), until the probe or a
# reload finds it fixed. Not token-key-missing: a key an operator imports may appear at any moment
_KEPT: Final = frozenset({"token-key-unsupported"})
_modules: dict[str, Pkcs11Module] = {}
_modules_lock = threading.Lock()


def _pkcs11() -> Any:
    try:
        import pkcs11  # noqa: PLC0415  # optional dependency (extra "hsm"), loaded on first use
    except ImportError:
        raise TokenError(
            "token-module-unloadable",
            "PKCS#11 keys need python-pkcs11: pip install 'signing-proxy[hsm]'",
        ) from None
    return pkcs11


def _token_selector(uri: Pkcs11Uri) -> tuple[tuple[str, str], ...]:
    pairs = (
        ("token_label", uri.token),
        ("token_serial", uri.serial),
        ("manufacturer_id", uri.manufacturer),
        ("model", uri.model),
    )
    return tuple((name, value) for name, value in pairs if value is not None)


def _key_template(uri: Pkcs11Uri, object_class: Any) -> dict[Any, Any]:
    p11 = _pkcs11()
    template: dict[Any, Any] = {p11.Attribute.CLASS: object_class}
    if uri.object is not None:
        template[p11.Attribute.LABEL] = uri.object
    if uri.id is not None:
        template[p11.Attribute.ID] = uri.id
    return template


def _read_public(session: Any, uri: Pkcs11Uri) -> PublicKey:
    """The public key of the one Ed25519 key pair ``uri`` names on ``session``'s token."""
    p11 = _pkcs11()
    objects = list(session.get_objects(_key_template(uri, p11.ObjectClass.PRIVATE_KEY)))
    if not objects:
        raise TokenError("token-key-missing", f"no private key {uri.describe()}")
    if len(objects) > 1:
        raise TokenError("token-key-missing", f"several private keys match {uri.describe()}")
    if objects[0][p11.Attribute.KEY_TYPE] != p11.KeyType.EC_EDWARDS:
        raise TokenError("token-key-unsupported", f"{uri.describe()} is not an Ed25519 key")
    publics = list(session.get_objects(_key_template(uri, p11.ObjectClass.PUBLIC_KEY)))
    if len(publics) != 1:
        raise TokenError("token-key-missing", f"no single public key object for {uri.describe()}")
    try:
        return PublicKey.from_raw(_raw_ec_point(publics[0][p11.Attribute.EC_POINT]))
    except KeyFormatError:
        raise TokenError("token-key-unsupported", f"{uri.describe()} is not an Ed25519 key") from None


def _raw_ec_point(point: bytes) -> bytes:
    """The 32 public bytes of ``CKA_EC_POINT``: DER OCTET STRING (``04 20 ...``, PKCS#11 3.0) or raw."""
    if len(point) == 34 and point[:2] == b"\x04\x20":
        return point[2:]
    if len(point) == 32:
        return point
    raise TokenError("token-key-unsupported", "the public key object is not an Ed25519 key (CKA_EC_POINT)")


class Pkcs11Module:
    """One PKCS#11 module: the loaded library, a pooled session per token, one thread for its calls."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.RLock()  # one call into the module at a time (see the module docstring)
        self.executor = DaemonWorker("pkcs11")  # not joined at exit: a hung token holds up no SIGTERM
        self.stalled: Future[Any] | None = None  # a call past its caller's timeout, still running
        self.generation = 0  # bumped by every reset: object handles of older generations are stale
        self._lib: Any = None
        self._sessions: dict[tuple[tuple[str, str], ...], Any] = {}
        self._stale = False

    def _library(self) -> Any:
        p11 = _pkcs11()
        if self._lib is None:
            try:
                self._lib = p11.lib(self.path)
            except p11.PKCS11Error as exc:
                raise TokenError(
                    "token-module-unloadable", f"cannot load the PKCS#11 module {self.path}: {exc}"
                ) from None
        elif self._stale:
            self._stale = False
            try:
                self._lib.reinitialize()
            except p11.PKCS11Error as exc:
                self._stale = True
                raise TokenError(
                    "token-unavailable", f"the module {self.path} did not re-initialise: {exc!r}"
                ) from None
        return self._lib

    def session(self, uri: Pkcs11Uri, pin: str | None, *, rw: bool = False) -> Any:
        """The token's pooled logged-in session (opened on first use; read-write only when ``rw``:
        some tokens allow few such sessions). Call with ``lock`` held."""
        selector = _token_selector(uri)
        session = self._sessions.get(selector)
        if session is not None and (session.rw or not rw):
            return session
        if session is not None:  # one login per token: the read-only session makes way
            with contextlib.suppress(_pkcs11().PKCS11Error):
                session.close()
            del self._sessions[selector]
        p11 = _pkcs11()
        lib = self._library()
        where = uri.describe().partition(" on ")[2]
        try:
            token = lib.get_token(**dict(selector))
        except p11.NoSuchToken:
            raise TokenError("token-missing", f"no token matches {where} in {self.path}") from None
        except p11.MultipleTokensReturned:
            raise TokenError("token-missing", f"several tokens match {where}; name it by serial") from None
        except p11.PKCS11Error as exc:
            raise TokenError("token-unavailable", f"cannot list the tokens of {self.path}: {exc!r}") from None
        try:
            session = token.open(rw=rw, user_pin=pin)
        except (p11.PinIncorrect, p11.PinInvalid, p11.PinLenRange):
            raise TokenError("token-pin-incorrect", f"{where} refused the PIN") from None
        except p11.PinLocked:
            raise TokenError("token-pin-incorrect", f"{where}: the user PIN is locked") from None
        except p11.PKCS11Error as exc:
            raise TokenError("token-unavailable", f"cannot open a session on {where}: {exc!r}") from None
        self._sessions[selector] = session
        return session

    def reset(self) -> None:
        """Drop every session and re-initialise the module before its next use. Call with ``lock``."""
        p11 = _pkcs11()
        for session in self._sessions.values():
            with contextlib.suppress(p11.PKCS11Error):  # a token gone took its session with it
                session.close()
        self._sessions.clear()
        self._stale = self._lib is not None
        self.generation += 1

    def submit(self, fn: Callable[..., T], *args: object) -> Future[T]:
        """``fn(*args)`` on the module's thread. Refused at once (``token-unavailable``) while a call
        that timed out still runs: nothing piles up behind a token that hangs (a signature base and a
        future per request, for as long as it hangs)."""
        stalled = self.stalled
        if stalled is not None and not stalled.done():
            raise TokenError("token-unavailable", "the token has not finished a call that timed out")
        return self.executor.submit(fn, *args)

    def timed_out(self, future: Future[Any]) -> None:
        """``future`` passed its caller's timeout: dropped while still queued, else marked stalled."""
        if not future.cancel():
            self.stalled = future

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (blocking) holding the module's lock; a PKCS#11 failure resets the module and
        runs it once more. TokenError says why it failed twice."""
        p11 = _pkcs11()
        with self.lock:
            for attempt in (1, 2):
                try:
                    return fn()
                except p11.PKCS11Error as exc:
                    self.reset()
                    if attempt == 2:
                        raise TokenError(
                            "token-unavailable", f"the token failed: {exception_kind(exc)}"
                        ) from None
                except TokenError as exc:
                    if exc.reason in _FINAL:  # the token answered: trying again changes nothing
                        raise
                    self.reset()
                    if attempt == 2:
                        raise
        raise AssertionError("unreachable")


def module_for(path: str) -> Pkcs11Module:
    """The process's one ``Pkcs11Module`` for ``path`` (a module is initialised once per process)."""
    with _modules_lock:
        module = _modules.get(path)
        if module is None:
            module = _modules[path] = Pkcs11Module(path)
        return module


@dataclass
class TokenSlot:
    """A token as configured: its module, the URI naming it, the PIN; ``failure`` (None: healthy)."""

    module: Pkcs11Module
    uri: Pkcs11Uri
    pin: str | None = None
    timeout_s: float = 5.0
    failure: str | None = None

    def __repr__(self) -> str:  # never the PIN
        return f"TokenSlot({self.module.path!r}, {self.uri.describe()!r})"

    def session(self, *, rw: bool = False) -> Any:
        if self.failure == "token-pin-incorrect":  # never again: the token counts wrong PINs
            raise TokenError("token-pin-incorrect", "the token refused the PIN; restart with the right one")
        return self.module.session(self.uri, self.pin, rw=rw)

    def public_key(self, uri: Pkcs11Uri) -> PublicKey:
        """The Ed25519 public key of the key pair ``uri`` names (blocking: off the event loop)."""
        return self.tracked(lambda: _read_public(self.session(), uri))

    def tracked(self, fn: Callable[[], T]) -> T:
        try:
            result = self.module.call(fn)
        except TokenError as exc:
            self.failure = exc.reason
            raise
        self.failure = None
        return result


class TokenKey(SigningKey):
    """A key pair on a token: ``sign`` blocks on the token (call ``sign_async`` on the event loop)."""

    __slots__ = ("_handle", "_refused", "slot", "uri")
    blocking: ClassVar[bool] = True

    def __init__(self, slot: TokenSlot, uri: Pkcs11Uri, public: PublicKey) -> None:
        self.slot = slot
        self.uri = uri
        self.public = public
        self._handle: tuple[int, Any] | None = None  # (module generation, private key object)
        # (reason, detail) of a refusal in ``_KEPT``: written by the module's and the probe's threads,
        # read where a signature is asked (the event loop too), replaced whole
        self._refused: tuple[str, str] | None = None

    def __repr__(self) -> str:
        return f"TokenKey(thumbprint={self.thumbprint!r}, {self.uri.describe()})"

    def sign(self, data: bytes) -> bytes:
        """Ed25519 (``CKM_EDDSA``) on the token; blocking. TokenError when the token cannot sign."""
        p11 = _pkcs11()
        self._check_refused()

        def on_token() -> bytes:
            handle = self._handle
            if handle is None or handle[0] != self.slot.module.generation:
                handle = self._open()
            return bytes(handle[1].sign(data, mechanism=p11.Mechanism.EDDSA))

        return self._tracked(on_token)

    def _tracked(self, fn: Callable[[], T]) -> T:
        """``slot.tracked(fn)`` (the slot records its own health); a refusal in ``_KEPT`` is kept by
        this key, and any call that succeeds clears it."""
        try:
            result = self.slot.tracked(fn)
        except TokenError as exc:
            if exc.reason in _KEPT:
                self._refused = (exc.reason, exc.detail)
            raise
        self._refused = None
        return result

    def _check_refused(self) -> None:
        """Refuse at once a key whose object cannot sign (``_KEPT``), noted on the slot as ``tracked``
        would (``/readyz``): asking the token again per request held up its module's other keys."""
        refused = self._refused
        if refused is not None:
            self.slot.failure = refused[0]
            raise TokenError(*refused)

    def _open(self) -> tuple[int, Any]:
        """The private key object's handle, taken (at first use and after each reset) only once the
        public key ``uri`` names is still ``public`` and the private key proves to be its pair: the
        token signs a random challenge that must verify. A key store's entries and a reconnected
        ``signing.key`` are checked as a key opened at start is (``token-key-mismatch``); a private
        key the token does not let sign is ``token-key-unsupported``, never an AttributeError."""
        p11 = _pkcs11()
        session = self.slot.session()
        self._same_key(session)  # never sign with another key
        key = session.get_key(**_lookup(self.uri, p11.ObjectClass.PRIVATE_KEY))
        if not isinstance(key, p11.SignMixin):  # CKA_SIGN false: python-pkcs11 gives it no ``sign``
            raise TokenError("token-key-unsupported", f"{self.uri.describe()} may not sign (CKA_SIGN false)")
        challenge = secrets.token_bytes(32)
        if not self.public.verify(bytes(key.sign(challenge, mechanism=p11.Mechanism.EDDSA)), challenge):
            raise TokenError(
                "token-key-mismatch",
                f"the private key of {self.uri.describe()} is not the pair of its public key object "
                "(its signatures do not verify)",
            )
        self._handle = (self.slot.module.generation, key)
        return self._handle

    async def sign_async(self, data: bytes) -> bytes:
        """``sign`` on the module's thread, bounded by the slot's ``timeout_s``; the loop never waits."""
        self._check_refused()  # not queued behind the module's calls: nothing on the token can sign
        future = self.slot.module.submit(self.sign, data)  # refused at once while an earlier call hangs
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.slot.timeout_s)
        except TimeoutError:
            raise self._timed_out(future) from None

    def sign_within(self, data: bytes) -> bytes:
        """``sign_async`` for a thread (never the module's own: it would wait for itself)."""
        self._check_refused()
        future = self.slot.module.submit(self.sign, data)
        try:
            return future.result(timeout=self.slot.timeout_s)
        except TimeoutError:
            raise self._timed_out(future) from None

    def _timed_out(self, future: Future[Any]) -> TokenError:
        """Past ``timeout_s``: dropped if queued, else the module stalls on it; ``token-timeout``."""
        self.slot.module.timed_out(future)
        self.slot.failure = "token-timeout"
        return TokenError("token-unavailable", f"the token did not sign within {self.slot.timeout_s:g} s")

    def _same_key(self, session: Any) -> None:
        """Refuse (``token-key-mismatch``) when the public key ``uri`` names is no longer ``public``."""
        if _read_public(session, self.uri) != self.public:
            raise TokenError(
                "token-key-mismatch", f"{self.uri.describe()} is no longer the key {self.thumbprint}"
            )

    def probe(self) -> bool:
        """Look for the key on the token again (blocking), its pair proved; True when it answers with
        this key. Another key under the URI keeps ``token-key-mismatch`` (every signature refused).
        Short of a reload, the way back for a key that refuses at once (``_KEPT``)."""
        try:
            self._tracked(self._open)
        except TokenError:
            return False
        return True

    def to_pem(self) -> bytes:
        raise KeyFormatError("key-not-extractable", "a token key never leaves its token")

    def to_jwk(self) -> dict[str, str]:
        raise KeyFormatError("key-not-extractable", "a token key never leaves its token")


def _lookup(uri: Pkcs11Uri, object_class: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"object_class": object_class}
    if uri.object is not None:
        args["label"] = uri.object
    if uri.id is not None:
        args["id"] = uri.id
    return args


def open_token_key(slot: TokenSlot, uri: Pkcs11Uri) -> TokenKey:
    """The key ``uri`` names on ``slot``'s token, its public key read now (blocking) and proved: the
    keyid comes from the public key object alone, so the token signs a random challenge that must
    verify under it. A private key object that is not that object's pair (every signature would be
    invalid) is refused (``token-key-mismatch``)."""
    key = TokenKey(slot, uri, slot.public_key(uri))
    slot.tracked(key._open)  # the challenge: token-key-mismatch
    return key


def generate_token_key(slot: TokenSlot, uri: Pkcs11Uri) -> TokenKey:
    """Create a non-extractable, sensitive Ed25519 key pair on the token (``CKM_EC_EDWARDS_KEY_PAIR_GEN``)
    labelled ``uri.object`` with id ``uri.id`` (a random 16-byte id when none is given). Refuses
    (``token-key-exists``) when a private key already answers to the URI."""
    p11 = _pkcs11()
    from pkcs11.util.ec import encode_named_curve_parameters  # noqa: PLC0415  # optional dependency

    key_id = uri.id if uri.id is not None else secrets.token_bytes(16)
    named = replace(uri, id=key_id)

    def generate() -> None:
        session = slot.session(rw=True)
        if list(session.get_objects(_key_template(uri, p11.ObjectClass.PRIVATE_KEY))):
            raise TokenError("token-key-exists", f"a private key {uri.describe()} already exists")
        common = {p11.Attribute.TOKEN: True, p11.Attribute.ID: key_id}
        if uri.object is not None:
            common[p11.Attribute.LABEL] = uri.object
        session.generate_keypair(
            p11.KeyType.EC_EDWARDS,
            mechanism=p11.Mechanism.EC_EDWARDS_KEY_PAIR_GEN,
            store=True,
            public_template={
                **common,
                p11.Attribute.EC_PARAMS: encode_named_curve_parameters(ED25519_CURVE_OID),
                p11.Attribute.VERIFY: True,
            },
            private_template={
                **common,
                p11.Attribute.PRIVATE: True,
                p11.Attribute.SENSITIVE: True,
                p11.Attribute.EXTRACTABLE: False,
                p11.Attribute.SIGN: True,
            },
        )

    slot.tracked(generate)
    return open_token_key(slot, named)


class Pkcs11KeyProvider(KeyProvider):
    """``signing.key: pkcs11:...``: one token key, always (no windows), signed off the event loop."""

    blocking = True

    def __init__(self, key: TokenKey) -> None:
        self.key = key

    def current(self, now: float) -> SigningKey | None:
        return self.key

    def key_for(self, thumbprint: str, now: float) -> SigningKey | None:
        return self.key if thumbprint == self.key.thumbprint else None

    def unavailable(self) -> str | None:
        return self.key.slot.failure

    def probe(self) -> None:
        """When the token failed, try it again (blocking: off the loop); success clears ``failure``."""
        if self.key.slot.failure is not None:
            self.key.probe()
