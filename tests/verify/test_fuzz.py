"""Property-based fuzzing of what a stranger controls: nothing escapes but the package's own errors.

Hypothesis drives ``Signature-Input``, ``Signature``, ``Signature-Agent``, ``Content-Digest``, the
directory JSON and the revocation-list JSON through ``RequestVerifier`` (fake fetcher, fixed clock,
two concurrent verifications sharing one fetch), and the core parsers directly. Inputs are shaped
like structured fields (dictionaries, inner lists, parameters, byte sequences) and like near-valid
mutations of one valid signed request, not only random text. Every test is bounded and
derandomized, with no example database, so CI stays fast and deterministic.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from signing_proxy.core.digest import content_digest, parse_content_digest, verify_content_digest
from signing_proxy.core.errors import FieldError, SigningError
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import (
    DIRECTORY_PATH,
    Directory,
    DirectoryKey,
    RevocationList,
    parse_directory,
    parse_revocation_list,
    render_directory,
    render_revocation_list,
)
from signing_proxy.core.sfv import parse_item
from signing_proxy.core.signature_verify import _PLAIN_SF_STRING
from signing_proxy.core.signatures import (
    Message,
    VerifiedStack,
    attach_signature,
    hop_components,
    parse_signature_agent,
    parse_signature_stack,
    sign_message,
)
from signing_proxy.core.uri import directory_base, parse_absolute_uri
from signing_proxy.errors import DirectoryError, Error
from signing_proxy.verify import (
    DirectoryResolver,
    EgressPolicy,
    FetchResult,
    RequestVerifier,
    RevocationPoller,
    VerifierPolicy,
)
from tests.verify.fakes import NOW

FUZZ = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI stays deterministic
    database=None,  # no .hypothesis/ directory, no replay of examples found elsewhere
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
HANG_S = 5.0  # the fake fetcher answers at once: a verification still pending after this is a hang

AGENT = SigningKey.from_seed(bytes(range(32)))
BROKER = SigningKey.from_seed(bytes(range(1, 33)))
AGENT_BASE = "https://agent.example"
BROKER_BASE = "https://broker.example"
REV_URL = "https://agent.example/revoked.json"
TARGET = "https://exchange.example/svc.v1.ExchangeService/DiscoverResources"
BODY = b'{"ver":"1.0"}'
SIGNED_NAMES = ("Signature-Input", "Signature", "Signature-Agent", "Content-Digest")


# ---------------------------------------------------------------------------------------------
# Structured-field shapes (RFC 8941/9651): right enough to get past the first byte, wrong in depth


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
ODD_CHARS = " ,;=()\"':?@%*-._/\\\t\x00\x7f\u00e9\u2028\ud800()<>[]"
sf_key = st.sampled_from(
    ["keyid", "alg", "created", "expires", "nonce", "tag", "key", "agent", "broker", "sha-256", "sha-512"]
) | st.from_regex(r"[a-z*][a-z0-9_\-.*]{0,8}", fullmatch=True)
sf_token = st.from_regex(r"[A-Za-z*][A-Za-z0-9!#$%&'*+\-.^_`|~:/]{0,10}", fullmatch=True)
sf_string = st.text(PRINTABLE, max_size=24).map(_quote) | st.text(max_size=12).map(lambda s: f'"{s}"')
sf_integer = st.integers(-(10**16), 10**16).map(str) | st.sampled_from(
    [str(NOW), str(NOW + 60), str(NOW - 10**9), "0", "-0", "999999999999999", "1000000000000000", "01"]
)
sf_decimal = st.tuples(st.integers(-(10**13), 10**13), st.integers(0, 9999)).map(lambda t: f"{t[0]}.{t[1]}")
sf_bytes = st.binary(max_size=80).map(lambda b: ":" + base64.b64encode(b).decode() + ":") | st.text(
    "ABCxyz019+/=:-_ ", max_size=24
).map(lambda s: f":{s}:")
sf_bool = st.sampled_from(["?0", "?1", "?2", "?"])
sf_date = st.integers(-(10**16), 10**16).map(lambda n: f"@{n}")
sf_display = st.text(max_size=8).map(
    lambda s: '%"' + "".join(c if c.isascii() and c.isalnum() else f"%{ord(c) & 0xFF:02x}" for c in s) + '"'
)
sf_bare = st.one_of(sf_token, sf_string, sf_integer, sf_decimal, sf_bytes, sf_bool, sf_date, sf_display)
sf_params = st.lists(st.tuples(sf_key, st.none() | sf_bare), max_size=5).map(
    lambda ps: "".join(f";{k}" if v is None else f";{k}={v}" for k, v in ps)
)
sf_item = st.tuples(sf_bare, sf_params).map("".join)
sf_inner = st.tuples(st.lists(sf_item, max_size=7), sf_params).map(
    lambda t: "(" + " ".join(t[0]) + ")" + t[1]
)
sf_member = st.tuples(sf_key, st.none() | sf_item | sf_inner, sf_params).map(
    lambda t: t[0] + t[2] if t[1] is None else f"{t[0]}={t[1]}"
)
sf_dictionary = st.lists(sf_member, max_size=5).map(", ".join)


@st.composite
def noisy(draw: st.DrawFn, base: st.SearchStrategy[str]) -> str:
    """``base``, then up to three splices of odd characters, or a cut, at drawn positions."""
    text = draw(base)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        if draw(st.booleans()):
            text = text[:at] + draw(st.text(ODD_CHARS, min_size=1, max_size=3)) + text[at:]
        else:
            text = text[:at] + text[at + draw(st.integers(1, 4)) :]
    return text


sf_text = st.one_of(sf_dictionary, noisy(sf_dictionary), st.text(max_size=40))


# ---------------------------------------------------------------------------------------------
# A valid signed request and near-valid mutations of it


def signed_lines(
    agent: str = f'"{AGENT_BASE}"',
    digest: str = content_digest(BODY),
    created: int = NOW,
    expires: int = NOW + 60,
    broker: bool = False,
) -> list[tuple[str, str]]:
    """The request's field lines, signed by AGENT (and BROKER as a second hop when asked)."""
    fields = Fields([("Content-Digest", digest), ("Authorization", "Bearer t"), ("Signature-Agent", agent)])
    message = Message("POST", parse_absolute_uri(TARGET), fields)
    attach_signature(fields, sign_message(message, AGENT, created=created, expires=expires))
    if broker:
        member = sign_message(
            message,
            BROKER,
            created=created,
            expires=expires,
            label="broker",
            components=hop_components("agent"),
        )
        attach_signature(fields, member)
    return list(fields)


VALID = signed_lines()

url_host = st.sampled_from(
    [
        "agent.example",
        "AGENT.example",
        "a..b",
        "127.0.0.1",
        "169.254.169.254",
        "0x7f.1",
        "0177.0.0.1",
        "2130706433",
        "127.1",
        "1.2.3.4.5",
        "localhost.",
        "[::ffff:127.0.0.1]",
        "[64:ff9b::7f00:1]",
        "[2002:7f00:1::]",
        "[::]",
        "[::1]",
        "[::1",
        "[fe80::1%25eth0]",
        "xn--",
        "xn--zz",
        "\u00e9.example",
        "exa\u200bmple",
        "%41.example",
        "",
        "a" * 70 + ".example",
        ".".join(["a"] * 200),
    ]
)
url_shape = st.tuples(
    st.sampled_from(["https://", "http://", "HTTPS://", "ftp://", "https:/", "https:///", ""]),
    st.sampled_from(["", "user@", "user:pw@", "@", "a@b@"]),
    url_host,
    st.sampled_from(["", ":443", ":0", ":65536", ":-1", ":22", ":x", ":"]),
    st.sampled_from(["", "/", "/reg/x", "/..", "//", "/%2e%2e/", "/a b"]),
    st.sampled_from(["", "?q=1", "?", "#", "#frag", "/latest/meta-data/iam#"]),
).map("".join)
signature_agent = st.one_of(
    url_shape.map(_quote),
    url_shape,
    url_shape.map(lambda u: _quote(u) + ";x=1"),
    url_shape.map(lambda u: f"{_quote(u)}, {_quote(u)}"),
    st.sampled_from(["", " ", '""', '"', "?1", "1", "(a)", 'agent="https://agent.example"']),
    noisy(st.just(f'"{AGENT_BASE}"')),
    sf_text,
)
content_digests = st.one_of(
    st.just(content_digest(BODY)),
    st.lists(
        st.tuples(st.sampled_from(["sha-256", "sha-512", "md5", "SHA-256", "unixsum"]), sf_item | sf_bytes)
    ).map(lambda ms: ", ".join(f"{k}={v}" for k, v in ms)),
    noisy(st.just(content_digest(BODY))),
    sf_text,
)


def _sub(pattern: str, repl: str) -> Callable[[str], str]:
    return lambda value: re.sub(pattern, lambda _m: repl, value, count=1)


# Edits of one header's value: a parameter, a component, a label, a byte sequence replaced.
value_edits = st.one_of(
    st.tuples(st.sampled_from(["keyid", "alg", "created", "expires"]), sf_bare | st.just("")).map(
        lambda t: _sub(rf";{t[0]}=[^;,]*", f";{t[0]}={t[1]}")
    ),
    st.tuples(st.sampled_from(["nonce", "tag", "foo", "alg", "created"]), sf_bare).map(
        lambda t: lambda v: v + f";{t[0]}={t[1]}"
    ),
    st.tuples(
        st.sampled_from(
            ['"@method"', '"@target-uri"', '"content-digest"', '"authorization"', '"signature-agent"']
        ),
        st.one_of(sf_item, st.sampled_from(['"@query"', '"signature";key="agent"', '"@method";x=1', ""])),
    ).map(lambda t: _sub(re.escape(t[0]), t[1])),
    st.tuples(st.sampled_from(["agent", "broker"]), sf_key | st.sampled_from(["", "Agent", "1x"])).map(
        lambda t: _sub(rf"\b{t[0]}=", f"{t[1]}=")
    ),
    sf_bytes.map(lambda b: _sub(r":[A-Za-z0-9+/=]*:", b)),
    sf_member.map(lambda m: lambda v: f"{v}, {m}"),
    sf_member.map(lambda m: lambda v: f"{m}, {v}"),
)


@st.composite
def near_valid_lines(draw: st.DrawFn) -> list[tuple[str, str]]:
    """A valid signed request, or one re-signed over odd values, then edited up to three times."""
    lines = list(VALID)
    resigned = draw(st.booleans())
    if resigned:  # re-signed: the signature verifies, so the odd value reaches deeper checks
        created = draw(st.sampled_from([NOW, NOW - 30, NOW + 3, NOW + 6, NOW - 10**8, 1, NOW - 3600]))
        expires = created + draw(st.sampled_from([1, 60, 3600, 3601, 10**9, 10 * 365 * 86400]))
        agent, digest, broker = (
            draw(st.just(f'"{AGENT_BASE}"') | signature_agent),
            draw(content_digests),
            draw(st.booleans()),
        )
        with contextlib.suppress(SigningError):  # a value the signer refuses: keep the valid request
            lines = signed_lines(agent, digest, created, expires, broker)
    for _ in range(draw(st.integers(0 if resigned else 1, 3))):
        name = draw(st.sampled_from(SIGNED_NAMES))
        kind = draw(
            st.sampled_from(["edit", "edit", "edit", "replace", "drop", "repeat", "splice", "splice"])
        )
        index = next((i for i, (n, _v) in enumerate(lines) if n == name), None)
        if kind == "drop":
            lines = [line for line in lines if line[0] != name]
        elif kind == "repeat":
            lines.append((draw(st.sampled_from([name, name.lower(), name.upper()])), draw(sf_text)))
        elif index is None:
            lines.append((name, draw(sf_text)))
        elif kind == "edit":
            lines[index] = (name, draw(value_edits)(lines[index][1]))
        elif kind == "splice":
            lines[index] = (name, draw(noisy(st.just(lines[index][1]))))
        else:
            replacement = {"Signature-Agent": signature_agent, "Content-Digest": content_digests}
            lines[index] = (name, draw(replacement.get(name, sf_text)))
    return lines


request_lines = st.one_of(  # near-valid three times in four: random lines rarely get past the first check
    near_valid_lines(),
    near_valid_lines(),
    near_valid_lines(),
    st.lists(st.tuples(st.sampled_from(SIGNED_NAMES), sf_text), max_size=6),
)


# ---------------------------------------------------------------------------------------------
# Directory and revocation-list documents

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
timestamps = st.one_of(
    st.sampled_from(
        [
            "2023-11-14T22:13:20Z",
            "2099-01-01T00:00:00Z",
            "2000-01-01T00:00:00Z",
            "2023-11-14T22:13:20+23:59",
            "2023-11-14T22:13:60Z",
            "9999-12-31T23:59:59-23:59",
            "0000-01-01T00:00:00Z",
            "0001-01-01T00:00:00+23:59",
            "2023-02-30T00:00:00Z",
            "2023-11-14T22:13:20.999999999999Z",
            "2023-11-14 22:13:20Z",
            "\u0662\u0660\u0662\u0663-11-14T22:13:20Z",
        ]
    ),
    st.from_regex(
        r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,3})?([Zz]|[+-][0-9]{2}:[0-9]{2})",
        fullmatch=True,
    ),
    json_values,
)
revocation_urls = st.one_of(st.just(REV_URL), st.just(REV_URL), url_shape, json_values)


JWK_MEMBERS = ("kty", "crv", "x", "d", "alg", "use", "kid", "not_before", "not_after")
member_values: st.SearchStrategy[object] = st.sampled_from(
    [{}, [], None, 0, True, "", "EdDSA", "Ed25519", "ed25519", "ES256", "sig", "enc", "OKP", AGENT.thumbprint]
)


def _valid_jwk(key: SigningKey) -> dict[str, Any]:
    return DirectoryKey(key.public, NOW - 60, NOW + 3600).jwk()


@st.composite
def directory_docs(draw: st.DrawFn) -> bytes:
    """A valid directory edited member by member, arbitrary JSON, or bytes that are not JSON at all."""
    shape = draw(
        st.sampled_from(["valid", "valid", "edited", "edited", "edited", "json", "bytes", "deep", "big"])
    )
    if shape == "json":
        return json.dumps(draw(json_values)).encode()
    if shape == "bytes":
        return draw(st.binary(max_size=200))
    if shape == "deep":
        depth = draw(st.integers(100, 20_000))
        return (draw(st.sampled_from(['{"keys":', "[", '{"a":'])) * depth).encode()
    if shape == "big":
        return b'{"keys":[],"pad":"' + b"x" * draw(st.integers(60_000, 70_000)) + b'"}'
    if shape == "valid":  # reaches the key, window and revocation checks
        keys = [DirectoryKey(k.public, NOW - 60, NOW + 3600) for k in draw(st.permutations([AGENT, BROKER]))]
        return render_directory(Directory(tuple(keys), draw(st.sampled_from([REV_URL, REV_URL, None]))))
    signers = [AGENT, *draw(st.lists(st.sampled_from([AGENT, BROKER]), max_size=2))]
    jwks = [_valid_jwk(k) for k in draw(st.permutations(signers))]
    for jwk in jwks:
        for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
            member = draw(
                st.sampled_from([*JWK_MEMBERS, *JWK_MEMBERS[3:]])
            )  # the later checks twice as often
            if draw(st.sampled_from([True, False, False])):
                jwk.pop(member, None)
            elif member in ("not_before", "not_after"):
                jwk[member] = draw(timestamps)
            else:
                jwk[member] = draw(st.one_of(member_values, member_values, json_values))
    doc: dict[str, Any] = {"keys": jwks}
    if draw(st.sampled_from([True, True, False])):
        doc["revocation_url"] = draw(revocation_urls)
    if draw(st.booleans()):
        doc[draw(st.sampled_from(["keys", "extra"]))] = draw(json_values)
    text = json.dumps(doc)
    if draw(st.sampled_from([False, False, False, True])):  # what json.dumps never writes: NaN, twins
        text = text[:-1] + draw(st.sampled_from([', "keys": []}', ', "x": NaN}', ', "x": 1e999}', "}"]))
    return text.encode()


@st.composite
def revocation_docs(draw: st.DrawFn) -> bytes:
    """A valid revocation list (sometimes naming the agent's key) edited, arbitrary JSON, or bytes."""
    shape = draw(st.sampled_from(["valid", "valid", "edited", "edited", "edited", "json", "bytes"]))
    if shape == "valid":
        listed = frozenset(draw(st.sets(st.sampled_from([AGENT.thumbprint, BROKER.thumbprint]))))
        return render_revocation_list(RevocationList(NOW - draw(st.sampled_from([0, 60, 10**6])), listed))
    if shape == "json":
        return json.dumps(draw(json_values)).encode()
    if shape == "bytes":
        return draw(st.binary(max_size=200))
    revoked = draw(
        st.lists(st.sampled_from([AGENT.thumbprint, BROKER.thumbprint, "x" * 43, "A" * 43]), max_size=3)
    )
    doc: dict[str, Any] = {"as_of": "2023-11-14T22:13:20Z", "revoked": revoked}
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        member = draw(st.sampled_from(["as_of", "revoked"]))
        if draw(st.booleans()):
            doc.pop(member, None)
        else:
            doc[member] = draw(timestamps if member == "as_of" else json_values)
    return json.dumps(doc).encode()


fetch_answers = st.one_of(  # mostly an answer: a refused fetch stops before any parsing
    *[
        st.builds(
            FetchResult,
            status=st.sampled_from([*[200] * 8, 304, 404, 500]),
            body=st.just(b""),
            cache_control=st.none()
            | st.sampled_from(["max-age=60", "no-store", "max-age=" + "9" * 400])
            | st.text(max_size=20),
        )
    ]
    * 4,
    st.just(DirectoryError("directory-fetch-failed", "refused by the fake")),
)


class DocFetch:
    """Answers every directory URL with one document and every other URL with another."""

    def __init__(self, directory: FetchResult | Exception, revocations: FetchResult | Exception) -> None:
        self.directory = directory
        self.revocations = revocations

    async def __call__(self, url: str) -> FetchResult:
        await asyncio.sleep(0)  # a real fetch yields: the second verification meets the in-flight one
        answer = self.directory if url.endswith(DIRECTORY_PATH) else self.revocations
        if isinstance(answer, Exception):
            raise answer
        return answer


def _with_body(answer: FetchResult | Exception, body: bytes) -> FetchResult | Exception:
    return (
        FetchResult(answer.status, body, answer.cache_control) if isinstance(answer, FetchResult) else answer
    )


class CatchAllWatch(logging.Handler):
    """Keeps the exceptions a last-resort handler logged (``exc_info``): the verifier turns them into
    a refusal, so without this an internal bug on hostile input would pass for a clean refusal."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.caught: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None and not isinstance(record.exc_info[1], Error):
            self.caught.append(record.exc_info[1])


def verify_twice(lines: list[tuple[str, str]], fetch: DocFetch) -> list[VerifiedStack | BaseException]:
    """Two concurrent verifications of the request by a fresh verifier; fail on a hang. An exception
    a catch-all logged is returned with the results, as if it had escaped."""
    watch = CatchAllWatch()
    package_log = logging.getLogger("signing_proxy")
    package_log.addHandler(watch)
    try:
        results = _verify_twice(lines, fetch)
    finally:
        package_log.removeHandler(watch)
    return [*results, *watch.caught]


def _verify_twice(lines: list[tuple[str, str]], fetch: DocFetch) -> list[VerifiedStack | BaseException]:
    async def run() -> list[VerifiedStack | BaseException]:
        verifier = RequestVerifier(
            DirectoryResolver(fetch, clock=lambda: float(NOW)),
            VerifierPolicy(broker_directories=(BROKER_BASE,), pinned_agent_keys=(AGENT.public,), max_hops=3),
            revocations=RevocationPoller(fetch, clock=lambda: float(NOW)),
            clock=lambda: float(NOW),
        )
        calls = (verifier.verify("POST", TARGET, Fields(lines), BODY) for _ in range(2))
        try:
            return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), HANG_S)
        finally:
            await asyncio.wait_for(verifier.close(), HANG_S)  # its pollers and fetches in flight

    try:
        return asyncio.run(run())
    except TimeoutError:
        pytest.fail(f"verification hung for {HANG_S} s: {lines!r}")


def assert_only_package_errors(results: list[VerifiedStack | BaseException]) -> None:
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, Error):
            raise result  # escaped the package's error tree: Hypothesis shrinks and prints the input
        if not isinstance(result, BaseException):
            assert isinstance(result, VerifiedStack)


# ---------------------------------------------------------------------------------------------
# The verifier, end to end


@FUZZ
@given(lines=request_lines)
def test_fuzz_request_headers_through_the_verifier(lines: list[tuple[str, str]]) -> None:
    directory = render_directory(Directory((DirectoryKey(AGENT.public, NOW - 60, NOW + 3600),), REV_URL))
    revocations = render_revocation_list(RevocationList(NOW, frozenset()))
    fetch = DocFetch(FetchResult(200, directory, None), FetchResult(200, revocations, None))
    assert_only_package_errors(verify_twice(lines, fetch))


@FUZZ
@given(
    lines=st.one_of(st.just(VALID), st.just(signed_lines(broker=True)), near_valid_lines()),
    directory=directory_docs(),
    revocations=revocation_docs(),
    directory_answer=fetch_answers,
    revocation_answer=fetch_answers,
)
def test_fuzz_directory_and_revocation_documents_through_the_verifier(
    lines: list[tuple[str, str]],
    directory: bytes,
    revocations: bytes,
    directory_answer: FetchResult | Exception,
    revocation_answer: FetchResult | Exception,
) -> None:
    fetch = DocFetch(_with_body(directory_answer, directory), _with_body(revocation_answer, revocations))
    assert_only_package_errors(verify_twice(lines, fetch))


def test_the_unmutated_request_verifies() -> None:
    """The fuzzers start from a request that really verifies: a refusal there would hide every escape."""
    directory = render_directory(Directory((DirectoryKey(AGENT.public, NOW - 60, NOW + 3600),), REV_URL))
    revocations = render_revocation_list(RevocationList(NOW, frozenset()))
    fetch = DocFetch(FetchResult(200, directory, None), FetchResult(200, revocations, None))
    results = verify_twice(VALID, fetch)
    assert all(isinstance(r, VerifiedStack) for r in results), results


# ---------------------------------------------------------------------------------------------
# The core parsers, directly


def _only_package_errors(call: Callable[[], object]) -> None:
    with contextlib.suppress(Error):
        call()


@FUZZ
@given(lines=request_lines)
def test_fuzz_parse_signature_stack(lines: list[tuple[str, str]]) -> None:
    _only_package_errors(lambda: parse_signature_stack(Fields(lines)))


@FUZZ
@given(value=signature_agent)
def test_fuzz_parse_signature_agent(value: str) -> None:
    _only_package_errors(lambda: parse_signature_agent(value))


def _string_by_http_sf(value: str) -> str | None:
    """The String http-sf reads in ``value`` (None: refused, or not a bare String)."""
    try:
        bare, params = parse_item(value)
    except (ValueError, UnicodeEncodeError):
        return None
    return bare if isinstance(bare, str) and not params else None


def _agent_by_the_sf_parser(value: str) -> str | None:
    """parse_signature_agent as it reads every quoted value: the full RFC 8941 Item parser."""
    value = value.strip()
    if not value:
        return None
    if not value.startswith('"'):
        return parse_signature_agent(value)  # a bare URL: no structured field involved
    url = _string_by_http_sf(value)
    if url is None:
        return "refused"
    if not url.startswith(("https://", "http://")) or any(c in url for c in ' "<>\\'):
        return "refused"
    try:
        return directory_base(url)  # the one spelling of the base it names
    except FieldError:
        return "refused"


def _assert_read_as_the_sf_parser_reads(value: str) -> None:
    # a quoted value without escapes or parameters is read by a regular expression; any other
    # quoted value by http-sf: both must give the same URL, or both refuse
    try:
        fast: str | None = parse_signature_agent(value)
    except FieldError:
        fast = "refused"
    try:
        slow = _agent_by_the_sf_parser(value)
    except FieldError:
        slow = "refused"
    assert fast == slow


@FUZZ
@given(value=signature_agent)
def test_the_plain_string_reading_of_signature_agent_is_the_sf_parsers(value: str) -> None:
    _assert_read_as_the_sf_parser_reads(value)


@pytest.mark.parametrize(
    "value",
    [
        '"https://agent.example/a\x7fb"',  # DEL
        '"https://caf\u00e9.example"',  # non-ASCII
        '"https://agent.example/\u2028"',
        '"https://agent.example/a\tb"',  # controls, 0x00-0x1f
        '"https://agent.example/a\x00b"',
        '"https://agent.example/a\x1fb"',
        '"https://agent.example/a\\xb"',  # a backslash before what it may not escape
        '"https://agent.example/\\"',  # a trailing one: the closing DQUOTE escaped
        '"https://agent.example/a"b"',  # an unescaped DQUOTE inside
        '"https://agent.example", "https://agent.example"',
    ],
)
def test_rare_characters_in_signature_agent_read_as_the_sf_parser_reads_them(value: str) -> None:
    # characters the regular expression must leave to http-sf, rare in what Hypothesis draws
    _assert_read_as_the_sf_parser_reads(value)


@pytest.mark.parametrize(
    "value",
    [
        '"https://agent.example"',
        '""',
        '" !#[]~"',
        '"a\x7fb"',  # DEL
        '"caf\u00e9"',  # non-ASCII
        '"\u2028"',
        '"a\tb"',  # controls, 0x00-0x1f
        '"a\x00b"',
        '"a\x1fb"',
        '"a\nb"',
        '"a\\xb"',  # a backslash before what it may not escape
        '"ab\\"',  # a trailing backslash: the closing DQUOTE escaped, the String unterminated
        '"\\"',
        '"a"b"',  # an unescaped DQUOTE inside
        '"a" "b"',
        '"a", "b"',
    ],
)
def test_the_signature_agent_fast_path_reads_a_string_as_http_sf_does_or_not_at_all(value: str) -> None:
    # the regular expression behind parse_signature_agent's plain-String fast path, on its own: the
    # URL check after it refuses a backslash or DQUOTE either way, which hides a looser expression
    fast = value[1:-1] if _PLAIN_SF_STRING.fullmatch(value) else None
    assert fast == _string_by_http_sf(value)


@FUZZ
@given(value=content_digests, body=st.sampled_from([BODY, b""]))
def test_fuzz_parse_content_digest(value: str, body: bytes) -> None:
    _only_package_errors(lambda: parse_content_digest(value))
    _only_package_errors(lambda: verify_content_digest(value, body))


@FUZZ
@given(body=directory_docs())
def test_fuzz_parse_directory(body: bytes) -> None:
    _only_package_errors(lambda: parse_directory(body))


@FUZZ
@given(body=revocation_docs())
def test_fuzz_parse_revocation_list(body: bytes) -> None:
    _only_package_errors(lambda: parse_revocation_list(body))


@FUZZ
@given(
    url=st.one_of(url_shape, noisy(url_shape), st.text(max_size=60)),
    allow_query=st.booleans(),
    allow_private=st.sampled_from([(), ("127.0.0.0/8", "10.0.0.0/8", "::1/128")]),
)
def test_fuzz_egress_url_check(url: str, allow_query: bool, allow_private: tuple[str, ...]) -> None:
    """The shape check a verifier runs on Signature-Agent and revocation_url before any I/O."""
    policy = EgressPolicy(allow_private)
    _only_package_errors(lambda: policy.check_url(url, allow_query=allow_query))


@FUZZ
@given(url=st.one_of(url_shape, noisy(url_shape), st.text(max_size=60)))
def test_fuzz_parse_absolute_uri(url: str) -> None:
    """The request target a relay or verify-origin receives is a stranger's too."""
    _only_package_errors(lambda: parse_absolute_uri(url))
