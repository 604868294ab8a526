"""Issue 15 attack 2, "make the verifier fetch any URL" (server-side request forgery), against the
verifier as assembled for exchanges (``build_verifier``: the package's one client, an egress policy)
and real loopback servers that count every request: no request reaches an "internal" server that
is not allow-listed; userinfo, query and fragment are refused before any fetch even where the address
is allow-listed; a refusal says nothing about what was (or could have been) fetched."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from signing_proxy.core.jwk import SigningKey
from signing_proxy.verify import EgressPolicy, HttpClient, RequestVerifier, VerificationError, build_verifier
from tests.verify.strangers import BODY, LOOPBACK, TARGET, directory_doc, host, signed

AGENT = SigningKey.from_seed(bytes(range(32)))
GENERIC = "the key directory named by Signature-Agent is unavailable"


@pytest.fixture
async def client() -> AsyncIterator[HttpClient]:
    async with HttpClient.standalone() as own:
        yield own


async def refusal(verifier: RequestVerifier, agent: str) -> VerificationError:
    fields = signed(agent, AGENT, now=int(time.time()))
    with pytest.raises(VerificationError) as err:
        await verifier.verify("POST", TARGET, fields, BODY)
    await verifier.close()
    return err.value


@pytest.mark.parametrize(
    "agent",
    [
        "{base}",
        '"{base}"',
        "{base}/latest/meta-data/iam/security-credentials/role#",
        "http://localhost:{port}",
        "http://0.0.0.0:{port}",
        "http://2130706433:{port}",  # 127.0.0.1 as one decimal number
        "http://127.1:{port}",
    ],
)
async def test_forgery_an_internal_server_not_allow_listed_is_never_reached(
    client: HttpClient, agent: str
) -> None:
    async with host() as internal:
        internal.directory(directory_doc(AGENT, now=int(time.time())))  # it would even verify
        named = agent.format(base=internal.base, port=internal.base.rsplit(":", 1)[1])
        # allow-listing only 10.0.0.0/8 admits plain http in principle: names must still be resolved
        verifier = build_verifier(client=client, egress=EgressPolicy(allow_private=("10.0.0.0/8",)))
        err = await refusal(verifier, named)
    # a fragment names no directory base: refused before the egress policy is asked
    assert err.reason in ("signature-agent-refused", "directory-unavailable", "malformed-signature-agent")
    assert internal.seen == []


@pytest.mark.parametrize(
    ("address", "agent"), [("127.0.0.1", "https://127.0.0.1:{port}"), ("::1", "https://[::1]:{port}")]
)
async def test_forgery_an_internal_tls_port_gets_no_connection(
    client: HttpClient, address: str, agent: str
) -> None:
    connections: list[object] = []

    def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        writer.close()

    try:
        listener = await asyncio.start_server(accept, address, 0)
    except OSError:
        pytest.skip(f"no {address} on this host")
    port = listener.sockets[0].getsockname()[1]
    try:
        verifier = build_verifier(client=client, egress=EgressPolicy(allow_private=("10.0.0.0/8",)))
        err = await refusal(verifier, agent.format(port=port))
    finally:
        listener.close()
        await listener.wait_closed()
    assert err.reason == "signature-agent-refused"
    assert connections == []


async def test_forgery_a_link_local_metadata_address_is_refused_without_a_fetch(client: HttpClient) -> None:
    verifier = build_verifier(client=client)
    err = await refusal(verifier, "http://169.254.169.254/latest/meta-data/iam/security-credentials/role")
    assert err.reason == "signature-agent-refused"
    assert "169.254" not in err.detail


@pytest.mark.parametrize(
    ("shape", "rule"),
    [
        ("http://user:secret@{authority}", "names no user"),
        ("http://{authority}/?x=1", "no query or fragment"),
        ("http://{authority}/role#", "no query or fragment"),
        ("http://{authority}#", "no query or fragment"),
        ("http://{authority}/a/../b", "'..' segment"),
    ],
)
async def test_forgery_userinfo_query_or_fragment_is_refused_without_a_fetch(
    client: HttpClient, shape: str, rule: str
) -> None:
    """None of these names a directory base (``directory_base``): refused as the header it is,
    before the egress policy is asked, nothing fetched."""
    async with host() as allowed:
        allowed.directory(directory_doc(AGENT, now=int(time.time())))
        verifier = build_verifier(client=client, egress=LOOPBACK)
        err = await refusal(verifier, shape.format(authority=allowed.base.removeprefix("http://")))
    assert (err.reason, allowed.seen) == ("malformed-signature-agent", [])
    assert rule in err.detail  # the rule the client's own header broke
    assert "secret" not in err.detail


async def test_forgery_a_revocation_url_naming_an_internal_server_is_never_polled(client: HttpClient) -> None:
    async with host("127.0.0.2") as internal, host() as directory:
        directory.directory(
            directory_doc(AGENT, now=int(time.time()), revocation_url=f"{internal.base}/admin/reset")
        )
        verifier = build_verifier(client=client, egress=LOOPBACK)  # 127.0.0.1 only
        err = await refusal(verifier, directory.base)
    assert err.reason == "revocation-unavailable"  # the directory's own keys fail closed
    assert internal.seen == []
    assert len(directory.seen) == 1


@pytest.mark.parametrize("status", [404, 500])
async def test_forgery_a_refusal_is_no_port_scanner(client: HttpClient, status: int) -> None:
    async with host() as open_port:
        open_port.directory(b"")  # an answer that is not a directory
        open_port.documents["/.well-known/http-message-signatures-directory"] = (status, b"nope")
        closed = host()
        async with closed as gone:
            closed_base = gone.base
        details = set()
        for base in (open_port.base, closed_base):
            verifier = build_verifier(client=client, egress=LOOPBACK)
            err = await refusal(verifier, base)
            assert err.reason == "directory-unavailable"
            details.add(err.detail)
    assert details == {GENERIC}  # an open port, a closed port, any status: the same answer
