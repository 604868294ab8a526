"""``signing-proxy discover URL`` as a real subprocess against a loopback publisher: the table, the
``--json`` document, and the exit status (0 usable exchange, 1 none, 2 bad input)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from signing_proxy.core.jwk import SigningKey
from tests.harness import WAIT_S
from tests.proxy.publisher import EXCHANGE_DOMAIN, INTERNAL_SECRET, RESALE_DOMAIN, Publisher

pytestmark = pytest.mark.integration

KEY = SigningKey.generate()


@pytest.fixture(scope="module")
def publisher() -> Iterator[Publisher]:
    with Publisher(KEY) as pub:
        yield pub


@pytest.fixture(autouse=True)
def _fresh(publisher: Publisher) -> None:
    publisher.clear()


def write_config(tmp: Path, **extra: Any) -> Path:
    key_path = tmp / "agent-key.pem"
    if not key_path.exists():
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(KEY.to_pem())
    config = {"data_dir": str(tmp / "data"), "signing": {"key": str(key_path)}, **extra}
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def discover(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.run(
        [sys.executable, "-m", "signing_proxy", "discover", *args],
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
        check=False,
        env=env,
    )


def test_a_refused_url_prints_the_manifest_and_its_exchanges(tmp_path: Path, publisher: Publisher) -> None:
    url = publisher.refused("v1.0")
    done = discover(url, "--config", str(write_config(tmp_path)))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"refused:   {url} (403, X-Content-Rules: {publisher.manifest_url('v1.0')})"
    assert lines[1] == f"manifest:  {publisher.manifest_url('v1.0')}"
    assert "ver 1.0" in lines[2]
    assert "role ROLE_PUBLISHER" in lines[2]
    header = next(i for i, line in enumerate(lines) if line.startswith("DOMAIN"))
    assert lines[header].split() == ["DOMAIN", "RELATIONSHIP", "ENDPOINT"]
    assert lines[header + 1].split() == [EXCHANGE_DOMAIN, "DIRECT", publisher.exchange_endpoint]
    assert lines[header + 2].split() == [RESALE_DOMAIN, "RESELLER", "https://resale.example/v1"]
    # the command's requests left signed, like the proxy's (the manifest is on the edge's origin)
    refused, fetched = publisher.edge.arrivals
    for arrival in (refused, fetched):
        assert arrival.verified, arrival.reason
        assert arrival.keyids == [KEY.thumbprint]


def test_json_output_is_the_problem_body_members(tmp_path: Path, publisher: Publisher) -> None:
    url = publisher.refused("v1.7")
    done = discover(url, "--config", str(write_config(tmp_path)), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["usable"] is True
    assert doc["status"] == 403
    assert doc["uri"] == url
    assert doc["manifest_url"] == publisher.manifest_url("v1.7")
    assert doc["manifest"]["ver"] == "1.7"
    assert [x["relationship"] for x in doc["exchanges"]] == ["DIRECT", "RESELLER"]
    assert doc["profile"] == "svc"


def test_the_profile_that_signed_is_named(tmp_path: Path, publisher: Publisher) -> None:
    """A ``profiles`` rule for the publisher's host: the table's last line and --json say so."""
    url = publisher.edge.url("/ok")
    config = str(
        write_config(tmp_path, profiles={"rules": [{"hosts": ["127.0.0.1"], "profile": "web-bot-auth"}]})
    )
    done = discover(url, "--config", config)
    assert done.stdout.splitlines()[-1] == "signed as: web-bot-auth"
    done = discover(url, "--config", config, "--json")
    assert json.loads(done.stdout)["profile"] == "web-bot-auth"
    arrival = publisher.edge.arrivals[-1]
    assert 'tag="web-bot-auth"' in (arrival.header("signature-input") or "")
    assert arrival.verified, arrival.reason


def test_only_the_head_of_a_large_answer_matters(tmp_path: Path, publisher: Publisher) -> None:
    done = discover(publisher.edge.url("/huge"), "--config", str(write_config(tmp_path)), "--json")
    assert done.returncode == 0, done.stderr  # the 3 MiB body is cut at 1 MiB, the 403 head is read
    assert json.loads(done.stdout)["usable"] is True


def test_discover_resources_from_the_config_adds_the_offers(tmp_path: Path, publisher: Publisher) -> None:
    url = publisher.refused("v1.0")
    config = write_config(
        tmp_path, discovery={"discover_resources": True}, egress={"allow_private": ["127.0.0.1/32"]}
    )
    done = discover(url, "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert f"DiscoverResources at {EXCHANGE_DOMAIN}: 200" in done.stdout
    assert '"offer_groups"' in done.stdout
    done = discover(url, "--config", str(config), "--json")
    offers = json.loads(done.stdout)["discover_resources"]["response"]["offer_groups"]
    assert offers[0]["uri"] == url


@pytest.mark.parametrize("name", ["v2.0", "missing", "other-domain"])
def test_a_refused_manifest_exits_1_with_its_reason(name: str, tmp_path: Path, publisher: Publisher) -> None:
    config = str(write_config(tmp_path))
    done = discover(publisher.refused(name), "--config", config)
    assert done.returncode == 1
    assert "unusable:  manifest-" in done.stdout
    assert "no usable exchange" in done.stdout
    done = discover(publisher.refused(name), "--config", config, "--json")
    assert done.returncode == 1
    doc = json.loads(done.stdout)
    assert doc["usable"] is False
    assert doc["manifest_error"]["reason"].startswith("manifest-")


def test_discovery_request_forgery_discover_applies_the_proxys_rules(
    tmp_path: Path, publisher: Publisher
) -> None:
    config = str(write_config(tmp_path, discovery={"discover_resources": True}))
    done = discover(publisher.refused("v1.0", remote=True), "--config", config, "--json")
    assert done.returncode == 1  # another port of the same host: not fetched
    assert json.loads(done.stdout)["manifest_error"]["reason"] == "manifest-cross-site"
    assert publisher.manifests.arrivals == []
    done = discover(publisher.refused("internal-plain"), "--config", config, "--json")
    assert done.returncode == 0, done.stderr  # the manifest is usable; its exchange is not asked
    assert json.loads(done.stdout)["discover_resources"]["error"]["reason"] == "egress-address"
    assert INTERNAL_SECRET not in done.stdout
    assert publisher.internal.arrivals == []


def test_nothing_to_discover_exits_1(tmp_path: Path, publisher: Publisher) -> None:
    config = str(write_config(tmp_path))
    done = discover(publisher.edge.url("/ok"), "--config", config)
    assert done.returncode == 1
    assert "answered 200 without X-Content-Rules" in done.stdout
    done = discover(publisher.edge.url("/forbidden"), "--config", config, "--json")
    assert done.returncode == 1
    assert json.loads(done.stdout) == {
        "uri": publisher.edge.url("/forbidden"),
        "status": 403,
        "usable": False,
        "detail": "answered 403 without X-Content-Rules: no manifest is named",
        "profile": "svc",
    }


def test_an_unreachable_url_exits_1(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connection refused
        done = discover(f"http://127.0.0.1:{port}/x", "--config", str(write_config(tmp_path)), "--json")
    assert done.returncode == 1
    assert json.loads(done.stdout)["error"]["reason"] == "upstream-connect-failed"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["not a url"], "URL:"),
        (["ftp://example.com/x"], "URL:"),
        (["http://127.0.0.1:9/x", "--config", "/nonexistent/config.yaml"], "configuration error"),
    ],
)
def test_bad_input_exits_2(args: list[str], message: str) -> None:
    done = discover(*args)
    assert done.returncode == 2
    assert message in done.stderr


def test_a_relay_configuration_exits_2(tmp_path: Path) -> None:
    config = write_config(tmp_path, mode="relay")
    done = discover("http://127.0.0.1:9/x", "--config", str(config))
    assert done.returncode == 2
    assert "mode: agent" in done.stderr
