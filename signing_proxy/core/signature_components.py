"""RFC 9421 signature bases: component identifiers, component values and the ``@signature-params`` line.

This is the part of HTTP Message Signatures that signer and verifier share byte for byte. A
``Message`` (method as sent, canonical target, ordered field lines) yields one value per covered
``Component`` (derived ``@`` components from the target, fields as their combined lines, dictionary
members re-serialized strictly, RFC 9421 sections 2.1-2.2); ``signature_base`` joins them with the
``@signature-params`` Inner List (section 2.5). The spec ("Request signature") pins the covered set
to ``SPEC_COMPONENTS``, plus ``"signature";key=<previous label>`` for each later broker hop
(``hop_components``). Signing lives in ``signatures``, parsing and verifying a stack in
``signature_verify``; import the public names from ``signatures``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from .errors import FieldError, SigningError
from .fields import Fields
from .sfv import parse_dictionary, serialize_member
from .uri import Target, received_authority

__all__ = [
    "ALG_ED25519",
    "SPEC_COMPONENTS",
    "Component",
    "Dictionaries",
    "Message",
    "base_of",
    "check_components",
    "component_value",
    "hop_components",
    "parse_field_dictionary",
    "query_param",
    "received_component",
    "serialize_params_value",
    "serialize_sf_string",
    "signature_base",
    "signing_params_value",
]

ALG_ED25519 = "ed25519"  # RFC 9421 section 3.3.6; the spec's only algorithm
_SF_INT_MAX = 999_999_999_999_999  # RFC 8941 section 3.3.1: at most 15 digits


def serialize_sf_string(value: str) -> str:
    """RFC 8941 section 4.1.6 String: printable ASCII in double quotes, ``\\`` and ``"`` escaped."""
    if not (value.isascii() and value.isprintable()):  # exactly %x20-7E
        raise SigningError("non-ascii-component", "structured-field strings are printable ASCII only")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True, slots=True)
class Component:
    """A component identifier: a lower-case name, with a ``key`` parameter for dictionary members,
    or the ``name`` parameter of ``@query-param`` (``query_name``, percent-encoded as received)."""

    name: str
    key: str | None = None
    query_name: str | None = None
    serialized: str = field(init=False, repr=False, compare=False)  # computed once: the hot path reuses it
    is_derived: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        value = serialize_sf_string(self.name)
        if self.key is not None:
            value += f";key={serialize_sf_string(self.key)}"
        if self.query_name is not None:
            value += f";name={serialize_sf_string(self.query_name)}"
        object.__setattr__(self, "serialized", value)
        object.__setattr__(self, "is_derived", self.name.startswith("@"))


SPEC_COMPONENTS: tuple[Component, ...] = (
    Component("@method"),
    Component("@target-uri"),
    Component("content-digest"),
    Component("authorization"),
    Component("signature-agent"),
)


_SPEC_INNER = "(" + " ".join(c.serialized for c in SPEC_COMPONENTS) + ")"


def hop_components(previous_label: str | None) -> tuple[Component, ...]:
    """The spec's covered set for a label: the five, plus the predecessor's signature for a later hop."""
    if previous_label is None:
        return SPEC_COMPONENTS
    return (*SPEC_COMPONENTS, Component("signature", key=previous_label))


def received_component(name: str, params: Mapping[str, object]) -> Component | None:
    """The identifier a stranger's Signature-Input names; None for parameters we do not support (we
    take ``key``, a String, on a field, and ``name``, a String, on ``@query-param``, which needs it).
    The same few come on every request: built (and serialized) once and shared, being immutable; but
    only short ones (every identifier a profile covers is), or 256 names of 60 KiB would stay held,
    about 30 MiB, until others evict them."""
    key, query_name = params.get("key"), params.get("name")
    if (
        not params.keys() <= {"key", "name"}
        or not (key is None or key.__class__ is str)  # a Token or Byte Sequence is no String
        or not (query_name is None or query_name.__class__ is str)
        or (query_name is not None) is not (name == "@query-param")
        or (key is not None and name.startswith("@"))
    ):
        return None
    assert key is None or isinstance(key, str)  # for mypy: checked above
    assert query_name is None or isinstance(query_name, str)
    if len(name) + len(key or query_name or "") <= _SHARED_IDENTIFIER_CHARS:
        return _shared_component(name, key, query_name)
    return Component(str(name), key and str(key), query_name and str(query_name))


_SHARED_IDENTIFIER_CHARS = 64  # our choice: "signature-agent" is 15; a hop's label, a few more


@lru_cache(maxsize=256)
def _shared_component(name: str, key: str | None, query_name: str | None) -> Component:
    return Component(str(name), key and str(key), query_name and str(query_name))


def _sf_int(value: int) -> str:
    if not -_SF_INT_MAX <= value <= _SF_INT_MAX:
        raise SigningError("bad-signature-parameter", "integer out of structured-field range")
    return str(value)


def _serialize_param(value: str | int) -> str:
    if isinstance(value, bool):
        raise SigningError("bad-signature-parameter", "boolean signature parameters are not used")
    if isinstance(value, int):
        return _sf_int(value)
    return serialize_sf_string(value)


def serialize_params_value(components: Sequence[Component], params: Sequence[tuple[str, str | int]]) -> str:
    """The Inner List that is both the ``@signature-params`` value and the Signature-Input member."""
    return _inner_list(tuple(components)) + "".join(
        f";{name}={_serialize_param(value)}" for name, value in params
    )


def signing_params_value(
    components: Sequence[Component],
    thumbprint: str,
    created: int,
    expires: int,
    extra_params: Sequence[tuple[str, str | int]] = (),
) -> str:
    """The params value in the spec's order ``keyid``, ``alg``, ``created``, ``expires`` (then extras).

    ``thumbprint`` is an RFC 7638 thumbprint: base64url, so the hot path writes it without escaping.
    """
    if extra_params:
        params: list[tuple[str, str | int]] = [
            ("keyid", thumbprint),
            ("alg", ALG_ED25519),
            ("created", created),
            ("expires", expires),
            *extra_params,
        ]
        return serialize_params_value(components, params)
    # The spec's shape, on the hot path: no per-parameter dispatch, the spec's Inner List precomputed.
    inner = _SPEC_INNER if components is SPEC_COMPONENTS else _inner_list(tuple(components))
    return (
        f'{inner};keyid="{thumbprint}";alg="{ALG_ED25519}"'
        f";created={_sf_int(created)};expires={_sf_int(expires)}"
    )


def _inner_list(components: tuple[Component, ...]) -> str:
    """The components' Inner List, kept for the next signature of that shape when it is short: a
    relay's hop covers ``"signature";key=`` the previous label, which a stranger chooses."""
    inner = _INNER_LISTS.get(components)
    if inner is None:
        inner = "(" + " ".join(c.serialized for c in components) + ")"
        if len(inner) <= _SHARED_INNER_CHARS:
            if len(_INNER_LISTS) >= _SHARED_INNER_LISTS:  # the few shapes in use come back at once
                _INNER_LISTS.clear()
            _INNER_LISTS[components] = inner
    return inner


_INNER_LISTS: dict[tuple[Component, ...], str] = {}
_SHARED_INNER_LISTS = 64
_SHARED_INNER_CHARS = 512  # our choice: the spec's Inner List is 79 characters


@dataclass(slots=True)
class Message:
    """What a signature base is built from: the method as sent, the target, the field lines.

    ``@target-uri`` is the target's URI as received when it carries one (``Target.received``: RFC
    9421 section 2.2.2, the target URI "assembled from" the authority and target as they arrived,
    RFC 9112 section 3.3), not a normal form of it; else its canonical URI, which is what the
    agent's signer sends."""

    method: str
    target: Target
    fields: Fields
    _dict_cache: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict, repr=False)

    def dictionary(self, name: str) -> dict[str, Any]:
        """The combined field parsed as an RFC 8941 Dictionary (cached while the field is unchanged);
        SigningError, as every other covered value that cannot be read, when it is none."""
        value = self.fields.combined(name)
        if value is None:
            raise SigningError("missing-covered-header", f"covered field {name!r} is absent")
        cached = self._dict_cache.get(name)
        if cached is None or cached[0] != value:
            try:
                cached = (value, parse_field_dictionary(value, name))
            except FieldError as exc:
                raise SigningError(exc.reason, exc.detail) from None
            self._dict_cache[name] = cached
        return cached[1]


def parse_field_dictionary(value: str, name: str) -> dict[str, Any]:
    """Field ``name``'s combined value as an RFC 8941 Dictionary; a repeated member key is refused."""

    def refuse_duplicate(key: str, _where: str) -> None:
        raise FieldError("duplicate-label", f"{name} has member {key!r} more than once")

    try:
        return parse_dictionary(value, refuse_duplicate)
    except FieldError:
        raise
    except (ValueError, UnicodeEncodeError) as exc:
        raise FieldError(f"malformed-{name.lower()}", f"{name} is not a structured Dictionary") from exc


Dictionaries = dict[str, dict[str, Any]]
"""One message's Dictionary fields, by component name, parsed as first read (``component_value``):
a verifier builds a base per label from the same fields, and each later label covers the one before
it in ``Signature``. The combined field is then joined and parsed once per message, not per label."""


def component_value(message: Message, component: Component, dictionaries: Dictionaries | None = None) -> str:
    """The value of one covered component (RFC 9421 sections 2.1, 2.1.2 and 2.2); a dictionary
    member's field is read through ``dictionaries`` when given (the fields unchanged meanwhile)."""
    name = component.name
    if component.is_derived:
        if component.key is not None:
            raise SigningError("bad-component", f"{name} takes no key parameter")
        target = message.target
        if name == "@method":
            return message.method  # as sent, case-sensitive (RFC 9421 section 2.2.1)
        if name == "@target-uri":
            return target.wire_uri
        if name == "@authority":  # as received, normalized only as section 2.2.3 says
            return received_authority(target)
        if name == "@scheme":
            return target.scheme
        if name == "@path":
            return target.path
        if name == "@query":
            return target.query
        if name == "@request-target":  # the origin-form target as it travels (Target.wire_parts):
            return target.wire_parts()[1]  # what an origin receives, whatever form reached a relay
        if name == "@query-param" and component.query_name is not None:
            return query_param(target.query, component.query_name)
        raise SigningError("unsupported-component", f"derived component {name} is not supported")
    if component.key is None:
        value = message.fields.combined(name)
        if value is None:  # absent is never empty (spec, "Request signature" rule 4)
            raise SigningError("missing-covered-header", f"covered field {name!r} is absent")
        return value
    members = None if dictionaries is None else dictionaries.get(name)
    if members is None:
        members = message.dictionary(name)
        if dictionaries is not None:
            dictionaries[name] = members
    if component.key not in members:
        raise SigningError("missing-dictionary-member", f"{name} has no member {component.key!r}")
    member = members[component.key]
    return serialize_member(member)  # strict re-serialization (RFC 9421 section 2.1.2)


def query_param(query: str, name: str) -> str:
    """RFC 9421 section 2.2.8: the value of the one query parameter named ``name`` in ``query`` (the
    ``@query`` value): the query parsed as application/x-www-form-urlencoded (``&``-separated, ``+``
    a space, then percent-decoded as UTF-8), each name and value percent-encoded again with the HTML
    form set, a space as ``%20``. ``name`` is compared so encoded (the identifier carries it encoded).
    None, or more than one ("the named query parameter MUST NOT be included"), is refused."""
    values = _query_values(query[1:]).get(name, ())
    if len(values) == 1:
        return values[0]
    if values:
        raise SigningError("ambiguous-query-param", f"the query has parameter {name!r} more than once")
    raise SigningError("missing-query-param", f"the query has no parameter {name!r}")


@lru_cache(maxsize=4)
def _query_values(query: str) -> dict[str, tuple[str, ...]]:
    """Each encoded name's encoded values, the query parsed once for all the components of a message
    (and the labels of a stack): per component, a stranger's thousands of names times thousands of
    pairs held the loop for seconds. Shared: never changed once made."""
    values: dict[str, list[str]] = {}
    for part in query.split("&"):
        if part:
            key, _, value = part.partition("=")
            values.setdefault(_form_encoded(key), []).append(_form_encoded(value))
    return {name: tuple(found) for name, found in values.items()}


def _form_encoded(raw: str) -> str:
    """A form name or value decoded (``+`` a space, ``%XX`` bytes, UTF-8 with U+FFFD for what is not)
    and encoded again: only ASCII letters, digits and ``*-._`` stay as they are."""
    text = unquote_to_bytes(raw.replace("+", " ")).decode("utf-8", "replace")
    return quote(text, safe="*").replace("~", "%7E")  # quote keeps ~, which the form set encodes


def signature_base(
    message: Message,
    components: Sequence[Component],
    params_value: str,
    dictionaries: Dictionaries | None = None,
) -> bytes:
    """RFC 9421 section 2.5: one line per component, then ``@signature-params``; LF, no trailing LF."""
    values = [component_value(message, c, dictionaries) for c in components]
    return base_of(components, values, params_value)


def check_components(
    message: Message, components: Sequence[Component], dictionaries: Dictionaries | None = None
) -> None:
    """Refuse what ``signature_base`` would refuse in these components (absent, no such member, not
    ASCII on one line) without building a base: a verifier's check before it fetches any key."""
    values = [component_value(message, c, dictionaries) for c in components]
    if not all(value.isascii() and "\n" not in value for value in values):
        raise SigningError("non-ascii-component", "a covered value is not ASCII or spans lines")


def base_of(components: Sequence[Component], values: Sequence[str], params_value: str) -> bytes:
    """``signature_base`` from the components' values, already known (the signer set them)."""
    lines = [f"{c.serialized}: {value}" for c, value in zip(components, values, strict=True)]
    lines.append(f'"@signature-params": {params_value}')
    base = "\n".join(lines)
    if not base.isascii() or base.count("\n") != len(components):
        raise SigningError("non-ascii-component", "a covered value is not ASCII or spans lines")
    return base.encode("ascii")
