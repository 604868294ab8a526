"""What the core's shared caches hold stays small whatever strangers send.

The core keeps the parses and serializations the hot path repeats (a target URI, a component
identifier, an Inner List) for the next request. Each input below is a stranger's to choose and
fits in one request head (64 KiB by default); before these bounds, a few hundred such requests left
16 to 30 MiB held for as long as nothing evicted them.
"""

from __future__ import annotations

import pytest

from signing_proxy.core.errors import ProtocolError
from signing_proxy.core.fields import Fields
from signing_proxy.core.signature_components import signing_params_value
from signing_proxy.core.signatures import hop_components, parse_signature_stack
from signing_proxy.core.uri import parse_absolute_uri
from tests.memory import held_after

THUMBPRINT = "x" * 43


def test_long_component_identifiers_of_strangers_are_not_kept() -> None:
    with held_after() as held:
        for i in range(300):
            name = f"x{i:05d}" + "a" * 60_000
            fields = Fields([("Signature-Input", f'sig=("{name}");created=1'), ("Signature", "sig=:AAAA:")])
            [entry] = parse_signature_stack(fields)
            assert entry.components[0].name == name
    assert held.mib < 2.0  # 29.5 MiB when every identifier was kept


def test_short_component_identifiers_are_still_shared() -> None:
    fields = Fields(
        [("Signature-Input", 'sig=("@method" "content-digest");created=1'), ("Signature", "sig=:AAAA:")]
    )
    [first] = parse_signature_stack(fields)
    [again] = parse_signature_stack(fields.copy())
    assert [a is b for a, b in zip(first.components, again.components, strict=True)] == [True, True]


def test_a_relay_hop_over_long_previous_labels_keeps_no_inner_list() -> None:
    with held_after() as held:
        for i in range(100):
            label = f"l{i:05d}" + "b" * 60_000
            params = signing_params_value(hop_components(label), THUMBPRINT, 1, 2)
            assert params.startswith('("@method" ')
            assert label in params
    assert held.mib < 2.0  # 11 MiB when every Inner List was kept


def test_the_targets_of_long_uris_are_not_kept() -> None:
    with held_after() as held:
        for i in range(1100):
            target = parse_absolute_uri(f"https://origin.example/{i:05d}" + "c" * 8_000)
            assert target.path_query.startswith(f"/{i:05d}")
    assert held.mib < 3.0  # 16 MiB when every parse was kept
    short = "https://origin.example/short?q=1"
    assert parse_absolute_uri(short) is parse_absolute_uri(short)  # the common case is still kept


def test_a_malformed_uri_is_refused_the_same_whatever_its_length() -> None:
    for uri in ("ftp://origin.example/", "ftp://origin.example/" + "d" * 5_000):
        with pytest.raises(ProtocolError) as refused:
            parse_absolute_uri(uri)
        assert refused.value.reason == "unsupported-scheme"
