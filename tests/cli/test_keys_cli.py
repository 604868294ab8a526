"""``signing-proxy keys list|rotate|revoke|prune`` and ``publish`` through real subprocesses."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.cli.main import main
from signing_proxy.client.signer import Signer
from signing_proxy.config import load_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import parse_directory, parse_rfc3339, render_directory
from signing_proxy.core.rotation import CLOCK_MARGIN_S
from signing_proxy.storage.keystore import KeyStore, StoreKeyProvider
from tests.harness import run_cli, started_run


def listing(data: Path, *args: str) -> dict[str, Any]:
    done = run_cli("keys", "list", "--json", "--data-dir", str(data), *args)
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


@pytest.mark.parametrize(
    "command",
    [["keys", "list"], ["keys", "rotate"], ["keys", "revoke"], ["keys", "prune"], ["publish"]],
)
def test_every_new_command_has_help(command: list[str]) -> None:
    done = run_cli(*command, "--help")
    assert done.returncode == 0
    assert "usage: signing-proxy" in done.stdout
    for flag in ("--config", "--data-dir"):
        assert flag in done.stdout
    if command[0] == "keys":
        assert "--agent" in done.stdout


def test_list_without_a_store_says_how_to_make_one(tmp_path: Path) -> None:
    done = run_cli("keys", "list", "--data-dir", str(tmp_path))
    assert done.returncode == 2
    assert str(tmp_path / "keys" / "default") in done.stderr
    assert "keys rotate" in done.stderr


def test_the_key_lifecycle_through_the_cli(tmp_path: Path) -> None:
    data = str(tmp_path)
    first = run_cli("keys", "rotate", "--data-dir", data, "--lifetime", "30d")
    assert first.returncode == 0, first.stderr
    assert "created the key store" in first.stdout
    doc = listing(tmp_path)
    (a,) = doc["keys"]
    assert a["state"] == "signing"
    # signs for 30 days; its window opens CLOCK_MARGIN_S earlier, for verifiers whose clock is behind
    assert parse_rfc3339(a["not_after"]) - parse_rfc3339(a["not_before"]) == 30 * 86_400 + CLOCK_MARGIN_S
    assert doc["signing"] == a["thumbprint"]

    # Publish first, sign later: the default waits out the directory's max-age (3600 s) + 30 s.
    started = time.time()
    second = run_cli("keys", "rotate", "--data-dir", data, "--grace", "48h")
    assert second.returncode == 0, second.stderr
    assert "warning" not in second.stderr
    doc = listing(tmp_path)
    states = {k["thumbprint"]: k for k in doc["keys"]}
    b = next(k for t, k in states.items() if t != a["thumbprint"])
    assert b["state"] == "published"
    assert doc["signing"] == a["thumbprint"]
    assert states[a["thumbprint"]]["state"] == "signing"
    activation = parse_rfc3339(b["activates_at"])
    assert started + 3630 <= activation <= time.time() + 3631
    assert parse_rfc3339(b["not_before"]) <= time.time()  # valid, hence published, at once
    assert b["next_change"] == {"state": "signing", "at": b["activates_at"]}
    assert states[a["thumbprint"]]["next_change"] == {"state": "retiring", "at": b["activates_at"]}
    assert parse_rfc3339(states[a["thumbprint"]]["not_after"]) == activation + 48 * 3600
    assert parse_rfc3339(b["not_after"]) - activation == 90 * 86_400  # the default, from activation
    assert f"new key {b['thumbprint']}: published now, signs from {b['activates_at']}" in second.stdout
    assert f"key {a['thumbprint']}: signs until {b['activates_at']}, then retiring" in second.stdout

    text = run_cli("keys", "list", "--data-dir", data)
    assert text.returncode == 0
    assert "THUMBPRINT" in text.stdout
    assert "NEXT" in text.stdout
    assert f"{a['thumbprint']}  signing" in text.stdout
    assert f"{b['thumbprint']}  published" in text.stdout
    assert f"signing at {b['activates_at']}" in text.stdout

    pending = run_cli("keys", "rotate", "--data-dir", data)
    assert pending.returncode == 2
    assert "already waiting" in pending.stderr

    revoked = run_cli("keys", "revoke", "--data-dir", data, "--", b["thumbprint"])
    assert revoked.returncode == 0, revoked.stderr
    assert "never signs again" in revoked.stdout
    doc = listing(tmp_path)
    assert doc["revocations"]["revoked"] == [b["thumbprint"]]
    assert doc["signing"] == a["thumbprint"]
    again = run_cli("keys", "revoke", "--data-dir", data, "--", b["thumbprint"])
    assert again.returncode == 0
    assert "already revoked" in again.stdout

    # The emergency: --now signs at once and says what it costs.
    now = run_cli("keys", "rotate", "--data-dir", data, "--now")
    assert now.returncode == 0, now.stderr
    assert "signs now" in now.stdout
    assert "verifiers that cached it refuse our requests until they re-fetch it" in now.stderr
    doc = listing(tmp_path)
    c = doc["signing"]
    assert c not in (a["thumbprint"], b["thumbprint"])
    assert {k["thumbprint"]: k["state"] for k in doc["keys"]}[a["thumbprint"]] == "retiring"
    assert run_cli("keys", "revoke", "--data-dir", data, "--", c).returncode == 0
    assert listing(tmp_path)["signing"] == a["thumbprint"]  # back to the old key, still in grace

    last = run_cli("keys", "revoke", "--data-dir", data, "--", a["thumbprint"])
    assert last.returncode == 2
    assert "no valid signing key" in last.stderr
    assert "--force" in last.stderr
    forced = run_cli("keys", "revoke", "--data-dir", data, "--force", "--", a["thumbprint"])
    assert forced.returncode == 0, forced.stderr
    assert listing(tmp_path)["signing"] is None
    assert "no key is valid now" in run_cli("keys", "list", "--data-dir", data).stdout

    assert run_cli("keys", "prune", "--data-dir", data).returncode == 2  # would leave no valid key
    pruned = run_cli("keys", "prune", "--data-dir", data, "--force")
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.count("stays in the revocation list") == 3
    doc = listing(tmp_path)
    assert doc["keys"] == []
    assert sorted(doc["revocations"]["revoked"]) == sorted([a["thumbprint"], b["thumbprint"], c])
    assert "(pruned)" in run_cli("keys", "list", "--data-dir", data).stdout


def write_config(tmp_path: Path, max_age_s: int) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(f"data_dir: {tmp_path / 'data'}\npublish:\n  directory_max_age_s: {max_age_s}\n")
    return str(path)


def test_the_default_activation_follows_the_configured_max_age(tmp_path: Path) -> None:
    KeyStore(tmp_path / "data").create(time.time(), lifetime_s=86_400)
    started = time.time()
    done = run_cli("keys", "rotate", "--config", write_config(tmp_path, 60))
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
    new = next(k for k in listing(tmp_path / "data")["keys"] if k["state"] == "published")
    assert started + 90 <= parse_rfc3339(new["activates_at"]) <= time.time() + 91  # 60 s + 30 s


def test_an_activation_sooner_than_the_max_age_warns(tmp_path: Path) -> None:
    KeyStore(tmp_path / "data").create(time.time(), lifetime_s=86_400)
    done = run_cli("keys", "rotate", "--config", write_config(tmp_path, 600), "--activate-in", "5m")
    assert done.returncode == 0, done.stderr
    assert "publish.directory_max_age_s is 600 s" in done.stderr


def test_the_default_activation_never_outlives_the_current_key(tmp_path: Path) -> None:
    """A key ending sooner than max-age + 30 s hands over at its end: no gap, no refusal."""
    old = KeyStore(tmp_path).create(time.time() - 3600, lifetime_s=3600 + 600)  # ends in ~10 minutes
    done = run_cli("keys", "rotate", "--data-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "warning" in done.stderr  # sooner than the max-age: caches may still lack it
    new = next(k for k in listing(tmp_path)["keys"] if k["thumbprint"] != old.thumbprint)
    assert parse_rfc3339(new["activates_at"]) == old.not_after


def test_a_grace_shorter_than_the_signature_validity_is_refused(tmp_path: Path) -> None:
    """A rotation cuts the old key's window to the activation + grace, but a signature the old key
    made just before says ``expires`` ``signing.validity_s`` (300 s) after it: a verifier holding the
    new directory would refuse it, unexpired, as outside its key's window. Refused, ``--now``
    included, before anything is written; the numbers and the fix in one line."""
    data = tmp_path / "data"
    store = KeyStore(data)
    store.create(time.time(), lifetime_s=86_400)
    before = store.index_path.read_bytes()
    for when in (["--activate-in", "90s"], ["--now"], []):  # the reviewer's case, the emergency, default
        done = run_cli("keys", "rotate", "--data-dir", str(data), "--grace", "60s", *when)
        assert done.returncode == 2, done.stdout
        assert "--grace 60s is shorter than signing.validity_s (300 seconds) plus the 1 s" in done.stderr
        assert "use --grace 301s or longer" in done.stderr
        assert len(done.stderr.splitlines()) == 1
        assert store.index_path.read_bytes() == before  # no new key, no window cut
    assert run_cli("keys", "rotate", "--data-dir", str(data), "--grace", "300s").returncode == 2
    assert run_cli("keys", "rotate", "--data-dir", str(data), "--grace", "301s").returncode == 0


def test_the_old_key_outlives_every_signature_it_made_before_the_rotation(tmp_path: Path) -> None:
    """The shortest grace accepted (signing.validity_s + 1 s) keeps a signature the old key made
    before an immediate rotation verifiable by its window in the new directory until it expires."""
    config = tmp_path / "config.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\nsigning:\n  validity_s: 30\n")
    store = KeyStore(tmp_path / "data")
    old = store.create(time.time(), lifetime_s=86_400)
    signer = Signer(StoreKeyProvider(store), load_config(config))
    signed = signer.sign("GET", "https://exchange.example/x", [], b"")
    assert signed is not None
    assert signed.keyid == old.thumbprint
    params = dict(signed.fields)["Signature-Input"]
    expires = int(params.split("expires=", 1)[1].split(";", 1)[0])
    refused = run_cli("keys", "rotate", "--config", str(config), "--now", "--grace", "30s")
    assert refused.returncode == 2
    assert "signing.validity_s (30 seconds)" in refused.stderr
    done = run_cli("keys", "rotate", "--config", str(config), "--now", "--grace", "31s")
    assert done.returncode == 0, done.stderr
    state = store.load(private=False)
    assert state.record(old.thumbprint) != old  # the rotation did cut the old key's window
    directory = parse_directory(render_directory(state.directory(time.time(), None)))
    assert directory.find(old.thumbprint, expires - 1) is not None  # the signature's last second


def test_now_and_activate_in_are_exclusive(tmp_path: Path) -> None:
    KeyStore(tmp_path).create(time.time(), lifetime_s=3600)
    done = run_cli("keys", "rotate", "--data-dir", str(tmp_path), "--now", "--activate-in", "1h")
    assert done.returncode == 2
    assert "not allowed with" in done.stderr


def test_revoking_the_signing_key_during_a_rotation_signs_with_the_published_one(tmp_path: Path) -> None:
    old = KeyStore(tmp_path).create(time.time(), lifetime_s=86_400)
    assert run_cli("keys", "rotate", "--data-dir", str(tmp_path)).returncode == 0
    done = run_cli("keys", "revoke", "--data-dir", str(tmp_path), "--", old.thumbprint)  # no --force
    assert done.returncode == 0, done.stderr
    assert "before its activation" in done.stdout
    doc = listing(tmp_path)
    new = next(k for k in doc["keys"] if k["thumbprint"] != old.thumbprint)
    assert doc["signing"] == new["thumbprint"]
    assert new["state"] == "signing"


def test_prune_drops_expired_keys_only(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    old = store.create(time.time() - 5000, lifetime_s=1000)  # expired long ago
    fresh, _ = store.rotate(time.time(), grace_s=60, lifetime_s=3600)
    done = run_cli("keys", "prune", "--data-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert f"pruned {old.thumbprint} (expired" in done.stdout
    assert [k["thumbprint"] for k in listing(tmp_path)["keys"]] == [fresh.thumbprint]
    assert not store.key_path(old.thumbprint).exists()
    assert "nothing to prune" in run_cli("keys", "prune", "--data-dir", str(tmp_path)).stdout


def test_agent_selects_a_separate_store(tmp_path: Path) -> None:
    assert run_cli("keys", "rotate", "--data-dir", str(tmp_path), "--agent", "alice").returncode == 0
    assert (tmp_path / "keys" / "alice" / "keys.json").exists()
    assert not (tmp_path / "keys" / "default").exists()
    assert len(listing(tmp_path, "--agent", "alice")["keys"]) == 1
    bad = run_cli("keys", "list", "--data-dir", str(tmp_path), "--agent", "../etc")
    assert bad.returncode == 2
    assert "agent name" in bad.stderr


@pytest.mark.parametrize(
    "args", [["--grace", "2 days"], ["--grace", "0s"], ["--lifetime", "90"], ["--activate-in=-1h"]]
)
def test_bad_durations_are_refused(tmp_path: Path, args: list[str]) -> None:
    KeyStore(tmp_path).create(time.time(), lifetime_s=3600)
    done = run_cli("keys", "rotate", "--data-dir", str(tmp_path), *args)
    assert done.returncode == 2
    assert "duration" in done.stderr or "seconds" in done.stderr


def test_an_unknown_thumbprint_and_a_permission_open_store_are_refused(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    store.create(time.time(), lifetime_s=3600)
    unknown = run_cli("keys", "revoke", "--data-dir", str(tmp_path), "--", SigningKey.generate().thumbprint)
    assert unknown.returncode == 2
    assert "has no key" in unknown.stderr
    store.path.chmod(0o755)
    for command in (["list"], ["rotate"], ["prune"]):
        done = run_cli("keys", *command, "--data-dir", str(tmp_path))
        assert done.returncode == 2
        assert str(store.path) in done.stderr
        assert "chmod 700" in done.stderr


def test_run_refuses_a_malformed_store_with_its_path(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    store.create(time.time(), lifetime_s=3600)
    store.index_path.write_text('{"format": "signing-proxy-keystore/1"}')
    done = run_cli("run", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path))
    assert done.returncode == 2
    assert str(store.index_path) in done.stderr
    assert "malformed index" in done.stderr


def test_run_imports_a_legacy_key_into_the_store(tmp_path: Path) -> None:
    legacy = SigningKey.generate()
    path = tmp_path / "agent-key.pem"
    path.write_bytes(legacy.to_pem())
    path.chmod(0o600)
    with started_run("--listen", "127.0.0.1:0", "--data-dir", str(tmp_path)) as lines:
        assert f"keyid={legacy.thumbprint}" in lines[-1]
        assert any("imported the signing key" in ln and legacy.thumbprint in ln for ln in lines)
    assert [k["thumbprint"] for k in listing(tmp_path)["keys"]] == [legacy.thumbprint]


def test_publish_needs_a_domain_and_a_valid_key(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "data")
    store.create(time.time() - 7200, lifetime_s=3600)  # already expired
    out = tmp_path / "public"
    publish = ("publish", "--out", str(out), "--data-dir", str(tmp_path / "data"))
    done = run_cli(*publish)
    assert done.returncode == 2
    assert "publish.domain is required" in done.stderr
    done = run_cli(*publish, "--domain", "agent.example")
    assert done.returncode == 2
    assert "must be valid" in done.stderr
    assert not out.exists()
    assert run_cli("keys", "rotate", "--data-dir", str(tmp_path / "data")).returncode == 0
    done = run_cli(*publish, "--domain", "agent.example")
    assert done.returncode == 0, done.stderr
    assert (out / ".well-known/svc.json").read_bytes() == (
        b'{"ver":"1.0","role":"ROLE_AGENT","domain":"agent.example"}'
    )


def test_publish_follows_no_link_planted_at_its_temporary_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another user who can write to the document root plants a link where ``publish --out`` puts
    its temporary file, a name it could guess (``.NAME.PID.tmp``): publish wrote through the link
    into its target, then renamed the link into place. In-process (``main``): the PID is this one."""
    data, out = tmp_path / "data", tmp_path / "public"
    KeyStore(data).create(time.time(), lifetime_s=86_400)
    names = ("http-message-signatures-directory", "svc.json", "http-message-signatures-revocations.json")
    (out / ".well-known").mkdir(parents=True)
    victims = {}
    for name in names:
        victims[name] = tmp_path / f"victim-{name}"
        victims[name].write_text("another user's file\n")
        (out / ".well-known" / f".{name}.{os.getpid()}.tmp").symlink_to(victims[name])
    status = main(["publish", "--out", str(out), "--data-dir", str(data), "--domain", "agent.example"])
    assert status == 0, capsys.readouterr().err
    for name in names:
        assert victims[name].read_text() == "another user's file\n"  # not written through the link
        published = out / ".well-known" / name
        assert not published.is_symlink()
        assert published.is_file()
        assert stat.S_IMODE(published.stat().st_mode) == 0o644  # served to anyone, as before
    assert (out / ".well-known/svc.json").read_bytes() == (
        b'{"ver":"1.0","role":"ROLE_AGENT","domain":"agent.example"}'
    )
    assert b'"keys"' in (out / ".well-known/http-message-signatures-directory").read_bytes()


def test_a_thumbprint_starting_with_a_dash_is_revoked_after_double_dash(tmp_path: Path) -> None:
    key = next(
        k for k in (SigningKey.from_seed(bytes([i]) * 32) for i in range(256)) if k.thumbprint[0] == "-"
    )
    store = KeyStore(tmp_path)
    store.create(time.time(), lifetime_s=3600, key=key)
    store.rotate(time.time(), grace_s=600, lifetime_s=3600)
    done = run_cli("keys", "revoke", "--data-dir", str(tmp_path), "--", key.thumbprint)
    assert done.returncode == 0, done.stderr
    assert listing(tmp_path)["revocations"]["revoked"] == [key.thumbprint]


def test_keys_generate_and_show_take_a_file_or_a_token_key_not_both(tmp_path: Path) -> None:
    neither = run_cli("keys", "generate")
    assert neither.returncode == 2
    assert "--out PATH (a key file) or --pkcs11 URI" in neither.stderr
    both = run_cli("keys", "generate", "--out", str(tmp_path / "k.pem"), "--pkcs11", "pkcs11:object=k")
    assert both.returncode == 2
    assert "either --out or --pkcs11" in both.stderr
    assert not (tmp_path / "k.pem").exists()
    show = run_cli("keys", "show")
    assert show.returncode == 2
    assert "PATH or --pkcs11 URI" in show.stderr
    bad = run_cli("keys", "show", "--pkcs11", "pkcs11:token=t")  # names no key object
    assert bad.returncode == 2
    assert "--pkcs11: name the key" in bad.stderr


def test_the_note_about_signing_key_never_shows_a_pin(tmp_path: Path) -> None:
    """RFC 7512 lets a PKCS#11 URI carry its PIN (pin-value): the note named the key unmasked."""
    config = tmp_path / "config.yaml"
    uri = "pkcs11:token=t;object=k?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-value=SECRET-PIN-4711"
    config.write_text(f'data_dir: {tmp_path / "data"}\nsigning:\n  key: "{uri}"\n')
    done = run_cli("keys", "list", "--config", str(config))
    assert "signing.key is set (pkcs11:token=t;object=k" in done.stderr
    assert "SECRET-PIN-4711" not in done.stdout + done.stderr


def test_an_index_time_that_cannot_be_shown_is_refused_naming_the_file(tmp_path: Path) -> None:
    """``keys list`` died with a traceback on ``9999-12-31T23:59:60Z``, read but never writable."""
    data = tmp_path / "data"
    assert run_cli("keys", "rotate", "--data-dir", str(data)).returncode == 0
    index = next(data.rglob("keys.json"))
    doc = json.loads(index.read_text())
    doc["keys"][0]["not_after"] = "9999-12-31T23:59:60Z"
    index.write_text(json.dumps(doc))
    done = run_cli("keys", "list", "--data-dir", str(data))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert str(index) in done.stderr
    assert "9999-12-31T23:59:60Z" in done.stderr
