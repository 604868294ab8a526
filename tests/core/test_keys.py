"""Key directory, key windows, revocation list and signing-key choice (spec "Key directory",
"States and transitions", "Key lookup", "Key publication, rotation and revocation", "Limits")."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from signing_proxy.core.b64 import b64url_decode
from signing_proxy.core.errors import KeyFormatError
from signing_proxy.core.jwk import PublicKey, SigningKey
from signing_proxy.core.keys import (
    DIRECTORY_MEDIA_TYPE,
    DIRECTORY_PATH,
    REVOCATION_POLL_INTERVAL_S,
    REVOCATION_POLL_JITTER,
    Directory,
    DirectoryKey,
    KeyRecord,
    RevocationList,
    all_thumbprints,
    choose_signing_key,
    format_rfc3339,
    is_thumbprint,
    key_state,
    merge_revocation_lists,
    next_poll_delay,
    parse_directory,
    parse_directory_key,
    parse_revocation_list,
    parse_rfc3339,
    publishable,
    render_directory,
    render_revocation_list,
)
from tests.conftest import VECTORS

# RFC 8037 appendix A.1 public key and its RFC 7638 thumbprint (spec-notes section 4).
X_A1 = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
KID_A1 = "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
# RFC 9421 appendix B.1.4 test key.
X_B14 = "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"
KID_B14 = "poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U"

T0 = 1_795_251_600  # 2026-11-21T09:00:00Z
HOUR = 3600
DAY = 86_400


def pub(x: str = X_A1) -> PublicKey:
    return PublicKey.from_raw(b64url_decode(x))


def dkey(x: str = X_A1, nb: int = T0, na: int = T0 + DAY) -> DirectoryKey:
    return DirectoryKey(pub(x), nb, na)


def entry(x: object = X_A1, **over: object) -> dict[str, object]:
    jwk: dict[str, object] = {
        "kty": "OKP",
        "crv": "Ed25519",
        "use": "sig",
        "alg": "EdDSA",
        "x": x,
        "not_before": "2026-11-21T09:00:00Z",
        "not_after": "2026-11-22T09:00:00Z",
    }
    jwk.update(over)
    return {k: v for k, v in jwk.items() if v is not None}


def doc(*entries: dict[str, object], **top: object) -> bytes:
    return json.dumps({"keys": list(entries), **top}).encode()


def reason_of(exc: pytest.ExceptionInfo[KeyFormatError]) -> str:
    return exc.value.reason


# ------------------------------------------------------------------ RFC 3339


def test_rfc3339_format_is_utc_z_whole_seconds() -> None:
    assert format_rfc3339(T0) == "2026-11-21T09:00:00Z"
    assert format_rfc3339(T0 + 0.9) == "2026-11-21T09:00:00Z"
    assert format_rfc3339(-62_135_596_800) == "0001-01-01T00:00:00Z"


def test_rfc3339_parse_accepts_z_offsets_fractions_and_lowercase() -> None:
    assert parse_rfc3339("2026-11-21T09:00:00Z") == T0
    assert parse_rfc3339("2026-11-21t09:00:00z") == T0
    assert parse_rfc3339("2026-11-21T11:00:00+02:00") == T0
    assert parse_rfc3339("2026-11-21T04:30:00-04:30") == T0
    assert parse_rfc3339("2026-11-21T09:00:00-00:00") == T0
    assert parse_rfc3339("2026-11-21T09:00:00.999999999Z") == T0
    assert parse_rfc3339("2026-11-21T09:00:00.25Z", round_up=True) == T0 + 1
    assert parse_rfc3339("2026-11-21T09:00:00.000Z", round_up=True) == T0


def test_rfc3339_leap_second_counts_as_next_second() -> None:
    assert parse_rfc3339("2016-12-31T23:59:60Z") == parse_rfc3339("2017-01-01T00:00:00Z")


@pytest.mark.parametrize(
    "value",
    [
        "2026-11-21T09:00:00",  # naive
        "2026-11-21 09:00:00Z",  # space separator
        "2026-11-21",
        "2026-02-30T00:00:00Z",
        "2026-11-21T24:00:00Z",
        "2026-11-21T09:00:00+24:00",
        "2026-11-21T09:00:00+0200",
        "2026-11-21T09:00Z",
        "\uff12026-11-21T09:00:00Z",  # non-ASCII digit
        " 2026-11-21T09:00:00Z",
        "",
        "2026-11-21T09:00:00." + "0" * 80 + "Z",
        T0,
        None,
    ],
)
def test_rfc3339_parse_refuses_naive_and_malformed(value: object) -> None:
    with pytest.raises(KeyFormatError) as exc:
        parse_rfc3339(value)
    assert reason_of(exc) == "malformed-timestamp"


# ------------------------------------------------------------------ windows (spec: States and transitions)


def test_window_not_before_exactly_is_valid() -> None:
    assert dkey(nb=T0, na=T0 + HOUR).valid_at(T0)


def test_window_one_second_before_not_before_is_refused() -> None:
    assert not dkey(nb=T0, na=T0 + HOUR).valid_at(T0 - 1)


def test_window_not_after_exactly_is_refused() -> None:
    key = dkey(nb=T0, na=T0 + HOUR)
    assert not key.valid_at(T0 + HOUR)
    assert key.valid_at(T0 + HOUR - 1)
    assert key.valid_at(T0 + HOUR - 0.001)


@pytest.mark.parametrize("na", [T0, T0 - 1])
def test_window_must_not_be_empty(na: int) -> None:
    with pytest.raises(KeyFormatError) as exc:
        DirectoryKey(pub(), T0, na)
    assert reason_of(exc) == "bad-key-window"


def test_key_lookup_find_requires_window_and_lookup_ignores_it() -> None:
    directory = Directory((dkey(nb=T0, na=T0 + HOUR),))
    assert directory.find(KID_A1, T0) is not None
    assert directory.find(KID_A1, T0 + HOUR) is None
    assert directory.find(KID_A1, T0 - 1) is None
    assert directory.lookup(KID_A1) is not None
    assert directory.find(KID_B14, T0) is None
    assert directory.lookup(KID_B14) is None


def test_key_lookup_find_skips_revoked_thumbprints() -> None:
    directory = Directory((dkey(),))
    assert directory.find(KID_A1, T0, revoked=frozenset({KID_A1})) is None


def test_keys_valid_at_lists_current_keys_only() -> None:
    old = dkey(X_A1, T0 - DAY, T0 + HOUR)
    new = dkey(X_B14, T0 + HOUR, T0 + DAY)
    directory = Directory((old, new))
    assert directory.keys_valid_at(T0) == (old,)
    assert directory.keys_valid_at(T0 + HOUR) == (new,)


def test_directory_key_thumbprint_is_rfc7638() -> None:
    assert dkey(X_A1).thumbprint == KID_A1
    assert dkey(X_B14).thumbprint == KID_B14


# ------------------------------------------------------------------ render (spec: Key directory)


def test_directory_constants() -> None:
    assert DIRECTORY_PATH == "/.well-known/http-message-signatures-directory"
    assert DIRECTORY_MEDIA_TYPE == "application/jwk-set+json"


def test_render_directory_exact_bytes() -> None:
    directory = Directory((dkey(),), "https://agent.example/revoked.json")
    assert render_directory(directory) == (
        b'{"keys":[{"kty":"OKP","crv":"Ed25519","use":"sig","alg":"EdDSA",'
        b'"x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo",'
        b'"not_before":"2026-11-21T09:00:00Z","not_after":"2026-11-22T09:00:00Z"}],'
        b'"revocation_url":"https://agent.example/revoked.json"}'
    )


def test_render_directory_has_exactly_the_spec_members_and_no_kid_or_private() -> None:
    signing = SigningKey.generate()
    directory = Directory((DirectoryKey(signing.public, T0, T0 + DAY),))
    body = json.loads(render_directory(directory))
    assert list(body) == ["keys"]  # revocation_url omitted when unset
    (jwk,) = body["keys"]
    assert list(jwk) == ["kty", "crv", "use", "alg", "x", "not_before", "not_after"]
    assert "kid" not in jwk
    assert "d" not in jwk


def test_render_directory_is_deterministic() -> None:
    directory = Directory((dkey(X_A1), dkey(X_B14, T0 + HOUR, T0 + 2 * DAY)))
    assert render_directory(directory) == render_directory(Directory(directory.keys))


def test_render_directory_with_now_requires_a_valid_key() -> None:
    """spec "Key lookup" 2: at least one key in a served directory MUST be valid at serve time."""
    directory = Directory((dkey(nb=T0, na=T0 + HOUR),))
    assert render_directory(directory, now=T0)
    with pytest.raises(KeyFormatError) as exc:
        render_directory(directory, now=T0 + HOUR)
    assert reason_of(exc) == "no-valid-key"


def test_directory_refuses_duplicate_thumbprints_at_construction() -> None:
    with pytest.raises(KeyFormatError) as exc:
        Directory((dkey(), dkey(nb=T0 + DAY, na=T0 + 2 * DAY)))
    assert reason_of(exc) == "duplicate-key"


# ------------------------------------------------------------------ parse (spec: Key directory)


def test_render_parse_round_trip() -> None:
    directory = Directory(
        (dkey(X_A1), dkey(X_B14, T0 + HOUR, T0 + 2 * DAY)), "https://agent.example/revoked.json"
    )
    assert parse_directory(render_directory(directory)) == directory


def test_parse_tolerates_unknown_members_and_missing_use_alg() -> None:
    body = doc(entry(use=None, alg=None, ext_note="x"), entry(X_B14, kid=KID_B14), other="y")
    directory = parse_directory(body)
    assert [k.thumbprint for k in directory.keys] == [KID_A1, KID_B14]
    assert directory.revocation_url is None


@pytest.mark.parametrize("alg", ["EdDSA", "Ed25519", "ed25519"])
def test_parse_accepts_ed25519_alg_spellings(alg: str) -> None:
    assert parse_directory(doc(entry(alg=alg))).keys[0].thumbprint == KID_A1


def test_parse_accepts_empty_key_set() -> None:
    assert parse_directory(b'{"keys":[]}').keys == ()


def test_parse_window_with_offsets_and_fractions() -> None:
    body = doc(entry(not_before="2026-11-21T10:00:00.5+01:00", not_after="2026-11-22T09:00:00.5Z"))
    (key,) = parse_directory(body).keys
    assert key.not_before == T0 + 1  # rounded up: never valid earlier than published
    assert key.not_after == T0 + DAY  # rounded down: never valid later than published


@pytest.mark.parametrize("member", ["d", "p", "k"])
def test_parse_refuses_private_members_for_the_whole_document(member: str) -> None:
    body = doc(entry(X_B14), entry(**{member: "AAAA"}))
    with pytest.raises(KeyFormatError) as exc:
        parse_directory(body)
    assert reason_of(exc) == "private-member-in-directory"


def test_parse_reports_private_member_before_an_earlier_broken_entry() -> None:
    body = doc(entry(x="broken"), entry(X_B14, d="AAAA"))
    with pytest.raises(KeyFormatError) as exc:
        parse_directory(body)
    assert reason_of(exc) == "private-member-in-directory"


@pytest.mark.parametrize(
    "x",
    [
        X_A1[:-1] + "p",  # same 32 bytes, non-zero padding bits: a second spelling
        X_A1 + "=",
        X_A1[:-2],
        "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo",  # standard alphabet
        7,
    ],
)
def test_parse_refuses_non_canonical_x(x: object) -> None:
    with pytest.raises(KeyFormatError) as exc:
        parse_directory(doc(entry(x=x)))
    assert reason_of(exc) == "malformed-jwk"


def test_parse_refuses_duplicate_thumbprints() -> None:
    body = doc(entry(), entry(not_before="2026-11-23T09:00:00Z", not_after="2026-11-24T09:00:00Z"))
    with pytest.raises(KeyFormatError) as exc:
        parse_directory(body)
    assert reason_of(exc) == "duplicate-key"


@pytest.mark.parametrize(
    "over",
    [
        {"not_before": "2026-11-21T09:00:00"},
        {"not_after": "21 Nov 2026 09:00:00 GMT"},
        {"not_before": T0},
    ],
)
def test_parse_refuses_bad_rfc3339(over: dict[str, object]) -> None:
    with pytest.raises(KeyFormatError) as exc:
        parse_directory(doc(entry(**over)))
    assert reason_of(exc) == "malformed-timestamp"


@pytest.mark.parametrize("member", ["not_before", "not_after"])
def test_parse_refuses_missing_window_member(member: str) -> None:
    with pytest.raises(KeyFormatError) as exc:
        parse_directory(doc(entry(**{member: None})))
    assert reason_of(exc) == "missing-key-window"


def test_the_drafts_signed_directory_vector_parses_as_web_keys() -> None:
    """protocol-02's directory (``kid``, ``use``, no window at all): refused whole before
    (``missing-key-window``). Its key counts for web-bot-auth labels only."""
    vectors = json.loads((VECTORS / "web_bot_auth_drafts_ed25519.json").read_text())["vectors"]
    (body,) = [v["response_body"] for v in vectors if "response_body" in v]
    directory = parse_directory(body.encode())
    (key,) = directory.web_keys
    assert directory.keys == ()
    assert (key.drafts, key.not_before, key.not_after) == (True, 0, 2**62)
    assert directory.lookup(key.thumbprint) is None  # the spec selects a key by its window
    assert directory.lookup(key.thumbprint, web=True) is key


def test_a_keys_form_decides_its_place_in_a_directory() -> None:
    """One flag, ``DirectoryKey.drafts``: ``Directory.of`` sorts a list by it, and a directory that
    puts a key where its flag does not is refused (it would be looked up under the other rules)."""
    spec = DirectoryKey(SigningKey.generate().public, 0, 10)
    drafts = DirectoryKey(SigningKey.generate().public, 0, 2**62, drafts=True)
    directory = Directory.of([drafts, spec], "https://agent.example/revoked")
    assert (directory.keys, directory.web_keys) == ((spec,), (drafts,))
    assert directory.revocation_url == "https://agent.example/revoked"
    for keys, web_keys in (((drafts,), ()), ((), (spec,))):
        with pytest.raises(ValueError, match="drafts"):
            Directory(keys, None, web_keys)


def test_a_drafts_key_takes_its_window_from_nbf_and_exp() -> None:
    jwk = {"kty": "OKP", "crv": "Ed25519", "x": X_A1, "kid": KID_A1, "nbf": T0 + 0.5, "exp": T0 + DAY + 0.5}
    (key,) = parse_directory(doc(jwk)).web_keys
    assert (key.not_before, key.not_after) == (T0 + 1, T0 + DAY)  # rounded inward, as RFC 3339 ones


@pytest.mark.parametrize(
    "window", [{"nbf": "2026-11-21"}, {"exp": True}, {"exp": -1}, {"nbf": 10, "exp": 10}]
)
def test_a_drafts_key_with_a_bad_nbf_or_exp_refuses_the_directory(window: dict[str, object]) -> None:
    jwk = {"kty": "OKP", "crv": "Ed25519", "x": X_A1, **window}
    with pytest.raises(KeyFormatError) as exc:
        parse_directory(doc(jwk))
    assert reason_of(exc) == "bad-key-window"


@pytest.mark.parametrize("not_after", ["2026-11-21T09:00:00Z", "2026-11-20T09:00:00Z"])
def test_parse_refuses_not_before_at_or_after_not_after(not_after: str) -> None:
    with pytest.raises(KeyFormatError) as exc:
        parse_directory(doc(entry(not_after=not_after)))
    assert reason_of(exc) == "bad-key-window"


def test_parse_refuses_too_many_keys() -> None:
    keys = [entry(SigningKey.from_seed(bytes([i]) * 32).public.jwk()["x"]) for i in range(3)]
    assert len(parse_directory(doc(*keys), max_keys=3).keys) == 3
    with pytest.raises(KeyFormatError) as exc:
        parse_directory(doc(*keys), max_keys=2)
    assert reason_of(exc) == "too-many-keys"


def test_parse_refuses_oversized_body() -> None:
    with pytest.raises(KeyFormatError) as exc:
        parse_directory(doc(entry()), max_bytes=50)
    assert reason_of(exc) == "directory-too-large"


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({"kid": KID_B14}, "kid-mismatch"),
        ({"use": "enc"}, "unsupported-key-use"),
        ({"alg": "RS256"}, "unsupported-key-alg"),
        ({"alg": "none"}, "unsupported-key-alg"),
        ({"kty": "EC"}, "unsupported-key-type"),
        ({"crv": "Ed448"}, "unsupported-key-type"),
    ],
)
def test_parse_refuses_wrong_key_members(over: dict[str, object], reason: str) -> None:
    with pytest.raises(KeyFormatError) as exc:
        parse_directory(doc(entry(**over)))
    assert reason_of(exc) == reason


# RFC 9421 appendix B.1.3 test-key-ecc-p256 and B.1.1 test-key-rsa (n shortened: never decoded).
P256: dict[str, object] = {
    "kty": "EC",
    "crv": "P-256",
    "x": "qIVYZVLCrPZHGHjP17CTW0_-D9Lfw0EkjqF7xB4FivA",
    "y": "Mc4nN9LTDOBhfoUeg8Ye9WedFRhnZXZJA12Qp0zZ6F0",
    "use": "sig",
}
RSA: dict[str, object] = {
    "kty": "RSA",
    "n": "hAKYdtoeoy8zcAcR874L8cnZxKzAGwd7v36APp7Pv6Q2jdsPBRrw",
    "e": "AQAB",
    "alg": "PS512",
}


def test_a_drafts_directory_ignores_key_types_it_does_not_implement() -> None:
    """RFC 7517 section 5: "Implementations SHOULD ignore JWKs within a JWK Set that use "kty" (key
    type) values that are not understood by them". An agent publishing Ed25519 beside P-256 (RSA, an
    OKP curve other than Ed25519) was refused whole: none of its keys could verify."""
    ed25519: dict[str, object] = {"kty": "OKP", "crv": "Ed25519", "kid": KID_B14, "x": X_B14, "use": "sig"}
    others: list[dict[str, object]] = [
        P256,
        RSA,
        {"kty": "OKP", "crv": "X25519", "x": X_A1},
        {"kty": "oct", "alg": "HS256"},
    ]
    for listed in ([ed25519, P256], [*others, ed25519]):
        directory = parse_directory(doc(*listed))
        assert [key.thumbprint for key in directory.web_keys] == [KID_B14]
        assert directory.keys == ()
    assert parse_directory(doc(P256)).web_keys == ()  # nothing usable: as an empty key set
    with pytest.raises(KeyFormatError) as exc:  # a skipped key still counts against the bound
        parse_directory(doc(ed25519, P256), max_keys=1)
    assert reason_of(exc) == "too-many-keys"


@pytest.mark.parametrize(
    ("listed", "reason"),
    [
        ({**P256, "d": "ff83VdLpRw6-AuNw12j-xOhYsvuoDRUnNmHqX3m-Mkk"}, "private-member-in-directory"),
        ({**RSA, "p": "AQAB"}, "private-member-in-directory"),
        ({"kty": "oct", "k": "c2VjcmV0"}, "private-member-in-directory"),
        ({"kty": "OKP", "crv": "Ed25519", "x": X_A1[:-1]}, "malformed-jwk"),  # a malformed Ed25519 key
        ({"kty": "OKP", "x": X_A1}, "unsupported-key-type"),  # an OKP key names its curve
        ({"crv": "P-256", "x": X_A1}, "unsupported-key-type"),  # kty is required (RFC 7517 4.1)
        ({"kty": 5, "x": X_A1}, "unsupported-key-type"),
        (
            {**P256, "not_before": "2026-11-21T09:00:00Z", "not_after": "2026-11-22T09:00:00Z"},
            "unsupported-key-type",
        ),
        ({**P256, "not_after": "2026-11-22T09:00:00Z"}, "unsupported-key-type"),  # the spec's form: strict
    ],
)
def test_a_directory_still_refuses_leaked_malformed_or_spec_form_foreign_keys(
    listed: dict[str, object], reason: str
) -> None:
    """Only the drafts' form skips: a private member anywhere, a malformed Ed25519 key, and a key of
    another type in the spec's form (the spec's keys are OKP/Ed25519) refuse the whole document."""
    for body in (doc(entry(), listed), doc(listed, entry())):
        with pytest.raises(KeyFormatError) as exc:
            parse_directory(body)
        assert reason_of(exc) == reason


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b"{}",
        b'{"keys":{}}',
        b'{"keys":[1]}',
        b'{"keys":[],"keys":[]}',  # duplicate member
        b'{"keys":[{"kty":"OKP","kty":"OKP"}]}',
        b'{"keys":[],"n":NaN}',
        b"\xff\xfe{}",
        "\ufeff{}".encode(),
    ],
)
def test_parse_refuses_malformed_documents(body: bytes) -> None:
    with pytest.raises(KeyFormatError) as exc:
        parse_directory(body)
    assert reason_of(exc) == "malformed-directory"


@pytest.mark.parametrize("url", ["/revoked.json", "ftp://agent.example/r", 5, "https://"])
def test_parse_refuses_bad_revocation_url(url: object) -> None:
    with pytest.raises(KeyFormatError) as exc:
        parse_directory(doc(entry(), revocation_url=url))
    assert reason_of(exc) == "bad-revocation-url"


@pytest.mark.parametrize("url", ["", None])
def test_parse_treats_empty_revocation_url_as_unset(url: object) -> None:
    assert parse_directory(doc(entry(), revocation_url=url)).revocation_url is None


def test_parse_directory_key_reports_the_entry_index() -> None:
    with pytest.raises(KeyFormatError) as exc:
        parse_directory(doc(entry(X_B14), entry(use="enc")))
    assert "keys[1]" in exc.value.detail
    assert parse_directory_key(entry()).thumbprint == KID_A1


# ------------------------------------------------------------------ revocation list


def test_revocation_list_render_exact_bytes_sorted() -> None:
    rl = RevocationList(T0, frozenset({KID_B14, KID_A1}))
    assert render_revocation_list(rl) == (
        b'{"as_of":"2026-11-21T09:00:00Z","revoked":["' + KID_A1.encode() + b'","' + KID_B14.encode() + b'"]}'
    )


def test_revocation_list_round_trip() -> None:
    rl = RevocationList(T0, frozenset({KID_A1, KID_B14}))
    assert parse_revocation_list(render_revocation_list(rl)) == rl
    assert rl.is_revoked(KID_A1)
    empty = RevocationList(T0)
    assert parse_revocation_list(render_revocation_list(empty)) == empty


def test_revocation_list_absent_revoked_is_empty_and_unknown_members_tolerated() -> None:
    rl = parse_revocation_list(b'{"as_of":"2026-11-21T09:00:00Z","note":"x"}')
    assert rl == RevocationList(T0, frozenset())


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"revoked":[]}', "malformed-revocation-list"),
        (b'{"as_of":"2026-11-21","revoked":[]}', "malformed-timestamp"),
        (
            b'{"as_of":"2026-11-21T09:00:00Z","revoked":"' + KID_A1.encode() + b'"}',
            "malformed-revocation-list",
        ),
        (
            b'{"as_of":"2026-11-21T09:00:00Z","revoked":["' + KID_A1[:-1].encode() + b'"]}',
            "malformed-thumbprint",
        ),
        (b'{"as_of":"2026-11-21T09:00:00Z","revoked":["' + KID_A1.encode() + b'="]}', "malformed-thumbprint"),
        (b'{"as_of":"2026-11-21T09:00:00Z","revoked":["' + b"A" * 42 + b'B"]}', "malformed-thumbprint"),
        (b'{"as_of":"2026-11-21T09:00:00Z","revoked":["' + b"+" * 43 + b'"]}', "malformed-thumbprint"),
        (b'{"as_of":"2026-11-21T09:00:00Z","revoked":[7]}', "malformed-thumbprint"),
        (b"[]", "malformed-revocation-list"),
        (b"{", "malformed-revocation-list"),
    ],
)
def test_revocation_list_parse_is_strict(body: bytes, reason: str) -> None:
    with pytest.raises(KeyFormatError) as exc:
        parse_revocation_list(body)
    assert reason_of(exc) == reason


def test_revocation_list_entry_limit() -> None:
    body = render_revocation_list(RevocationList(T0, frozenset({KID_A1, KID_B14})))
    with pytest.raises(KeyFormatError) as exc:
        parse_revocation_list(body, max_entries=1)
    assert reason_of(exc) == "revocation-list-too-large"


def test_revocation_list_refuses_bad_thumbprint_at_construction() -> None:
    with pytest.raises(KeyFormatError) as exc:
        RevocationList(T0, frozenset({"not-a-thumbprint"}))
    assert reason_of(exc) == "malformed-thumbprint"
    assert is_thumbprint(KID_A1)
    assert not is_thumbprint(KID_A1[:-1] + "V")  # non-zero padding bits


def test_revoked_thumbprint_stays_revoked_across_snapshots() -> None:
    """spec "States and transitions": a revoked thumbprint stays revoked."""
    first = RevocationList(T0, frozenset({KID_A1}))
    second = RevocationList(T0 + 300, frozenset({KID_B14}))
    merged = merge_revocation_lists(first, second)
    assert merged == RevocationList(T0 + 300, frozenset({KID_A1, KID_B14}))
    assert merge_revocation_lists(None, first) == first


def test_an_older_revocation_snapshot_still_revokes_what_it_names() -> None:
    """It was set aside whole: one list dated a second early (a lagging replica) and every later
    revocation from that directory was ignored until a restart."""
    current = RevocationList(T0 + 300, frozenset({KID_A1}))
    stale = RevocationList(T0, frozenset({KID_A1, KID_B14}))
    assert merge_revocation_lists(current, stale) == RevocationList(T0 + 300, frozenset({KID_A1, KID_B14}))


# ------------------------------------------------------------------ poll interval (spec: Limits)


def test_poll_constants() -> None:
    assert REVOCATION_POLL_INTERVAL_S == 300
    assert REVOCATION_POLL_JITTER == 0.10


def test_next_poll_delay_bounds() -> None:
    assert next_poll_delay(0.0) == 270
    assert next_poll_delay(0.5) == 300
    assert next_poll_delay(math.nextafter(1.0, 0.0)) == pytest.approx(330)
    assert all(270 <= next_poll_delay(i / 100) < 330 for i in range(100))


@pytest.mark.parametrize("rand", [-0.1, 1.0, 2.0, math.nan])
def test_next_poll_delay_refuses_out_of_range(rand: float) -> None:
    with pytest.raises(ValueError, match="rand"):
        next_poll_delay(rand)


# ------------------------------------------------------------------ our signing key


def rec(name: str, nb: int, na: int, created: int = 0, revoked: bool = False) -> KeyRecord:
    return KeyRecord(name, nb, na, created, revoked)


OLD = rec("old", T0 - 10 * DAY, T0 + DAY, created=T0 - 10 * DAY)
NEW = rec("new", T0 - HOUR, T0 + 30 * DAY, created=T0 - HOUR)
NEXT = rec("next", T0 + DAY, T0 + 60 * DAY, created=T0)
GONE = rec("gone", T0 - 40 * DAY, T0 - DAY, created=T0 - 40 * DAY)
BAD = rec("bad", T0 - 2 * HOUR, T0 + 30 * DAY, created=T0, revoked=True)
ALL = [OLD, NEW, NEXT, GONE, BAD]


def test_choose_signing_key_picks_newest_valid_non_revoked() -> None:
    """spec rotation: begin signing with the new key while the old one is still published."""
    assert choose_signing_key(ALL, T0) == NEW


def test_choose_signing_key_skips_revoked_and_future_keys() -> None:
    newest_revoked = rec("r", T0, T0 + DAY, created=T0, revoked=True)
    assert choose_signing_key([OLD, newest_revoked, NEXT], T0) == OLD


def test_choose_signing_key_tie_breaks_on_created_at() -> None:
    a = rec("a", T0, T0 + DAY, created=T0)
    b = rec("b", T0, T0 + DAY, created=T0 + 5)
    assert choose_signing_key([b, a], T0) == b


def test_choose_signing_key_respects_half_open_window() -> None:
    assert choose_signing_key([NEXT], NEXT.not_before) == NEXT
    assert choose_signing_key([NEXT], NEXT.not_after) is None


def test_choose_signing_key_none_when_no_key_usable() -> None:
    assert choose_signing_key([], T0) is None
    assert choose_signing_key([NEXT, GONE, BAD], T0) is None


@pytest.mark.parametrize(
    ("record", "state"),
    [(NEW, "signing"), (OLD, "retiring"), (NEXT, "published"), (GONE, "expired"), (BAD, "revoked")],
)
def test_key_state(record: KeyRecord, state: str) -> None:
    assert key_state(record, ALL, T0) == state


def test_key_state_follows_rotation_over_time() -> None:
    assert key_state(NEXT, ALL, NEXT.not_before) == "signing"
    assert key_state(NEW, ALL, NEXT.not_before) == "retiring"
    assert key_state(OLD, ALL, OLD.not_after) == "expired"


def test_publishable_keeps_current_and_next_keys_in_stable_order() -> None:
    assert publishable(ALL, T0) == (OLD, NEW, NEXT)
    assert publishable(list(reversed(ALL)), T0) == (OLD, NEW, NEXT)
    assert publishable(ALL, OLD.not_after) == (NEW, NEXT)


_B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_near_thumbprints = st.one_of(
    st.text(alphabet=_B64URL, min_size=43, max_size=43),  # canonical or not, by its last character
    st.text(alphabet=_B64URL + "\n=+/ ", min_size=0, max_size=90),  # line breaks, padding, lengths
    st.builds(lambda a, b: a + "\n" + b, st.text(_B64URL, min_size=43, max_size=43),
              st.text(_B64URL, min_size=43, max_size=43)),  # two thumbprints in one value
    st.integers(),
)  # fmt: skip


@given(st.lists(_near_thumbprints, max_size=6))
@settings(max_examples=500, deadline=None)
def test_all_thumbprints_agrees_with_checking_each(values: list[object]) -> None:
    """The one-pass check of a revocation list accepts exactly what ``is_thumbprint`` does, value by
    value: a value hiding a line break between two thumbprints included."""
    assert all_thumbprints(values) == all(is_thumbprint(v) for v in values)
