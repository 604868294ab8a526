"""``keys rotate`` reads the publication listener's record (``served.json`` in the store folder):
the default wait is max(publish.directory_max_age_s, what a served copy may still be cached) + 30 s;
``--activate-in`` shorter than that warns; a missing or unusable record never blocks a rotation and
is named on stderr."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from signing_proxy.core.keys import parse_rfc3339
from signing_proxy.core.rotation import ROTATION_MARGIN_S
from signing_proxy.storage.keystore import KeyStore
from signing_proxy.storage.served import SERVED_NAME, renew_served
from tests.harness import run_cli

CONFIG_MAX_AGE_S = 600
SERVED_MAX_AGE_S = 7200


def setup(tmp_path: Path) -> tuple[KeyStore, str]:
    store = KeyStore(tmp_path / "data")
    store.create(time.time(), lifetime_s=90 * 86_400)
    config = tmp_path / "config.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\npublish:\n  directory_max_age_s: {CONFIG_MAX_AGE_S}\n")
    return store, str(config)


def activation(store: KeyStore) -> int:
    return max(store.load(private=False).records, key=lambda r: r.created_at).activation


def test_the_default_wait_follows_a_higher_served_max_age(tmp_path: Path) -> None:
    store, config = setup(tmp_path)
    renew_served(store.path, "listener", SERVED_MAX_AGE_S, time.time())
    before = math.ceil(time.time())
    done = run_cli("keys", "rotate", "--config", config)
    assert done.returncode == 0, done.stderr
    assert activation(store) >= before + SERVED_MAX_AGE_S + ROTATION_MARGIN_S
    line = next(x for x in done.stdout.splitlines() if "may be cached until" in x)
    assert f"a copy served with max-age {SERVED_MAX_AGE_S} may be cached until" in line
    assert parse_rfc3339(line.split("cached until ", 1)[1].split(",")[0]) >= before + SERVED_MAX_AGE_S
    assert "warning" not in done.stderr


def test_a_lower_served_max_age_changes_nothing(tmp_path: Path) -> None:
    store, config = setup(tmp_path)
    renew_served(store.path, "listener", 60, time.time())
    before = math.ceil(time.time())
    done = run_cli("keys", "rotate", "--config", config)
    assert done.returncode == 0, done.stderr
    assert before + CONFIG_MAX_AGE_S + ROTATION_MARGIN_S <= activation(store)
    assert activation(store) <= time.time() + CONFIG_MAX_AGE_S + ROTATION_MARGIN_S + 1
    assert "may be cached until" not in done.stdout
    assert done.stderr == ""


def test_an_activate_in_shorter_than_the_served_wait_warns(tmp_path: Path) -> None:
    store, config = setup(tmp_path)
    renew_served(store.path, "listener", SERVED_MAX_AGE_S, time.time())
    done = run_cli("keys", "rotate", "--config", config, "--activate-in", "1h")  # > 600 s + 30 s
    assert done.returncode == 0, done.stderr
    assert "warning: the new key signs before every cached copy of the directory can hold it" in done.stderr
    assert f"a copy served with max-age {SERVED_MAX_AGE_S} may be cached until" in done.stderr


def test_a_missing_record_is_named_and_the_configured_max_age_is_waited_for(tmp_path: Path) -> None:
    store, config = setup(tmp_path)
    before = math.ceil(time.time())
    done = run_cli("keys", "rotate", "--config", config)
    assert done.returncode == 0, done.stderr
    assert str(store.path / SERVED_NAME) in done.stderr
    assert "warning" not in done.stderr  # a store published as static files has none: the usual case
    assert before + CONFIG_MAX_AGE_S + ROTATION_MARGIN_S <= activation(store)


def test_a_corrupt_record_is_ignored_with_a_warning_naming_it(tmp_path: Path) -> None:
    store, config = setup(tmp_path)
    path = store.path / SERVED_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write('{"format": "something else"')
    before = math.ceil(time.time())
    done = run_cli("keys", "rotate", "--config", config)
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("warning: ignoring")]
    assert str(path) in line
    assert "served-unusable" in line
    assert before + CONFIG_MAX_AGE_S + ROTATION_MARGIN_S <= activation(store)
    assert activation(store) <= time.time() + CONFIG_MAX_AGE_S + ROTATION_MARGIN_S + 1


def test_now_reads_no_record(tmp_path: Path) -> None:
    store, config = setup(tmp_path)
    (store.path / SERVED_NAME).mkdir()  # unreadable: --now never looks
    done = run_cli("keys", "rotate", "--config", config, "--now")
    assert done.returncode == 0, done.stderr
    assert SERVED_NAME not in done.stderr
    assert "verifiers that cached it refuse our requests until they re-fetch it" in done.stderr
