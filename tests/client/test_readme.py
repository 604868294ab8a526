"""The README's "Sign inside a Python agent" examples, as written: each runs in a fresh interpreter
next to a ``signing-proxy.yaml`` (its key store created on first use), against a verifying origin
that stands in for ``https://example.com/``; each prints 200 and the origin verified what arrived
(our verifier and ``http-message-signatures``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from signing_proxy.config import parse_config
from signing_proxy.service.keys import key_provider_for
from tests.harness import VerifyingOrigin

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Sign inside a Python agent"
URL = "https://example.com/"


def readme_examples() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    start = readme.index(SECTION)
    section = readme[start : readme.index("\n## ", start + len(SECTION))]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def test_the_section_has_one_short_example_per_library() -> None:
    examples = readme_examples()
    firsts = [example.splitlines()[0] for example in examples]
    assert firsts == ["import httpx", "import requests", "import asyncio, aiohttp"]
    for example in examples:
        assert URL in example
        assert len([line for line in example.splitlines() if line.strip()]) <= 7


@pytest.mark.integration
@pytest.mark.parametrize("index", [0, 1, 2], ids=["httpx", "requests", "aiohttp"])
def test_each_example_runs_as_written_and_is_verified(tmp_path: Path, index: int) -> None:
    raw = {"data_dir": str(tmp_path / "data"), "signing": {"signature_agent": "https://agent.example"}}
    (tmp_path / "signing-proxy.yaml").write_text(yaml.safe_dump(raw))
    key = key_provider_for(parse_config(raw)).current(
        time.time()
    )  # the key store, as the example will open it
    assert key is not None
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    with VerifyingOrigin() as origin:
        origin.trust(key)
        script = readme_examples()[index].replace(URL, origin.url("/"))
        run = subprocess.run(
            [sys.executable, "-c", script],
            cwd=tmp_path,
            env={**env, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "200"
    [arrival] = origin.arrivals
    assert (arrival.verified, arrival.oracle, arrival.keyids) == (True, "ok", [key.thumbprint])
