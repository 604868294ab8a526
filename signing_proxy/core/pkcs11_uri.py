"""PKCS#11 URIs (RFC 7512): which token, which key object, and where the module and PIN come from.

``pkcs11:token=Agent%20keys;object=agent-2026?module-path=/usr/lib/softhsm/libsofthsm2.so`` names a
token by its label (``token``), serial, manufacturer or model, and a key object by its label
(``object``) and/or ``id`` (raw bytes, percent-encoded). Path attributes are separated by ``;``,
query attributes by ``&``; values are percent-decoded (RFC 7512 section 2.3). An attribute that
appears twice, an unknown standard attribute, malformed percent-encoding, and a ``type`` other
than ``private`` are refused with ``KeyFormatError("bad-pkcs11-uri")``; vendor attributes
(``x-...``) are ignored, as section 2.3 allows. A value (but a ``pin-value``'s) holding what looks
like a query attribute in the wrong place is refused too: RFC 7512 lets ``&`` and ``=`` into a path
value, so ``object=agent&pin-value=...`` would make the PIN part of a key label, shown in every
message naming the key. ``str(uri)``, ``repr`` and ``describe()`` never show a ``pin-value``, not
even one inside another value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

from .errors import KeyFormatError

__all__ = ["NOT_SHOWN", "PKCS11_SCHEME", "Pkcs11Uri", "is_pkcs11_uri", "mask_pin_value", "parse_pkcs11_uri"]

PKCS11_SCHEME: Final = "pkcs11:"
NOT_SHOWN: Final = "(not shown)"  # what stands for a secret wherever one would be shown
MAX_URI_CHARS: Final = 4096  # our choice: far above any real URI

_PATH_ATTRS: Final = frozenset(
    {
        "token",
        "manufacturer",
        "serial",
        "model",
        "library-manufacturer",
        "library-description",
        "library-version",
        "object",
        "type",
        "id",
        "slot-description",
        "slot-manufacturer",
        "slot-id",
    }
)
_QUERY_ATTRS: Final = frozenset({"pin-source", "pin-value", "module-name", "module-path"})
_SECRET_ATTRS: Final = frozenset({"pin-value"})  # never shown, not even a character of it
_PCT: Final = re.compile(r"%([0-9A-Fa-f]{2})")
_REASON: Final = "bad-pkcs11-uri"


def is_pkcs11_uri(value: str) -> bool:
    """True when ``value`` uses the ``pkcs11:`` scheme (case-insensitive, as URI schemes are)."""
    return value[: len(PKCS11_SCHEME)].lower() == PKCS11_SCHEME


@dataclass(frozen=True)
class Pkcs11Uri:
    """The attributes of a PKCS#11 URI that select a token key; ``id`` is raw bytes."""

    token: str | None = None
    manufacturer: str | None = None
    serial: str | None = None
    model: str | None = None
    object: str | None = None
    id: bytes | None = None
    module_path: str | None = None
    pin_source: str | None = None
    pin_value: str | None = field(default=None, repr=False)  # a secret: never printed

    def __str__(self) -> str:
        """The canonical URI, without ``pin-value`` (it is a secret), nor one inside another value
        (``_shown``: never in a parsed URI, so what ``keyindex`` writes of one is the URI itself)."""
        path = [
            ("token", self.token),
            ("manufacturer", self.manufacturer),
            ("serial", self.serial),
            ("model", self.model),
            ("object", self.object),
        ]
        parts = [f"{name}={_shown(value, 'path', _PATH_SAFE)}" for name, value in path if value is not None]
        if self.id is not None:
            parts.append("id=" + "".join(f"%{b:02X}" for b in self.id))
        query = [("module-path", self.module_path), ("pin-source", self.pin_source)]
        q = "&".join(
            f"{name}={_shown(value, 'query', _QUERY_SAFE)}" for name, value in query if value is not None
        )
        return PKCS11_SCHEME + ";".join(parts) + (f"?{q}" if q else "")

    def __repr__(self) -> str:  # as str: the dataclass's would show a PIN put in another value
        return f"Pkcs11Uri({str(self)!r})"

    def describe(self) -> str:
        """The key in words for messages: ``object 'agent' on token 'Agent keys'`` (``_shown``)."""
        what = f"object {_shown(self.object, 'path')!r}" if self.object is not None else "the key"
        if self.id is not None:
            what += f" (id {self.id.hex()})"
        where = next(
            (
                f"{n} {_shown(v, 'path')!r}"
                for n, v in (("token", self.token), ("serial", self.serial))
                if v is not None
            ),
            "the first token",
        )
        return f"{what} on {where}"


# RFC 7512 section 2.3: pk11-res-avail (unreserved, ":[]@!$'()*+,=" less what separates), and
# "&" in a path value, "/", "?" and "|" in a query value ("=" is always encoded here: never needed)
_RES_AVAIL = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~:[]@!$'()*+,"
_PATH_SAFE = _RES_AVAIL + b"&"
_QUERY_SAFE = _RES_AVAIL + b"/?|"


def _quote(raw: bytes, safe: bytes) -> str:
    """Percent-encode every byte ``safe`` does not hold."""
    return "".join(chr(b) if b in safe else f"%{b:02X}" for b in raw)


def _unquote(text: str, name: str, *, query: bool) -> bytes:
    """A value's bytes; ``query``: a query attribute's, where RFC 7512 also allows ``|``."""
    out = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "%":
            match = _PCT.match(text, i)
            if match is None:
                raise KeyFormatError(_REASON, f"attribute {name!r}: malformed percent-encoding")
            out.append(int(match.group(1), 16))
            i += 3
        elif ch.isascii() and ch.isprintable() and ch not in ' "<>\\^`{}#' and (ch != "|" or query):
            out.append(ord(ch))
            i += 1
        else:
            shown = "a character" if name in _SECRET_ATTRS else f"character {ch!r}"  # one of the PIN's
            raise KeyFormatError(_REASON, f"attribute {name!r}: {shown} must be percent-encoded")
    return bytes(out)


def _attributes(text: str, sep: str, known: frozenset[str], where: str) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    if not text:
        return found
    query = sep == "&"  # where the PIN is: an unencoded "&" in it starts what looks like another item
    for item in text.split(sep):
        name, eq, value = item.partition("=")
        if not eq or not name:
            shown = "" if query else f" {mask_pin_value(item)!r}"  # a query item may be part of the PIN
            raise KeyFormatError(_REASON, f"{where} attribute{shown} is not name=value")
        name = name.lower()
        if name.startswith("x-"):
            continue  # vendor-specific: RFC 7512 lets a consumer ignore what it does not know
        if name not in known:
            if query:  # not named: it may be the rest of a PIN (an unencoded "&", then "=")
                raise KeyFormatError(_REASON, f"unknown query attribute (known: {', '.join(sorted(known))})")
            raise KeyFormatError(_REASON, f"unknown {where} attribute {mask_pin_value(name)!r}")
        if name in found:
            raise KeyFormatError(_REASON, f"attribute {name!r} appears twice")
        found[name] = _unquote(value, name, query=query)
        if name not in _SECRET_ATTRS and name != "id":  # an id is shown in hex, never as text
            _refuse_misplaced(found[name].decode("latin-1"), name, where)
    return found


# what looks like a query attribute inside a value (decoded). A path value (a label) may hold no
# pin-value anywhere (as mask_pin_value sees one), nor a pin-source, module-path or module-name first
# or after a separator and then "=" or ":"; a query value (a file path, "?" allowed) none of them
# after "?", "&" or ";". So a parsed URI has nothing for _shown to hide.
_PIN_IN: Final = {
    "path": re.compile(r"(?i)pin[-_]?(value)[=:]?"),
    "query": re.compile(r"(?i)[?&;]\s*pin[-_]?(value)[=:]?"),
}
_OTHER_IN: Final = {
    "path": re.compile(r"(?i)(?<![a-z0-9])(?:pin[-_]?(source)|module[-_]?(path|name))\s*[=:]"),
    "query": re.compile(r"(?i)[?&;]\s*(?:pin[-_]?(source)|module[-_]?(path|name))\s*[=:]"),
}


def _refuse_misplaced(value: str, name: str, where: str) -> None:
    """Refuse a value that holds what looks like a query attribute; the value is never shown."""
    match = _PIN_IN[where].search(value) or _OTHER_IN[where].search(value)
    if match is None:
        return
    word = next(group for group in match.groups() if group).lower()
    found = ("module-" if word in ("path", "name") else "pin-") + word
    hint = f"query attributes go after '?', separated by '&' (pkcs11:...?{found}=...)"
    if word == "value":
        hint += "; better, keep the PIN out of the URI: signing.pkcs11.pin_env or pin_file"
    raise KeyFormatError(
        _REASON,
        f"{where} attribute {name!r}: its value holds what looks like query attribute {found!r} "
        f"(the value is not shown); {hint}",
    )


def _shown(value: str, where: str, safe: bytes | None = None) -> str:
    """``value`` for display (percent-encoded when ``safe`` is given), hidden from what looks like a
    pin-value on: a second line of defence for a ``Pkcs11Uri`` not made by ``parse_pkcs11_uri``."""
    match = _PIN_IN[where].search(value)
    kept = value if match is None else value[: match.end()]
    text = kept if safe is None else _quote(kept.encode(), safe)
    return text if match is None else text + NOT_SHOWN


def _text(raw: bytes | None, name: str) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyFormatError(_REASON, f"attribute {name!r} is not UTF-8") from None


# a pin-value's value, also in what is not quite one: "pin-value=", "pin_value=", "pin-value:", or
# the "=" forgotten ("pin-values3cr3t"), up to the one query separator, "&" (RFC 7512 section 2.3), or
# the end. Not ";" nor "?": _unquote takes both into a query value ("?" is pk11-query-res-avail), so
# "pin-value=AB;TAIL" is the PIN "AB;TAIL", and stopping there showed its tail; nor "#" or a space:
# a mistyped URI taken for a path keeps them in its PIN. So mask a value alone, never a message that
# quotes one (the mask would take the rest of the message): quote it masked.
_PIN_VALUE: Final = re.compile(r"(?i)(pin[-_]?value[=:]?)[^&]*")


def mask_pin_value(value: str) -> str:
    """``value`` (a ``signing.key`` setting, a URI, a path: one value, not a message quoting it)
    with any ``pin-value=...`` query attribute's value replaced, and what follows a mistyped one
    (``pin-value:``, ``pin_value=``, or no ``=`` at all) too, up to the next ``&`` or the end."""
    return _PIN_VALUE.sub(rf"\1{NOT_SHOWN}", value)


def parse_pkcs11_uri(value: str) -> Pkcs11Uri:
    """Parse ``value`` strictly; it must name a key object (``object`` or ``id``)."""
    if not isinstance(value, str) or not is_pkcs11_uri(value):
        raise KeyFormatError(_REASON, "a PKCS#11 URI starts with 'pkcs11:'")
    if len(value) > MAX_URI_CHARS:
        raise KeyFormatError(_REASON, f"longer than {MAX_URI_CHARS} characters")
    path, _, query = value[len(PKCS11_SCHEME) :].partition("?")
    attrs = _attributes(path, ";", _PATH_ATTRS, "path")
    queries = _attributes(query, "&", _QUERY_ATTRS, "query")
    kind = attrs.get("type")
    if kind is not None and kind != b"private":
        raise KeyFormatError(_REASON, f"type={kind.decode('latin-1')!r}: a signing key is type=private")
    if "object" not in attrs and "id" not in attrs:
        raise KeyFormatError(_REASON, "name the key with 'object' (its label) or 'id'")
    if "id" in attrs and not attrs["id"]:
        raise KeyFormatError(_REASON, "attribute 'id' is empty")
    if "pin-source" in queries and "pin-value" in queries:
        raise KeyFormatError(_REASON, "give either pin-source or pin-value, not both")
    return Pkcs11Uri(
        token=_text(attrs.get("token"), "token"),
        manufacturer=_text(attrs.get("manufacturer"), "manufacturer"),
        serial=_text(attrs.get("serial"), "serial"),
        model=_text(attrs.get("model"), "model"),
        object=_text(attrs.get("object"), "object"),
        id=attrs.get("id"),
        module_path=_text(queries.get("module-path"), "module-path"),
        pin_source=_text(queries.get("pin-source"), "pin-source"),
        pin_value=_text(queries.get("pin-value"), "pin-value"),
    )
