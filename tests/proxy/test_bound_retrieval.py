"""End to end, one key per transaction: the proxy forwards an ExecuteTransaction whose answer binds the
retrieval URL to the key that signed it (``agent_id``), the key store rotates, and the fetch of that
URL is still signed by the transaction's key and presents it, so the example delivery endpoint
(examples/delivery.py, run as written) accepts it; once that key's window has ended the proxy refuses
the fetch; a fetch presenting another key is refused by the delivery check."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from aiohttp import web

from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.retrieval import sign_retrieval_url
from signing_proxy.core.signature_key import RETRIEVAL_COMPONENTS, signature_key_member
from signing_proxy.core.signatures import Message, attach_signature, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.storage.keystore import KeyStore
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin, wait_for
from tests.verify.directory_host import served_directory
from tests.verify.test_example_exchange import listening_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXCHANGE_KEY = SigningKey.generate()
EXECUTE = "/v1/svc.v1.ExchangeService/ExecuteTransaction"
GRACE_S = 30  # the old key's window after the rotation: long enough to fetch, short enough to wait out


def direct_fetch(url: str, signer: SigningKey) -> requests.Response:
    """A fetch that does not come through the proxy: signed by ``signer``, presenting its key."""
    fields = Fields([("Content-Digest", content_digest(b"")), ("Authorization", ""), ("Signature-Agent", "")])
    fields.add("Signature-Key", signature_key_member("agent", signer.public))
    now = int(time.time())
    member = sign_message(
        Message("GET", parse_absolute_uri(url), fields),
        signer,
        created=now,
        expires=now + 60,
        components=RETRIEVAL_COMPONENTS,
    )
    attach_signature(fields, member)
    return requests.get(url, headers=dict(fields), proxies={}, timeout=WAIT_S)


def test_a_retrieval_fetch_after_a_rotation_uses_the_transactions_key(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "data")
    first = store.create(time.time()).thumbprint
    delivery_base: list[str] = []

    async def execute(request: web.Request) -> web.Response:
        (keyid,) = origin.arrivals[-1].keyids  # the key that signed ExecuteTransaction, verified
        url = sign_retrieval_url(
            f"{delivery_base[0]}/objects/42", EXCHANGE_KEY, agent_id=keyid, expires=int(time.time()) + 600
        )
        return web.json_response(
            {"transaction_id": "t-1", "agent_identity_hash": keyid, "results": [{"retrieval_endpoint": url}]}
        )

    with (
        served_directory(EXCHANGE_KEY) as exchange_directory,
        VerifyingOrigin(dict(store.load(private=False).publics), handler=execute) as origin,
    ):
        delivery = subprocess.Popen(
            [
                sys.executable,
                "-u",
                str(ROOT / "examples/delivery.py"),
                "0",
                exchange_directory,
                "127.0.0.1/32",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            delivery_base.append(f"http://127.0.0.1:{listening_port(delivery)}")
            with ProxyProcess(tmp_path, {"signing": {"key": None}}) as proxy:
                via = {"http": proxy.url}
                answer = requests.post(origin.url(EXECUTE), json={"ver": "1.0"}, proxies=via, timeout=WAIT_S)
                assert answer.status_code == 200, answer.text
                assert (origin.arrivals[-1].verified, origin.arrivals[-1].oracle) == (True, "ok")
                retrieval = answer.json()["results"][0]["retrieval_endpoint"]
                assert f"agent_id={first}" in retrieval

                new, _moved = store.rotate(time.time(), grace_s=GRACE_S)
                state = store.load()
                origin.trust(state.publics[new.thumbprint])
                assert proxy.proc is not None
                proxy.proc.send_signal(signal.SIGHUP)  # the rotation picked up now, not at the next poll

                def signs_with_the_new_key() -> bool:
                    requests.get(origin.url("/ping"), proxies=via, timeout=WAIT_S)
                    return origin.arrivals[-1].keyids == [new.thumbprint]

                # at most a third of the grace: the fetch below runs well inside the old key's window
                wait_for(
                    signs_with_the_new_key, "the proxy to pick up the rotation (SIGHUP)", limit_s=GRACE_S / 3
                )
                fetched = requests.get(retrieval, proxies=via, timeout=WAIT_S)
                assert fetched.status_code == 200, fetched.text  # the example accepted it
                assert fetched.headers["X-Bound-Key"] == first
                assert fetched.content == b"object 42\n"

                # another key, presenting itself, is refused by the delivery check
                other = direct_fetch(retrieval, state.private[new.thumbprint])
                assert (other.status_code, other.json()["reason"]) == (401, "presented-key-mismatch")

                def refused() -> bool:
                    return requests.get(retrieval, proxies=via, timeout=WAIT_S).status_code == 503

                wait_for(refused, "the transaction's key to retire", limit_s=GRACE_S + 30)
                problem = requests.get(retrieval, proxies=via, timeout=WAIT_S).json()
                assert problem["reason"] == "transaction-key-unavailable"
                assert first in problem["detail"]
        finally:
            delivery.terminate()
            delivery.wait(WAIT_S)
            if delivery.stdout is not None:
                delivery.stdout.close()
