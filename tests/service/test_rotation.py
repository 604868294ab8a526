"""Key rotation with no refused request, revocation, and SIGHUP in relay mode (issue 17).

The rotation tests run the proxy in-process as ``signing-proxy run`` assembles it (``ProxyApp``, its
publication listener and key-store refresh) beside a strict verifier built from
``signing_proxy.verify``: it caches the directory for exactly its Cache-Control max-age and never
re-fetches early for an unknown keyid, so a key it has not seen yet is refused. The tests change the
store through ``signing-proxy keys ...`` (a separate process, as an operator would) and send
requests without pause through the rotation. The other tests run ``signing-proxy run`` as a child
process, with a verifying origin that fetches the directory for every request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
import yaml
from aiohttp import web

from signing_proxy.config import Config, parse_config
from signing_proxy.core.digest import content_digest
from signing_proxy.core.fields import Fields
from signing_proxy.core.jwk import SigningKey, load_private_key
from signing_proxy.core.keys import (
    MAX_DIRECTORY_BYTES,
    parse_directory,
    parse_revocation_list,
    parse_rfc3339,
)
from signing_proxy.core.signatures import Message, attach_signature, serialize_sf_string, sign_message
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.service.app import ProxyApp
from signing_proxy.service.keys import KeyServices, key_provider_for, start_key_services
from signing_proxy.service.workers import reserve_port
from signing_proxy.storage.keystore import KeyStore, StoreKeyProvider
from signing_proxy.verify import (
    DirectoryResolver,
    EgressPolicy,
    HttpClient,
    RequestVerifier,
    VerificationError,
    http_fetcher,
    refusal,
    verify_aiohttp_request,
)
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin, free_port, run_cli, wait_for

pytestmark = pytest.mark.integration

DIRECTORY = "/.well-known/http-message-signatures-directory"
REVOCATIONS = "/.well-known/http-message-signatures-revocations.json"
MAX_AGE_S = 2  # the directory's max-age here; the configuration's floor (60 s) is bypassed below
# a new key signs this long after `keys rotate`: publication (the store is noticed within 1 s) may be
# starved by up to PUBLISH_MARGIN_S - 1 s before a verifier caches a directory without it
PUBLISH_MARGIN_S = 8
# signing.validity_s of the rotation below: `keys rotate` refuses a grace shorter than it + 1 s (a
# signature the old key made would outlive its window), and the test waits the grace out
VALIDITY_S = 5
LOOPBACK = EgressPolicy(["127.0.0.0/8"])
_T = TypeVar("_T")


def session() -> requests.Session:
    s = requests.Session()
    s.trust_env = False
    return s


# --- the in-process rig ---------------------------------------------------------------------------


@dataclasses.dataclass
class Verdict:
    """What the strict verifier decided about one request."""

    keyid: str | None  # the signing keyid, when verified
    reason: str | None  # the refusal reason, when refused
    created: int = 0


class StrictOrigin:
    """An origin that verifies every request with a verifier that honours Cache-Control exactly:
    the directory is fetched again only when its max-age has passed (no floor, no early re-fetch
    for an unknown keyid), revocation lists polled as every verifier of the package does."""

    def __init__(self) -> None:
        self.client = HttpClient.standalone()
        fetch = http_fetcher(self.client, egress=LOOPBACK, max_bytes=MAX_DIRECTORY_BYTES, timeout_s=5.0)
        self.resolver = DirectoryResolver(fetch, floor_s=0.0, keyid_refetch_s=float("inf"))
        self.verifier = RequestVerifier(self.resolver, egress=LOOPBACK)
        self.verdicts: list[Verdict] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            stack = await verify_aiohttp_request(self.verifier, request)
        except VerificationError as exc:
            self.verdicts.append(Verdict(None, exc.reason))
            return refusal(exc)
        first = stack.signatures[0]
        self.verdicts.append(Verdict(first.keyid, None, first.created))
        return web.Response(text="ok")

    async def close(self) -> None:
        await self.verifier.close()
        await self.client.close()


class Rig:
    """The proxy with its publication listener (as ``signing-proxy run`` builds them) and a
    ``StrictOrigin``, on one event loop in a thread of its own; stopped by ``close``."""

    def __init__(self, tmp: Path, max_age_s: int = MAX_AGE_S, validity_s: int = 300) -> None:
        self.max_age_s = max_age_s
        # the publish port is known before the proxy starts (Signature-Agent names it) without a
        # bind-and-release race: held by a SO_REUSEPORT socket that never listens
        self._reserved, port = reserve_port("127.0.0.1", 0)
        self.base = f"http://127.0.0.1:{port}"
        config = parse_config(
            {
                "listen": "127.0.0.1:0",
                "data_dir": str(tmp / "data"),
                "signing": {"signature_agent": self.base, "validity_s": validity_s},
                "publish": {
                    "listen": f"127.0.0.1:{port}",
                    "domain": "agent.example",
                    "public_url": self.base,
                },
            }
        )
        # spec Limits: "minutes to hours"; seconds here so that a test sees caches expire
        publish = dataclasses.replace(config.publish, directory_max_age_s=max_age_s)
        self.config: Config = dataclasses.replace(config, publish=publish)
        self.data = tmp / "data"
        self.cli_config = tmp / "keys-cli.yaml"  # what `keys ...` reads: the proxy's signing.validity_s
        self.cli_config.write_text(f"signing:\n  validity_s: {validity_s}\n")
        keys = key_provider_for(self.config)  # the key store, created on first run
        assert isinstance(keys, StoreKeyProvider)
        self.keys = keys
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rotation-rig", daemon=True)
        self._thread.start()
        self.origin = StrictOrigin()
        self._runner: web.AppRunner | None = None
        self.services: KeyServices | None = None
        self.app: ProxyApp | None = None
        self.proxy_url = self.origin_url = ""
        self.run(self._start())

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT_S)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.origin.handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.origin_url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        self.services = await start_key_services(self.config, self.keys, reuse_port=True)
        self.app = ProxyApp(self.config, self.keys)
        host, port = (await self.app.start())[0]
        self.proxy_url = f"http://{host}:{port}"

    async def _stop(self) -> None:
        if self.services is not None:
            await self.services.stop()
        if self.app is not None:
            await self.app.stop(drain_s=1.0)
        if self._runner is not None:
            await self._runner.cleanup()
        await self.origin.close()

    def close(self) -> None:
        try:
            self.run(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(WAIT_S)
            self.loop.close()
            self._reserved.close()

    def served_keys(self) -> list[str]:
        resp = session().get(self.base + DIRECTORY, timeout=WAIT_S)
        assert resp.status_code == 200, resp.text
        assert resp.headers["Cache-Control"] == f"max-age={self.max_age_s}"
        return [k.thumbprint for k in parse_directory(resp.content).keys]

    def keys_cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_cli("keys", *args, "--config", str(self.cli_config), "--data-dir", str(self.data))


@contextmanager
def rig(tmp: Path, max_age_s: int = MAX_AGE_S, validity_s: int = 300) -> Iterator[Rig]:
    r = Rig(tmp, max_age_s, validity_s)
    try:
        yield r
    finally:
        r.close()


@contextmanager
def traffic(r: Rig) -> Iterator[list[int]]:
    """Requests through the proxy to the strict origin, one after the other, until the block ends."""
    statuses: list[int] = []
    stop = threading.Event()

    def client() -> None:
        with session() as s:
            i = 0
            while not stop.is_set():
                resp = s.post(
                    f"{r.origin_url}/exchange/{i}",
                    data=b"x" * i,
                    proxies={"http": r.proxy_url},
                    timeout=WAIT_S,
                )
                statuses.append(resp.status_code)
                i += 1
                stop.wait(0.01)  # paced, not stopped: the machine is shared

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    try:
        yield statuses
    finally:
        stop.set()
        thread.join(WAIT_S)


def test_publish_first_sign_later_refuses_nothing_at_a_caching_verifier(tmp_path: Path) -> None:
    """Spec rotation 1 and Limits: the new key is published at once, signs only once every cached
    copy of the directory (max-age) holds it; the old key signs until then, stays published for the
    grace, and is gone after it. Zero refusals throughout."""
    with rig(tmp_path, validity_s=VALIDITY_S) as r:
        (old,) = r.served_keys()
        verdicts = r.origin.verdicts
        started = time.monotonic()
        with traffic(r) as statuses:
            wait_for(lambda: len(verdicts) >= 20 and r.origin.resolver.fetches >= 2, "traffic, re-fetches")
            # the directory must hold the new key max-age before it signs: PUBLISH_MARGIN_S to spare
            # (`keys rotate` adds 30 s by default)
            grace_s = VALIDITY_S + 1  # the shortest `keys rotate` accepts
            activate_in = f"{MAX_AGE_S + PUBLISH_MARGIN_S}s"
            done = r.keys_cli("rotate", "--activate-in", activate_in, "--grace", f"{grace_s}s")
            assert done.returncode == 0, done.stderr
            new = done.stdout.split("new key ", 1)[1].split(":", 1)[0]
            activation = parse_rfc3339(done.stdout.split("signs from ", 1)[1].split()[0])
            old_end = parse_rfc3339(done.stdout.split("now ends at ", 1)[1].split()[0])
            assert old_end == activation + grace_s
            wait_for(lambda: new in r.served_keys(), "the new key published (no SIGHUP)")
            assert old in r.served_keys()  # beside the old one
            wait_for(
                lambda: any(v.keyid == new for v in verdicts),
                "signing with the new key",
                activation - time.time() + 3 * MAX_AGE_S + 10,
            )
            wait_for(lambda: time.time() > old_end + MAX_AGE_S + 0.5, "the grace and a cache lifetime")
            count = len(verdicts)
            wait_for(lambda: len(verdicts) > count + 10, "traffic after the grace period")
        elapsed_s = time.monotonic() - started
        refusals = [v.reason for v in verdicts if v.keyid is None]
        assert refusals == []
        assert statuses
        assert set(statuses) == {200}
        keyids = [v.keyid for v in verdicts]
        switch = keyids.index(new)
        assert set(keyids[:switch]) == {old}
        assert set(keyids[switch:]) == {new}  # once moved, never back
        assert verdicts[switch].created >= activation  # not a second early
        assert r.served_keys() == [new]  # after the grace only the new key is published
        # the verifier really cached: about one fetch per max-age whatever the request rate (a
        # verifier that did not would fetch for each of the hundreds of requests)
        fetches = r.origin.resolver.fetches
        assert 3 <= fetches <= elapsed_s / MAX_AGE_S + 3, (fetches, elapsed_s, len(verdicts))


def test_an_immediate_rotation_is_refused_by_a_caching_verifier_until_it_refetches(tmp_path: Path) -> None:
    """The control: the same verifier refuses a key it has not fetched yet (what `--now` warns of),
    and accepts it once its cached copy expires."""
    max_age_s = 6  # the rotation, the reload and a new-key request must all fit in one cache lifetime
    with rig(tmp_path, max_age_s) as r:
        verdicts = r.origin.verdicts
        with traffic(r) as statuses:
            # the first fetch starts with the first request: the copy it caches lives max_age_s from now
            wait_for(lambda: r.origin.resolver.fetches >= 1, "a fresh copy in the verifier's cache")
            new, _ = KeyStore(r.data).rotate(time.time(), grace_s=60)  # what `keys rotate --now` does
            assert r.keys.reload()  # what the refresh does within a second, now
            wait_for(
                lambda: any(v.keyid == new.thumbprint for v in verdicts),
                "the new key accepted",
                max_age_s + WAIT_S,
            )
        refused = [v.reason for v in verdicts if v.keyid is None]
        assert refused
        assert set(refused) == {"unknown-keyid"}
        assert 401 in statuses


# --- `signing-proxy run` as a child process --------------------------------------------------------


def cli(proxy: ProxyProcess, *args: str, thumbprint: str | None = None) -> subprocess.CompletedProcess[str]:
    """``signing-proxy ARGS --config <the proxy's> [-- THUMBPRINT]`` (a thumbprint may start with -)."""
    tail = ["--", thumbprint] if thumbprint else []
    return subprocess.run(
        [sys.executable, "-m", "signing_proxy", *args, "--config", str(proxy.tmp / "config.yaml"), *tail],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")},
    )


@contextmanager
def publishing_proxy(tmp: Path) -> Iterator[tuple[ProxyProcess, str]]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config = {
        "log": {"format": "json"},
        "signing": {"key": None, "signature_agent": base},  # no static key: the key store signs
        "publish": {"listen": f"127.0.0.1:{port}", "domain": "agent.example", "public_url": base},
    }
    with ProxyProcess(tmp, config) as proxy:
        assert proxy.publish_port == port
        yield proxy, base


def served_keys(base: str) -> list[str]:
    resp = session().get(base + DIRECTORY, timeout=WAIT_S)
    assert resp.status_code == 200, resp.text
    assert resp.headers["Content-Type"] == "application/jwk-set+json"
    return [k.thumbprint for k in parse_directory(resp.content).keys]


def count(proxy: ProxyProcess, text: str) -> int:
    return sum(text in line for line in proxy.stderr_lines)


def reloads(proxy: ProxyProcess) -> int:
    return count(proxy, "reloaded key store")


def sighup_and_wait(proxy: ProxyProcess, before: int) -> None:
    assert proxy.proc is not None
    proxy.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: reloads(proxy) > before, "the key store reload after SIGHUP")


def through(proxy: ProxyProcess, url: str, body: bytes = b"") -> requests.Response:
    return session().post(url, data=body, proxies={"http": proxy.url}, timeout=WAIT_S)


def test_revoked_key_stops_signing_at_once_and_no_valid_key_means_503(tmp_path: Path) -> None:
    with VerifyingOrigin(resolve_directories=True) as origin, publishing_proxy(tmp_path) as (proxy, base):
        (first,) = served_keys(base)
        before = reloads(proxy)
        done = cli(proxy, "keys", "rotate", "--now", "--grace", "1h")
        assert done.returncode == 0, done.stderr
        sighup_and_wait(proxy, before)
        assert through(proxy, origin.url("/a")).status_code == 200
        second = origin.arrivals[-1].keyids[0]
        assert second != first
        assert origin.arrivals[-1].verified
        pem = (tmp_path / "data" / "keys" / "default" / f"{second}.pem").read_bytes()

        before = reloads(proxy)
        done = cli(proxy, "keys", "revoke", thumbprint=second)
        assert done.returncode == 0, done.stderr
        sighup_and_wait(proxy, before)
        assert through(proxy, origin.url("/b")).status_code == 200
        arrival = origin.arrivals[-1]
        assert arrival.verified, arrival.reason
        assert arrival.keyids == [first]  # the revoked key never signed again; the old key took over
        assert second not in served_keys(base)
        revocations = session().get(base + REVOCATIONS, timeout=WAIT_S)
        assert revocations.headers["Cache-Control"] == "max-age=60"
        assert parse_revocation_list(revocations.content).revoked == {second}

        # A request signed with the revoked key (by someone who kept it) is refused by the verifier.
        url = origin.url("/stolen")
        fields = Fields(
            [
                ("Content-Digest", content_digest(b"")),
                ("Authorization", ""),
                ("Signature-Agent", serialize_sf_string(base)),
            ]
        )
        now = int(time.time())
        member = sign_message(
            Message("POST", parse_absolute_uri(url), fields),
            load_private_key(pem),
            created=now,
            expires=now + 60,
        )
        attach_signature(fields, member)
        headers: dict[str, Any] = dict(fields)
        session().post(url, data=b"", headers=headers, timeout=WAIT_S)
        stolen = origin.arrivals[-1]
        assert stolen.target_uri == url
        assert not stolen.verified
        assert second not in stolen.directory_keyids

        # Revoking the last valid key (forced): readiness fails, requests get 503, nothing unsigned leaves.
        assert cli(proxy, "keys", "revoke", thumbprint=first).returncode == 2
        before = reloads(proxy)
        done = cli(proxy, "keys", "revoke", "--force", thumbprint=first)
        assert done.returncode == 0, done.stderr
        sighup_and_wait(proxy, before)
        count = len(origin.arrivals)
        refused = through(proxy, origin.url("/c"))
        assert refused.status_code == 503
        assert refused.headers["Content-Type"] == "application/problem+json"
        assert refused.json()["reason"] == "no-valid-signing-key"
        assert len(origin.arrivals) == count
        ready = session().get(proxy.url + "/readyz", timeout=WAIT_S)
        assert ready.status_code == 503
        assert ready.json()["checks"]["signing_key"] == "no-valid-signing-key"
        directory = session().get(base + DIRECTORY, timeout=WAIT_S)
        assert directory.status_code == 503
        assert directory.json()["reason"] == "no-valid-key"

        # A rotation brings it back without a restart.
        before = reloads(proxy)
        assert cli(proxy, "keys", "rotate").returncode == 0
        sighup_and_wait(proxy, before)

        def ready_again() -> bool:  # the reload line awaited may be the previous step's late one: poll
            return session().get(proxy.url + "/readyz", timeout=WAIT_S).status_code == 200

        wait_for(ready_again, "readiness back after the rotation")
        assert through(proxy, origin.url("/d")).status_code == 200
        assert origin.arrivals[-1].verified


def test_a_registry_host_publishes_several_agents(tmp_path: Path) -> None:
    from signing_proxy.storage.keystore import KeyStore

    for agent in ("alice", "bob"):
        KeyStore(tmp_path / "data", agent).create(time.time(), lifetime_s=3600)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config = {
        "signing": {"key": None, "agent": "alice", "signature_agent": f"{base}/agents/alice"},
        "publish": {
            "listen": f"127.0.0.1:{port}",
            "domain": "registry.example",
            "public_url": base,
            "agents": ["alice", "bob"],
        },
    }
    with VerifyingOrigin(resolve_directories=True) as origin, ProxyProcess(tmp_path, config) as proxy:
        assert any("publishing on http://127.0.0.1:" in line for line in proxy.stderr_lines)
        assert through(proxy, origin.url("/x")).status_code == 200
        arrival = origin.arrivals[-1]
        assert arrival.verified, arrival.reason
        assert arrival.oracle == "ok"
        assert arrival.header("signature-agent") == f'"{base}/agents/alice"'
        assert arrival.keyids == served_keys(f"{base}/agents/alice")
        assert served_keys(f"{base}/agents/bob") != arrival.keyids
        done = cli(proxy, "keys", "list", "--agent", "bob")
        assert done.returncode == 0, done.stderr
        assert served_keys(f"{base}/agents/bob")[0] in done.stdout


# --- SIGHUP in relay mode ---------------------------------------------------------------------------

AGENT = SigningKey.from_seed(bytes(range(32)))


def agent_signed(url: str) -> dict[str, str]:
    """Headers of a request the agent signed (label ``agent``), for a relay to stack its label on."""
    fields = Fields(
        [
            ("Content-Digest", content_digest(b"")),
            ("Authorization", ""),
            ("Signature-Agent", serialize_sf_string("https://agent.example")),
        ]
    )
    now = int(time.time())
    member = sign_message(
        Message("POST", parse_absolute_uri(url), fields), AGENT, created=now, expires=now + 60
    )
    attach_signature(fields, member)
    return dict(fields)


def test_sighup_applies_the_label_and_the_key_store_to_a_relay(tmp_path: Path) -> None:
    """Issue 17: a relay kept the label read at start-up; now SIGHUP applies ``signing.label`` and
    the key store (a `keys rotate --now` signs the next request) as in agent mode."""
    config = {
        "mode": "relay",
        "log": {"format": "json"},
        "signing": {"key": None, "label": "broker"},  # the key store signs
        "relay": {"verify": False},  # the label and key under test are the relay's own
    }
    with VerifyingOrigin() as origin, ProxyProcess(tmp_path, config) as relay:
        store = KeyStore(tmp_path / "data")
        origin.trust(AGENT, *store.load(private=False).publics.values())
        url = origin.url("/relayed")
        first = session().post(url, headers=agent_signed(url), proxies={"http": relay.url}, timeout=WAIT_S)
        assert first.status_code == 200, first.text
        (old,) = store.load(private=False).records
        assert origin.arrivals[-1].labels == ["agent", "broker"]
        assert origin.arrivals[-1].keyids == [AGENT.thumbprint, old.thumbprint]

        relay.config["signing"]["label"] = "hop"
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(relay.config))
        rotated = cli(relay, "keys", "rotate", "--now")
        assert rotated.returncode == 0, rotated.stderr
        new = next(r for r in store.load(private=False).records if r.thumbprint != old.thumbprint)
        origin.trust(store.load(private=False).publics[new.thumbprint])
        reloaded, before = count(relay, "configuration reloaded"), reloads(relay)
        assert relay.proc is not None
        relay.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: count(relay, "configuration reloaded") > reloaded, "the configuration reload")
        wait_for(lambda: reloads(relay) > before, "the key store reload")

        second = session().post(url, headers=agent_signed(url), proxies={"http": relay.url}, timeout=WAIT_S)
        assert second.status_code == 200, second.text
        arrival = origin.arrivals[-1]
        assert arrival.verified, arrival.reason
        assert arrival.oracle == "ok", arrival.oracle
        assert arrival.labels == ["agent", "hop"]
        assert arrival.keyids == [AGENT.thumbprint, new.thumbprint]
        signature_input = arrival.header("signature-input") or ""
        assert 'hop=("@method"' in signature_input
        assert '"signature";key="agent")' in signature_input
