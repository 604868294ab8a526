"""The key store on disk: layout and modes, atomic writes, refusals, rotate/revoke/prune semantics,
and ``StoreKeyProvider`` choosing the key second by second from memory, picking up changes on reload."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from signing_proxy.core.durations import parse_duration
from signing_proxy.core.jwk import PRIVATE_JWK_MEMBERS, SigningKey, load_private_key
from signing_proxy.core.keys import RevocationList, format_rfc3339, parse_directory, render_directory
from signing_proxy.core.rotation import CLOCK_MARGIN_S
from signing_proxy.storage.keyindex import IndexEntry, parse_index, render_index
from signing_proxy.storage.keystore import (
    KeyStore,
    KeyStoreError,
    StoreKeyProvider,
    StoreWatcher,
    open_or_create,
)

T = 1_800_000_000  # 2027-01-15T08:00:00Z: every time below is relative to it


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def store(tmp_path: Path) -> KeyStore:
    s = KeyStore(tmp_path / "data")
    s.create(T, lifetime_s=1000)
    return s


def index(store: KeyStore) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(store.index_path.read_text())
    return doc


# --- layout, modes, atomic writes ---------------------------------------------------------------


def test_create_writes_an_owner_only_store_named_by_thumbprint(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "data")
    record = store.create(T + 0.7, lifetime_s=1000)
    assert store.path == tmp_path / "data" / "keys" / "default"
    assert mode(store.root) == 0o700
    assert mode(store.path) == 0o700
    assert mode(store.index_path) == 0o600
    pem = store.key_path(record.thumbprint)
    assert mode(pem) == 0o600
    assert load_private_key(pem.read_bytes()).thumbprint == record.thumbprint
    assert (record.not_before, record.activation, record.not_after) == (T - CLOCK_MARGIN_S, T, T + 1000)
    doc = index(store)
    assert doc == {
        "format": "signing-proxy-keystore/1",
        "agent": "default",
        "keys": [
            {
                "thumbprint": record.thumbprint,
                "x": load_private_key(pem.read_bytes()).public.jwk()["x"],
                "not_before": format_rfc3339(T - CLOCK_MARGIN_S),
                "not_after": format_rfc3339(T + 1000),
                "created_at": format_rfc3339(T),
                "activates_at": format_rfc3339(T),
            }
        ],
        "revocations": {"as_of": format_rfc3339(T), "revoked": []},
    }
    assert not [p for p in store.path.iterdir() if p.name.endswith(".tmp")]
    with pytest.raises(KeyStoreError, match="already exists"):
        store.create(T, lifetime_s=1000)


def test_every_change_replaces_the_index_atomically(store: KeyStore) -> None:
    before = store.index_path.stat().st_ino
    store.rotate(T + 100, grace_s=50, lifetime_s=1000)
    assert store.index_path.stat().st_ino != before  # a new file renamed over the old one
    assert mode(store.index_path) == 0o600
    assert not [p for p in store.path.iterdir() if p.name.endswith(".tmp")]


def test_a_failed_write_leaves_the_previous_store_intact(
    store: KeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = store.index_path.read_bytes()

    def fail(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space"):
        store.rotate(T + 100, grace_s=50, lifetime_s=1000)
    monkeypatch.undo()
    assert store.index_path.read_bytes() == before
    assert not [p for p in store.path.iterdir() if p.name.endswith(".tmp")]
    assert len(store.load().records) == 1


# --- refusals -----------------------------------------------------------------------------------


def _corrupt(store: KeyStore, change: Any) -> None:
    doc = index(store)
    change(doc)
    store.index_path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("keys"), "lacks member 'keys'"),
        (lambda d: d.update(extra=1), "unknown member 'extra'"),
        (lambda d: d.update(format="signing-proxy-keystore/9"), "format"),
        (lambda d: d.update(agent="alice"), "belongs to agent 'alice'"),
        (lambda d: d["keys"][0].update(thumbprint="not-a-thumbprint"), "not an RFC 7638 thumbprint"),
        (lambda d: d["keys"][0].update(x=SigningKey.generate().public.jwk()["x"]), "does not hash"),
        (lambda d: d["keys"][0].update(not_after=d["keys"][0]["not_before"]), "earlier than not_after"),
        (lambda d: d["keys"][0].update(not_before="yesterday"), "RFC 3339"),
        (lambda d: d["keys"].append(dict(d["keys"][0])), "listed twice"),
        (lambda d: d["keys"][0].pop("created_at"), "lacks member 'created_at'"),
        (lambda d: d["revocations"].update(revoked=["x"]), "thumbprint"),
        (lambda d: d["revocations"].pop("as_of"), "lacks member 'as_of'"),
    ],
)
def test_a_malformed_index_is_refused_naming_the_file(store: KeyStore, change: Any, message: str) -> None:
    _corrupt(store, change)
    with pytest.raises(KeyStoreError) as err:
        store.load()
    assert err.value.reason == "store-malformed"
    assert str(store.index_path) in str(err.value)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "content", [b"", b"{", b"[]", b'{"a":1,"a":2}', b"\xff\xfe", b"NaN", b"[" * 5000 + b"]" * 5000]
)
def test_an_index_that_is_not_json_is_refused(store: KeyStore, content: bytes) -> None:
    store.index_path.write_bytes(content)
    with pytest.raises(KeyStoreError, match="malformed index"):
        store.load()


def test_a_key_file_holding_another_key_is_refused(store: KeyStore) -> None:
    (record,) = store.load().records
    path = store.key_path(record.thumbprint)
    path.write_bytes(SigningKey.generate().to_pem())
    with pytest.raises(KeyStoreError) as err:
        store.load()
    assert err.value.reason == "key-file-mismatch"
    assert str(path) in str(err.value)
    assert store.load(private=False).records == (record,)  # publishing reads only the index


def test_a_missing_or_broken_key_file_is_refused(store: KeyStore) -> None:
    (record,) = store.load().records
    path = store.key_path(record.thumbprint)
    path.write_bytes(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    with pytest.raises(KeyStoreError, match="not a usable Ed25519 private key"):
        store.load()
    path.unlink()
    with pytest.raises(KeyStoreError, match="does not exist"):
        store.load()


@pytest.mark.parametrize("which", ["root", "store", "index", "key"])
@pytest.mark.parametrize("bits", [0o040, 0o004, 0o020])
def test_a_permission_open_store_is_refused_with_the_fix(store: KeyStore, which: str, bits: int) -> None:
    (record,) = store.load().records
    path = {
        "root": store.root,
        "store": store.path,
        "index": store.index_path,
        "key": store.key_path(record.thumbprint),
    }[which]
    path.chmod(mode(path) | bits)
    with pytest.raises(KeyStoreError) as err:
        store.load()
    assert err.value.reason in ("store-permissions", "key-permissions")
    assert str(path) in str(err.value)
    assert "owner only" in str(err.value)
    assert "chmod" in str(err.value)


def test_a_missing_store_says_how_to_create_one(tmp_path: Path) -> None:
    with pytest.raises(KeyStoreError) as err:
        KeyStore(tmp_path, "alice").load()
    assert err.value.reason == "store-missing"
    assert str(tmp_path / "keys" / "alice") in str(err.value)
    assert "keys rotate --agent alice" in str(err.value)


@pytest.mark.parametrize("name", ["", "Alice", "../x", ".hidden", "a/b", "a" * 64, "é"])
def test_agent_names_are_safe_path_segments(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="agent name"):
        KeyStore(tmp_path, name)


def test_agents_have_separate_stores(tmp_path: Path) -> None:
    alice, bob = KeyStore(tmp_path, "alice"), KeyStore(tmp_path, "bob")
    a, b = alice.create(T, lifetime_s=100), bob.create(T, lifetime_s=100)
    assert alice.path == tmp_path / "keys" / "alice"
    assert [r.thumbprint for r in alice.load().records] == [a.thumbprint]
    assert [r.thumbprint for r in bob.load().records] == [b.thumbprint]


# --- rotate -------------------------------------------------------------------------------------


def test_rotate_publishes_the_new_key_beside_the_old_and_moves_signing(store: KeyStore) -> None:
    (old,) = store.load().records
    new, moved = store.rotate(T + 100.4, grace_s=50, lifetime_s=1000)
    # valid now, and to a verifier up to CLOCK_MARGIN_S behind; signing from now
    assert (new.not_before, new.activation, new.not_after) == (T + 100 - CLOCK_MARGIN_S, T + 100, T + 1100)
    assert [(r.thumbprint, r.not_after) for r in moved] == [(old.thumbprint, T + 151)]  # now + grace
    state = store.load()
    assert {r.thumbprint for r in state.records} == {old.thumbprint, new.thumbprint}
    assert state.signing_record(T + 100.4) == new
    assert state.state_of(new, T + 101) == "signing"
    assert state.state_of(state.record(old.thumbprint), T + 101) == "retiring"  # type: ignore[arg-type]
    directory = parse_directory(render_directory(state.directory(T + 101, None), now=T + 101))
    assert {k.thumbprint for k in directory.keys} == {old.thumbprint, new.thumbprint}
    after_grace = state.directory(T + 151, None)
    assert [k.thumbprint for k in after_grace.keys] == [new.thumbprint]


def test_rotate_never_lengthens_an_old_window(store: KeyStore) -> None:
    (old,) = store.load().records
    _new, moved = store.rotate(T + 900, grace_s=48 * 3600, lifetime_s=1000)
    assert moved == ()
    assert store.load().record(old.thumbprint) == old


def test_rotate_twice_in_one_second_still_signs_with_the_newest(store: KeyStore) -> None:
    first, _ = store.rotate(T + 100.1, grace_s=50, lifetime_s=1000)
    second, _ = store.rotate(T + 100.2, grace_s=50, lifetime_s=1000)
    assert first.not_before == second.not_before
    assert store.load().signing_record(T + 100.5) == second


def test_rotate_with_activate_in_publishes_first_and_signs_later(store: KeyStore) -> None:
    """Spec rotation 1 ("publish the new key beside the old (both valid); begin signing with the new
    key"): valid and published at once, signing only from the activation; the old key signs until then."""
    (old,) = store.load().records
    new, moved = store.rotate(T + 100.2, grace_s=50, lifetime_s=1000, activate_in_s=300)
    assert (new.not_before, new.activation, new.not_after) == (T + 100 - CLOCK_MARGIN_S, T + 401, T + 1401)
    assert [r.not_after for r in moved] == [T + 451]  # activation + grace
    assert index(store)["keys"][1]["activates_at"] == format_rfc3339(T + 401)
    assert index(store)["keys"][0]["activates_at"] == format_rfc3339(T)  # its window opened earlier
    state = store.load()
    assert state.record(new.thumbprint) == new
    assert state.state_of(new, T + 200) == "published"
    assert state.next_change(new, T + 200) == (T + 401, "signing")
    assert state.signing_record(T + 400.999) == state.record(old.thumbprint)
    assert state.signing_record(T + 401) == new
    directory = state.directory(T + 101, None)
    assert {k.thumbprint for k in directory.keys_valid_at(T + 101)} == {old.thumbprint, new.thumbprint}
    with pytest.raises(KeyStoreError, match="already waiting") as err:
        store.rotate(T + 200, grace_s=50, lifetime_s=1000)
    assert err.value.reason == "rotation-pending"
    later, _ = store.rotate(T + 401, grace_s=50, lifetime_s=1000)  # activated: rotating again is fine
    assert store.load().signing_record(T + 401) == later


def test_revoking_the_old_key_during_a_pending_rotation_signs_with_the_new_one(store: KeyStore) -> None:
    """The emergency path: no --force, no gap; the published key signs before its activation."""
    (old,) = store.load().records
    new, _ = store.rotate(T + 100, grace_s=50, lifetime_s=1000, activate_in_s=300)
    assert store.revoke(old.thumbprint, T + 150)
    state = store.load()
    assert state.signing_record(T + 150) == new
    assert state.state_of(new, T + 150) == "signing"


def test_rotate_refuses_a_gap_before_the_new_key_starts(store: KeyStore) -> None:
    with pytest.raises(KeyStoreError) as err:
        store.rotate(T + 100, grace_s=50, lifetime_s=1000, activate_in_s=5000)
    assert err.value.reason == "no-valid-key"
    assert "activates at" in str(err.value)
    new, _ = store.rotate(T + 100, grace_s=50, lifetime_s=1000, activate_in_s=5000, force=True)
    state = store.load()
    assert state.signing_record(T + 999) == state.records[0]  # the old key to its end
    assert state.signing_record(T + 1000) == new  # then the new one, early rather than none


def test_an_index_with_an_activation_outside_the_window_is_refused(store: KeyStore) -> None:
    store.rotate(T + 100, grace_s=50, lifetime_s=1000, activate_in_s=300)
    doc = index(store)
    doc["keys"][1]["activates_at"] = format_rfc3339(T + 99 - CLOCK_MARGIN_S)
    store.index_path.write_text(json.dumps(doc))
    with pytest.raises(KeyStoreError, match="activates_at must lie in"):
        store.load()


def test_rotate_on_an_expired_store_starts_signing_again(store: KeyStore) -> None:
    new, moved = store.rotate(T + 5000, grace_s=50, lifetime_s=1000)
    assert moved == ()
    assert store.load().signing_record(T + 5000) == new


@pytest.mark.parametrize("kwargs", [{"grace_s": 0}, {"lifetime_s": 0}, {"activate_in_s": -1}])
def test_rotate_refuses_nonsense_durations(store: KeyStore, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="seconds"):
        store.rotate(T + 1, **kwargs)


# --- revoke and prune ---------------------------------------------------------------------------


def test_revoke_lists_the_key_deletes_it_and_stops_it_signing(store: KeyStore) -> None:
    (old,) = store.load().records
    new, _ = store.rotate(T + 100, grace_s=500, lifetime_s=1000)
    assert store.revoke(new.thumbprint, T + 200.9)
    state = store.load()
    assert state.revocations.revoked == {new.thumbprint}
    assert state.revocations.as_of == T + 200
    assert state.record(new.thumbprint).revoked  # type: ignore[union-attr]
    assert not store.key_path(new.thumbprint).exists()
    assert state.signing_record(T + 201) == state.record(old.thumbprint)  # the old key, in grace
    assert new.thumbprint not in {k.thumbprint for k in state.directory(T + 201, None).keys}
    assert state.state_of(state.record(new.thumbprint), T + 201) == "revoked"  # type: ignore[arg-type]
    assert not store.revoke(new.thumbprint, T + 300)  # already revoked: nothing changes
    assert store.load().revocations.as_of == T + 200


def test_revoke_refuses_to_leave_no_valid_key_unless_forced(store: KeyStore) -> None:
    (only,) = store.load().records
    before = store.index_path.read_bytes()
    with pytest.raises(KeyStoreError) as err:
        store.revoke(only.thumbprint, T + 10)
    assert err.value.reason == "no-valid-key"
    assert "--force" in str(err.value)
    assert store.index_path.read_bytes() == before
    assert store.revoke(only.thumbprint, T + 10, force=True)
    assert store.load().signing_key(T + 10) is None


def test_revoke_of_an_unknown_key_is_refused(store: KeyStore) -> None:
    with pytest.raises(KeyStoreError, match="has no key"):
        store.revoke(SigningKey.generate().thumbprint, T + 1)


def test_prune_drops_expired_and_revoked_keys_and_keeps_the_revocation_list(store: KeyStore) -> None:
    (a,) = store.load().records
    b, _ = store.rotate(T + 100, grace_s=10, lifetime_s=1000)  # a ends at T + 110
    c, _ = store.rotate(T + 200, grace_s=500, lifetime_s=1000)
    store.revoke(b.thumbprint, T + 300)
    dropped = store.prune(T + 300)
    assert {r.thumbprint for r in dropped} == {a.thumbprint, b.thumbprint}
    state = store.load()
    assert [r.thumbprint for r in state.records] == [c.thumbprint]
    assert state.revocations.revoked == {b.thumbprint}
    assert not store.key_path(a.thumbprint).exists()
    assert store.prune(T + 301) == ()


def test_prune_refuses_when_no_key_is_valid_unless_forced(store: KeyStore) -> None:
    with pytest.raises(KeyStoreError, match="no valid signing key"):
        store.prune(T + 5000)
    assert len(store.prune(T + 5000, force=True)) == 1
    assert store.load().records == ()


# --- the provider -------------------------------------------------------------------------------


def test_provider_never_signs_outside_a_window_second_by_second(store: KeyStore) -> None:
    (a,) = store.load().records
    b, _ = store.rotate(T + 100, grace_s=50, lifetime_s=1000)  # a: [T-5, T+150), b: [T+95, T+1100)
    provider = StoreKeyProvider(store)

    def keyid(now: float) -> str | None:
        key = provider.current(now)
        return None if key is None else key.thumbprint

    assert keyid(T - CLOCK_MARGIN_S - 1) is None  # before any window
    assert keyid(T - 1) == a.thumbprint  # a clock set back: the window is open, the key signs early
    assert keyid(T) == a.thumbprint
    assert keyid(T + 99.999) == a.thumbprint
    assert keyid(T + 100) == b.thumbprint  # signing moves the moment b is valid
    assert keyid(T + 1099.999) == b.thumbprint
    assert keyid(T + 1100) is None  # at not_after the key is refused


def test_provider_moves_to_a_published_key_at_its_activation_second(store: KeyStore) -> None:
    (a,) = store.load().records
    b, _ = store.rotate(T + 100, grace_s=50, lifetime_s=1000, activate_in_s=300)  # a ends at T+450
    provider = StoreKeyProvider(store)
    assert provider.current(T + 399.999).thumbprint == a.thumbprint  # type: ignore[union-attr]
    assert provider.not_after(T + 399.999) == T + 450
    assert provider.current(T + 400).thumbprint == b.thumbprint  # type: ignore[union-attr]
    assert provider.not_after(T + 400) == b.not_after


def test_provider_answers_from_memory_and_picks_up_changes_on_reload(store: KeyStore) -> None:
    provider = StoreKeyProvider(store)
    (a,) = provider.state().records
    other = KeyStore(store.data_dir)  # a second process: `signing-proxy keys rotate`
    b, _ = other.rotate(T + 100, grace_s=50, lifetime_s=1000)
    assert provider.current(T + 120).thumbprint == a.thumbprint  # type: ignore[union-attr]
    assert provider.reload()
    assert provider.current(T + 120).thumbprint == b.thumbprint  # type: ignore[union-attr]
    other.revoke(b.thumbprint, T + 130)
    assert provider.reload()
    assert provider.current(T + 130).thumbprint == a.thumbprint  # type: ignore[union-attr]
    assert provider.not_after(T + 130) == T + 150  # a's window now ends at the rotation + grace


def test_provider_does_no_file_io_when_asked_for_a_key(
    store: KeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = StoreKeyProvider(store)
    (a,) = provider.state().records

    def no_io(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("file I/O on the request path")

    with monkeypatch.context() as patched:
        for name in ("stat", "open", "fstat"):
            patched.setattr(os, name, no_io)
        patched.setattr("builtins.open", no_io)
        keyids = [provider.current(now) for now in (T, T + 500, T + 999, T + 1000)]
        not_after = provider.not_after(T + 500)
    assert [None if k is None else k.thumbprint for k in keyids] == [a.thumbprint] * 3 + [None]
    assert not_after == T + 1000


def test_reload_reads_only_a_changed_index_unless_forced(
    store: KeyStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    provider = StoreKeyProvider(store)
    loads: list[bool] = []
    load = store.load

    def counting_load(*, private: bool = True, **options: Any) -> Any:
        loads.append(private)
        return load(private=private, **options)

    monkeypatch.setattr(store, "load", counting_load)
    with caplog.at_level(logging.INFO, logger="signing_proxy.keys"):
        assert provider.reload()  # the periodic check: one stat, nothing read
        assert loads == []
        assert provider.reload(force=True)  # SIGHUP may insist
        assert loads == [True]
        KeyStore(store.data_dir).rotate(T + 100, grace_s=50, lifetime_s=1000)
        assert provider.reload()
        assert loads == [True, True]
    assert len(provider.state().records) == 2
    messages = [r.getMessage() for r in caplog.records]
    assert sum("unchanged" in m for m in messages) == 1
    assert sum("2 keys, 0 revoked" in m for m in messages) == 1


def test_provider_keeps_the_last_good_state_when_the_store_turns_bad(
    store: KeyStore, caplog: pytest.LogCaptureFixture
) -> None:
    provider = StoreKeyProvider(store)
    (a,) = provider.state().records
    store.index_path.write_text("{broken")
    with caplog.at_level(logging.ERROR, logger="signing_proxy.keys"):
        assert not provider.reload()
        assert provider.current(T + 1).thumbprint == a.thumbprint  # type: ignore[union-attr]
        assert not provider.reload()  # the periodic check again: same broken index
    assert len([r for r in caplog.records if "not reloaded" in r.getMessage()]) == 1  # reported once
    assert not provider.reload(force=True)
    assert provider.current(T + 1).thumbprint == a.thumbprint  # type: ignore[union-attr]


def test_a_deleted_index_is_reported_once_and_the_keys_kept(
    store: KeyStore, caplog: pytest.LogCaptureFixture
) -> None:
    provider = StoreKeyProvider(store)
    store.index_path.unlink()
    with caplog.at_level(logging.ERROR, logger="signing_proxy.keys"):
        assert not provider.reload()
        assert not provider.reload()
    assert len([r for r in caplog.records if "not reloaded" in r.getMessage()]) == 1
    assert provider.current(T + 1) is not None


def test_a_watcher_without_private_keys_serves_the_public_half(store: KeyStore) -> None:
    watcher = StoreWatcher(store, private=False)
    state = watcher.state()
    assert state.private == {}
    body = render_directory(state.directory(T + 1, "https://agent.example/r.json"), now=T + 1)
    for entry in json.loads(body)["keys"]:
        assert set(entry) == {"kty", "crv", "use", "alg", "x", "not_before", "not_after"}
        assert not PRIVATE_JWK_MEMBERS & set(entry)


# --- first run and migration --------------------------------------------------------------------


def test_first_run_creates_a_store_with_one_key(tmp_path: Path) -> None:
    _store, created, imported = open_or_create(tmp_path / "data", "default", T, lifetime_s=90 * 86_400)
    assert imported is None
    assert created is not None
    assert (created.not_before, created.not_after) == (T - CLOCK_MARGIN_S, T + 90 * 86_400)
    again, created_again, _ = open_or_create(tmp_path / "data", "default", T + 5)
    assert created_again is None
    assert again.load().records == (created,)


def test_first_run_imports_the_legacy_key_and_leaves_the_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    legacy = SigningKey.generate()
    path = data / "agent-key.pem"
    path.write_bytes(legacy.to_pem())
    path.chmod(0o600)
    store, created, imported = open_or_create(data, "default", T + 10**6, lifetime_s=1000)
    assert imported == path
    assert created is not None
    assert created.thumbprint == legacy.thumbprint
    assert path.exists()
    assert StoreKeyProvider(store).current(T + 10**6).thumbprint == legacy.thumbprint  # type: ignore[union-attr]
    _, alice, alice_imported = open_or_create(data, "alice", T)
    assert alice_imported is None  # only the default agent inherits the legacy key
    assert alice is not None
    assert alice.thumbprint != legacy.thumbprint


def test_first_run_refuses_a_permission_open_legacy_key(tmp_path: Path) -> None:
    path = tmp_path / "agent-key.pem"
    path.write_bytes(SigningKey.generate().to_pem())
    path.chmod(0o644)
    with pytest.raises(KeyStoreError, match="readable by its owner only"):
        open_or_create(tmp_path, "default", T)
    assert not (tmp_path / "keys" / "default" / "keys.json").exists()


# --- durations ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"), [("3600s", 3600), ("30m", 1800), ("48h", 172_800), ("90d", 7_776_000), ("0s", 0)]
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "48", "h", "1.5h", "-1h", "1w", "48 h", "1h30m", "99999999999d"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"duration|longer"):
        parse_duration(text)


def test_a_revoked_key_pruned_away_is_not_taken_back_by_a_rotation(tmp_path: Path) -> None:
    """``keys rotate --pkcs11 URI`` reuses a token's key; one revoked and pruned was accepted again:
    it loaded as revoked and never signed, while the rotation had cut the signing key's window."""
    store = KeyStore(tmp_path / "data")
    store.create(T, lifetime_s=90 * 86_400)
    reused = SigningKey.generate()
    store.rotate(T + 100, key=reused)
    store.rotate(T + 200)
    store.revoke(reused.thumbprint, T + 300)
    assert len(store.prune(T + 400)) == 1
    before = store.load()
    with pytest.raises(KeyStoreError) as caught:
        store.rotate(T + 500, key=reused, activate_in_s=3630)
    assert caught.value.reason == "key-revoked"
    assert store.load().records == before.records  # nothing was cut


def test_a_rotation_past_the_index_bound_is_refused_and_the_store_stays_readable(tmp_path: Path) -> None:
    """Expired and revoked keys stay in the index until pruned; a rotation that made it 1,025 entries
    long wrote what nothing could read again, prune (the way out) included."""
    store = KeyStore(tmp_path / "data")
    store.create(T, lifetime_s=90 * 86_400)
    entries, revocations = parse_index(store.index_path.read_bytes(), "default")
    old = [
        IndexEntry.of(SigningKey.generate(), T - 10_000 + i, T - 9_000 + i, T - 10_000 + i)
        for i in range(1023)
    ]
    revoked = RevocationList(revocations.as_of, frozenset(e.thumbprint for e in old))
    store.index_path.write_bytes(render_index("default", entries + old, revoked))
    with pytest.raises(KeyStoreError) as caught:
        store.rotate(T + 10)
    assert caught.value.reason == "too-many-keys"
    assert len(store.prune(T + 10)) == 1023  # the documented way out still works
    store.rotate(T + 20)


def test_revoking_again_deletes_a_private_key_a_cut_short_revoke_left(store: KeyStore) -> None:
    second, _ = store.rotate(T + 10)
    key_file = store.key_path(second.thumbprint)
    store.revoke(second.thumbprint, T + 20, force=True)
    key_file.write_bytes(b"left by a crash between the index and the unlink")
    key_file.chmod(0o600)
    assert store.revoke(second.thumbprint, T + 30, force=True) is False  # already revoked
    assert not key_file.exists()


def test_a_create_cut_short_before_its_index_is_done_again_at_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Importing agent-key.pem writes the key's file, then the index; a crash between the two left
    a file every later start refused to overwrite: the store never came up without a hand's help."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    legacy = SigningKey.generate()
    (data / "agent-key.pem").write_bytes(legacy.to_pem())
    (data / "agent-key.pem").chmod(0o600)

    def crash(self: KeyStore, *_args: object) -> None:
        raise SystemExit("power lost between the key file and the index")

    with monkeypatch.context() as patched:
        patched.setattr(KeyStore, "_write_index", crash)
        with pytest.raises(SystemExit):
            open_or_create(data, "default", T)
    store = KeyStore(data)
    assert store.key_path(legacy.thumbprint).exists()
    assert not store.index_path.exists()
    open_or_create(data, "default", T + 1)  # the next start
    assert [record.thumbprint for record in store.load().records] == [legacy.thumbprint]
