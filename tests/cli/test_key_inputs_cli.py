"""Key files, JWK Sets and the proxy's own key as ``delegate`` and ``keys`` read them, through real
subprocesses: a PKCS#11 ``signing.key`` names the holder (its PIN never shown), an owner key is
trusted only inside its window (``nbf``/``exp`` too), and a hostile file (a device, a FIFO, a
duplicate member, nesting too deep) is one clean line and exit status 2, never a traceback or a hang.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from signing_proxy.core.jwk import SigningKey
from tests.harness import run_cli
from tests.softhsm import PIN, SoftHsm

SECRET_PIN = "SECRETPIN1234"
DEEP = "[" * 5000 + "]" * 5000


def private_file(path: Path, data: bytes) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


def refused(*args: str, env: dict[str, str] | None = None, secret: str = SECRET_PIN) -> str:
    """The one line of a refusal (exit status 2): no traceback, nothing on stdout, no secret."""
    done = run_cli(*args, env=env, timeout_s=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("signing-proxy: ")
    assert "Traceback" not in done.stderr
    assert secret not in done.stderr
    return done.stderr


class Owner:
    """An owner key (its JWK Set in several forms), a principal key, and an authority to it."""

    def __init__(self, tmp: Path, holder_jkt: str | None = None) -> None:
        self.tmp = tmp
        self.owner, self.principal = SigningKey.generate(), SigningKey.generate()
        self.owner_pem = private_file(tmp / "owner.pem", self.owner.to_pem())
        self.principal_pem = private_file(tmp / "principal.pem", self.principal.to_pem())
        self.jwks = self.write_jwks("owner.jwks", self.owner.public.jwk())
        # "=": a thumbprint may start with "-" (one key in 64), which argparse takes for an option
        holder = [f"--holder-jkt={holder_jkt}"] if holder_jkt else ["--holder-key", str(self.principal_pem)]
        issued = run_cli(
            "delegate",
            "issue",
            "--owner-key",
            str(self.owner_pem),
            "--iss",
            "https://owner.example",
            *holder,
            "--scope",
            "dist:US:*",
            "--expires",
            "2h",
        )
        assert issued.returncode == 0, issued.stderr
        self.chain = issued.stdout.strip()

    def write_jwks(self, name: str, *keys: object) -> Path:
        path = self.tmp / name
        path.write_text(json.dumps({"keys": list(keys)}))
        return path

    def verify(self, *args: str) -> tuple[str, ...]:
        return ("delegate", "verify", self.chain, *args)


# --- hostile key files ---------------------------------------------------------------------------------


def test_hostile_public_key_files_are_refused_by_path(tmp_path: Path) -> None:
    owner = Owner(tmp_path)
    deep_jwk = tmp_path / "deep.jwk"
    deep_jwk.write_text('{"a":' + DEEP + "}")
    big = tmp_path / "big.jwk"
    big.write_bytes(b" " * (64 * 1024 + 1))
    for path, reason in (
        ("/dev/zero", "not a regular file"),  # read whole, it filled the memory
        (str(tmp_path), "not a regular file"),
        (str(big), "larger than 65536 bytes"),
        (str(deep_jwk), "not valid JSON: nested too deep"),
    ):
        error = refused(*owner.verify("--owner-jwks", str(owner.jwks), "--holder-key", path))
        assert error.startswith(f"signing-proxy: --holder-key: {path}: {reason}"), error
        error = refused("verify-origin", "--listen", "127.0.0.1:0", "--pinned-key", path)
        assert error.startswith(f"signing-proxy: --pinned-key: {path}: {reason}"), error


def test_a_fifo_is_refused_at_once_never_waited_on(tmp_path: Path) -> None:
    """A FIFO with no writer blocked the reader for ever (``run_cli`` gives it a deadline)."""
    owner = Owner(tmp_path)
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)
    error = refused(*owner.verify("--owner-jwks", str(owner.jwks), "--holder-key", str(fifo)))
    assert error.startswith(f"signing-proxy: --holder-key: {fifo}: not a regular file")


def test_a_private_jwk_nested_too_deep_is_malformed(tmp_path: Path) -> None:
    deep = private_file(tmp_path / "deep.jwk", ('{"a":' + DEEP + "}").encode())
    error = refused("keys", "show", str(deep))
    assert error.startswith(f"signing-proxy: {deep}: not a usable Ed25519 private key"), error
    assert "nested too deep" in error
    owner = Owner(tmp_path)
    error = refused(
        "delegate", "issue", "--owner-key", str(deep), "--iss", "https://o.example",
        f"--holder-jkt={owner.principal.thumbprint}", "--expires", "1h",
    )  # fmt: skip
    assert error.startswith(f"signing-proxy: --owner-key: {deep}: not a usable Ed25519 private key"), error


def test_a_key_store_index_nested_too_deep_is_malformed(tmp_path: Path) -> None:
    assert run_cli("keys", "rotate", "--data-dir", str(tmp_path)).returncode == 0
    (index,) = tmp_path.glob("keys/*/keys.json")
    index.write_text(DEEP)
    error = refused("keys", "list", "--data-dir", str(tmp_path))
    assert error == f"signing-proxy: {index}: malformed index: nested too deep (store-malformed)\n"


# --- the owner's JWK Set -------------------------------------------------------------------------------


def test_an_owner_key_past_its_jwk_exp_is_not_trusted(tmp_path: Path) -> None:
    owner = Owner(tmp_path)
    expired = owner.write_jwks("expired.jwks", {**owner.owner.public.jwk(), "nbf": 1000, "exp": 2000})
    done = run_cli(*owner.verify("--owner-jwks", str(expired), "--holder-key", str(owner.principal_pem)))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "untrusted-issuer-key" in done.stdout
    assert "1 owner key(s) outside their window" in done.stderr
    later = owner.write_jwks("later.jwks", {**owner.owner.public.jwk(), "nbf": int(time.time()) + 3600})
    inspect = run_cli("delegate", "inspect", owner.chain, "--owner-jwks", str(later), "--json")
    assert "outside their window" in inspect.stderr
    assert json.loads(inspect.stdout)["result"]["reason"] == "untrusted-issuer-key"
    current = owner.write_jwks("current.jwks", {**owner.owner.public.jwk(), "exp": int(time.time()) + 3600})
    done = run_cli(*owner.verify("--owner-jwks", str(current), "--holder-key", str(owner.principal_pem)))
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_owner_jwks_with_a_member_given_twice_is_refused(tmp_path: Path) -> None:
    owner = Owner(tmp_path)
    x = owner.owner.public.jwk()["x"]
    other = SigningKey.generate().public.jwk()["x"]
    dup = tmp_path / "dup.jwks"
    dup.write_text(f'{{"keys":[{{"kty":"OKP","crv":"Ed25519","x":"{other}","x":"{x}"}}]}}')
    error = refused(*owner.verify("--owner-jwks", str(dup), "--holder-key", str(owner.principal_pem)))
    assert error == f"signing-proxy: --owner-jwks: {dup}: not valid JSON: member 'x' appears twice\n"
    twice = owner.write_jwks("twice.jwks", owner.owner.public.jwk(), owner.owner.public.jwk())
    error = refused(*owner.verify("--owner-jwks", str(twice), "--holder-key", str(owner.principal_pem)))
    assert "keys[1]" in error
    assert "appears twice" in error


def test_a_hostile_owner_jwks_is_refused_by_path(tmp_path: Path) -> None:
    owner = Owner(tmp_path)
    holder = ("--holder-key", str(owner.principal_pem))
    big = tmp_path / "big.jwks"
    big.write_bytes(b" " * (64 * 1024 + 1))
    deep_jwks = tmp_path / "deep.jwks"
    deep_jwks.write_text('{"keys":' + DEEP + "}")
    fifo = tmp_path / "keys.fifo"
    os.mkfifo(fifo)  # with no writer it blocked the reader for ever (run_cli gives it a deadline)
    for path, reason in (
        ("/dev/zero", "not a regular file"),
        (str(fifo), "not a regular file"),
        (str(tmp_path), "not a regular file"),
        (str(big), "larger than 65536 bytes"),
        (str(deep_jwks), "not valid JSON: nested too deep"),
    ):
        error = refused(*owner.verify("--owner-jwks", path, *holder))
        assert error.startswith(f"signing-proxy: --owner-jwks: {path}: {reason}"), error


# --- a PKCS#11 signing.key ---------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["config", "env"])
def test_a_pkcs11_signing_key_the_token_cannot_open_is_refused_without_its_pin(
    tmp_path: Path, where: str
) -> None:
    uri = f"pkcs11:token=t;object=o?pin-value={SECRET_PIN}&module-path={tmp_path}/missing.so"
    owner = Owner(tmp_path)
    config = tmp_path / "proxy.yaml"
    settings: dict[str, object] = {"data_dir": str(tmp_path / "data")}
    if where == "config":
        settings["signing"] = {"key": uri}
    config.write_text(yaml.safe_dump(settings))
    env = {"SIGNING_PROXY_KEY": uri} if where == "env" else None
    extend = ("delegate", "extend", owner.chain, "--principal-key", str(owner.principal_pem))
    for action in (owner.verify("--owner-jwks", str(owner.jwks)), extend):
        error = refused(*action, "--holder-config", str(config), env=env)
        assert "signing.key" in error
        assert "token-module-unloadable" in error  # the token was asked, the URI not taken for a path
        assert "key file does not exist" not in error


def test_a_mistyped_pkcs11_uri_is_a_key_path_shown_without_its_pin(tmp_path: Path) -> None:
    owner = Owner(tmp_path)
    env = {"SIGNING_PROXY_KEY": f"pkcs11;token=t;object=o?pin-value={SECRET_PIN}"}
    error = refused(*owner.verify("--owner-jwks", str(owner.jwks)), "--data-dir", str(tmp_path), env=env)
    assert error.startswith("signing-proxy: signing.key: pkcs11;token=t;object=o?pin-value=(not shown)")


@pytest.mark.parametrize("pin_in_uri", [False, True])
def test_holder_config_names_the_token_key_of_a_pkcs11_signing_key(tmp_path: Path, pin_in_uri: bool) -> None:
    hsm = SoftHsm(tmp_path / "hsm")
    config = tmp_path / "token.yaml"
    config.write_text(yaml.safe_dump({"signing": {"pkcs11": hsm.pkcs11_config()}}))
    made = run_cli("keys", "generate", "--config", str(config), "--pkcs11", hsm.uri("agent"), env=hsm.env())
    assert made.returncode == 0, made.stderr
    jkt = made.stdout.split("thumbprint: ")[1].split()[0]
    uri = hsm.uri("agent") + (f"?pin-value={PIN}" if pin_in_uri else "")
    pkcs11 = {"module": hsm.module} if pin_in_uri else hsm.pkcs11_config()
    config.write_text(yaml.safe_dump({"signing": {"key": uri, "pkcs11": pkcs11}}))
    owner = Owner(tmp_path, holder_jkt=jkt)
    env = {"SOFTHSM2_CONF": hsm.env()["SOFTHSM2_CONF"]} if pin_in_uri else hsm.env()
    done = run_cli(
        *owner.verify("--owner-jwks", str(owner.jwks), "--holder-config", str(config), "--json"), env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["holder_jkt"] == jkt
    assert f"holder: the proxy's signing key {jkt} (signing.key: object 'agent'" in done.stderr
    assert PIN not in done.stdout + done.stderr
    wrong = uri.replace(PIN, "0000-wrong") if pin_in_uri else uri
    env = env if pin_in_uri else hsm.env(pin="0000-wrong")
    config.write_text(yaml.safe_dump({"signing": {"key": wrong, "pkcs11": pkcs11}}))
    error = refused(*owner.verify("--owner-jwks", str(owner.jwks), "--holder-config", str(config)), env=env)
    assert "token-pin-incorrect" in error
    assert "0000-wrong" not in error
