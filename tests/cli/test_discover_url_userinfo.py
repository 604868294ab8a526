"""``signing-proxy discover http://user:password@host/...`` printed the password: in the table, the
lines for an answer without ``X-Content-Rules`` or an unreachable URL, and the ``--json`` ``uri``.
Userinfo is never sent (``parse_authority`` drops it), so it is dropped before anything is shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from signing_proxy.core.jwk import SigningKey
from tests.harness import WAIT_S, free_port
from tests.proxy.publisher import Publisher

pytestmark = pytest.mark.integration

KEY = SigningKey.generate()
PASSWORD = "S3CRETPW"


@pytest.fixture(scope="module")
def publisher() -> Iterator[Publisher]:
    with Publisher(KEY) as pub:
        yield pub


def with_userinfo(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://agent:{PASSWORD}@{rest}"


def discover(tmp: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    key_path = tmp / "agent-key.pem"
    if not key_path.exists():
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(KEY.to_pem())
    config = tmp / "config.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), "signing": {"key": str(key_path)}}))
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    done = subprocess.run(
        [sys.executable, "-m", "signing_proxy", "discover", url, "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
        check=False,
        env=env,
    )
    assert PASSWORD not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    return done


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://u:pw@127.0.0.1:1/x", "http://127.0.0.1:1/x"),
        ("https://u:p@ss@example.com?q=a@b", "https://example.com?q=a@b"),  # the last "@" ends it
        ("http://u:pw@[::1]:8443#frag@x", "http://[::1]:8443#frag@x"),
        ("http://example.com/a@b", "http://example.com/a@b"),  # an "@" in the path is no userinfo
        ("http://example.com", "http://example.com"),
    ],
)
def test_without_userinfo_drops_only_the_userinfo(url: str, shown: str) -> None:
    from signing_proxy.cli.discover import without_userinfo  # here: the subprocess tests need it not

    assert without_userinfo(url) == shown


def test_the_table_and_json_of_a_refused_url_show_no_password(tmp_path: Path, publisher: Publisher) -> None:
    url = publisher.refused("v1.0")
    done = discover(tmp_path, with_userinfo(url))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith(f"refused:   {url} (403,")
    done = discover(tmp_path, with_userinfo(url), "--json")
    assert json.loads(done.stdout)["uri"] == url


def test_an_answer_without_content_rules_shows_no_password(tmp_path: Path, publisher: Publisher) -> None:
    url = publisher.edge.url("/ok")
    done = discover(tmp_path, with_userinfo(url))
    assert done.returncode == 1
    assert done.stdout.splitlines()[0].startswith(f"{url} answered ")
    done = discover(tmp_path, with_userinfo(url), "--json")
    assert json.loads(done.stdout)["uri"] == url


def test_an_unreachable_url_shows_no_password(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/x"  # nothing listens there
    done = discover(tmp_path, with_userinfo(url))
    assert done.returncode == 1
    assert done.stderr.startswith(f"{url}: ")
    done = discover(tmp_path, with_userinfo(url), "--json")
    assert json.loads(done.stdout)["uri"] == url
