"""Issue 16, item 6 ("Bearer credentials ignore scheme and port"): a credential rule's token goes
only to ``https`` targets unless the rule says ``allow_plaintext``, only to its ``ports`` when it
lists some, and a ``bearer_file`` readable by others is refused like a key file.

The integration test runs ``signing-proxy run`` as a real process against loopback origins (one
HTTPS origin with its own test CA, two plain ones) and asserts what really arrived.
"""

from __future__ import annotations

import base64
import http.client
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from signing_proxy.config import AccessConfig, CredentialRule, parse_config
from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.uri import parse_absolute_uri
from signing_proxy.errors import ConfigError, ProxyError
from signing_proxy.net.leaves import LeafContextCache
from signing_proxy.proxy.access import AccessControl
from signing_proxy.proxy.pipeline import BearerStore
from signing_proxy.storage.ca import CertificateAuthority
from tests.harness import WAIT_S, ProxyProcess, VerifyingOrigin, run_cli, wait_for

KEY = SigningKey.generate()


def private_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def get_via(proxy: ProxyProcess, url: str, headers: dict[str, str] | None = None) -> int:
    """GET ``url`` in absolute form through the proxy (also ``https://``: the proxy originates TLS),
    or a path of the proxy's own."""
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=WAIT_S)
    try:
        conn.request("GET", url, headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


@pytest.fixture(scope="module")
def origin_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority.generate()
    (tmp / "origin-ca.pem").write_bytes(ca.cert_pem())
    with LeafContextCache(ca, 4) as leaves:
        yield {"ca_file": str(tmp / "origin-ca.pem"), "context": leaves.get("127.0.0.1")}


@pytest.mark.integration
def test_bearer_credentials_ignore_scheme_and_port_token_goes_only_where_the_rule_allows(
    tmp_path: Path, origin_tls: dict[str, Any]
) -> None:
    token = private_file(tmp_path / "token", "file-token\n")
    with (
        VerifyingOrigin(tls=origin_tls["context"]) as secure,
        VerifyingOrigin() as plain,
        VerifyingOrigin() as other,
    ):
        for origin in (secure, plain, other):
            origin.trust(KEY)
        config = {
            "log": {"format": "json"},
            "upstream": {"pin_ca_files": {"127.0.0.1": origin_tls["ca_file"]}},
            "credentials": [
                # https only (the default), and only this port
                {"hosts": ["127.0.0.1"], "bearer_file": str(token), "ports": [secure.port]},
                # plain http allowed, on one port only
                {
                    "hosts": ["localhost"],
                    "bearer_env": "LOCAL_TOKEN",
                    "allow_plaintext": True,
                    "ports": [plain.port],
                },
            ],
        }
        with ProxyProcess(tmp_path, config, key=KEY, env={"LOCAL_TOKEN": "local-token"}) as proxy:
            assert get_via(proxy, secure.url("/https")) == 200
            assert get_via(proxy, plain.url("/http")) == 200  # same host, http: nothing sent
            assert get_via(proxy, plain.url("/http-again")) == 200
            assert get_via(proxy, plain.url("/mine"), {"Authorization": "Bearer mine"}) == 200
            assert get_via(proxy, f"http://localhost:{plain.port}/plaintext-allowed") == 200
            assert get_via(proxy, f"http://localhost:{other.port}/other-port") == 200
            withheld_http = f"credentials[0] not sent to http://127.0.0.1:{plain.port}"
            withheld_port = f"credentials[1] not sent to http://localhost:{other.port}"
            wait_for(
                lambda: any(withheld_port in line for line in proxy.stderr_lines),
                "the withheld-port log line",
            )
        lines = proxy.stderr_lines

    [to_secure] = secure.arrivals
    assert to_secure.header("authorization") == "Bearer file-token"
    assert to_secure.verified, to_secure.reason
    http_first, http_again, mine, allowed = plain.arrivals
    for arrival in (http_first, http_again):
        assert not arrival.header("authorization")  # signed with an empty Authorization
        assert arrival.verified, arrival.reason
    assert mine.header("authorization") == "Bearer mine"  # the agent's own, as when no rule matches
    assert mine.verified
    assert allowed.header("authorization") == "Bearer local-token"
    [other_port] = other.arrivals
    assert not other_port.header("authorization")
    assert other_port.verified
    said = [line for line in lines if withheld_http in line]
    assert len(said) == 1, said  # once per rule and origin, not per request
    assert "allow_plaintext" in said[0]
    assert any(withheld_port in line and "port" in line.split(withheld_port, 1)[1] for line in lines)
    assert not any("file-token" in line or "local-token" in line for line in lines)


@pytest.mark.integration
def test_bearer_credentials_ignore_scheme_and_port_plain_http_target_gets_no_token(tmp_path: Path) -> None:
    """The issue's reproduction with a rule written before ``allow_plaintext`` existed."""
    token = private_file(tmp_path / "token", "clear-text-token\n")
    config = {"credentials": [{"hosts": ["127.0.0.1"], "bearer_file": str(token)}]}
    with VerifyingOrigin() as plain, ProxyProcess(tmp_path, config, key=KEY) as proxy:
        plain.trust(KEY)
        assert get_via(proxy, plain.url("/")) == 200
    [arrival] = plain.arrivals
    assert not arrival.header("authorization")
    assert arrival.verified, arrival.reason  # still signed, as when no rule matches


def test_bearer_credentials_ignore_scheme_and_port_rule_matching(tmp_path: Path) -> None:
    token = private_file(tmp_path / "token", "t\n")
    store = BearerStore(
        [
            CredentialRule(hosts=("a.example",), bearer_file=str(token)),
            CredentialRule(hosts=("a.example",), bearer_env="B", allow_plaintext=True, ports=(8080,)),
        ],
        environ={"B": "b"},
    )

    def sent(url: str) -> str | None:
        found = store.for_target(parse_absolute_uri(url))
        return None if found is None else found[1]

    assert sent("https://a.example/") == "t"
    assert sent("http://a.example/") is None  # rule 0 is https-only; rule 1 wants port 8080
    assert sent("http://a.example:8080/") == "b"
    assert sent("https://a.example:8080/") == "t"  # rule 0 has no port restriction
    assert sent("http://b.example:8080/") is None


def test_bearer_credentials_ignore_scheme_and_port_rule_keys_are_validated() -> None:
    rule = {"hosts": ["a.example"], "bearer_env": "T"}
    with pytest.raises(ConfigError, match=r"^credentials\[0\]\.ports\[1\]: must be a port number"):
        parse_config({"credentials": [{**rule, "ports": [443, 0]}]})
    with pytest.raises(ConfigError, match=r"^credentials\[0\]\.allow_plaintext: must be true or false"):
        parse_config({"credentials": [{**rule, "allow_plaintext": "yes"}]})
    with pytest.raises(ConfigError, match=r"^credentials\[0\]\.hosts\[0\]: host patterns are"):
        parse_config({"credentials": [{**rule, "hosts": ["https://a.example/"]}]})
    parsed = parse_config({"credentials": [{**rule, "ports": [443, 8443]}]}).credentials[0]
    assert parsed.ports == (443, 8443)
    assert parsed.allow_plaintext is False


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_bearer_credentials_ignore_scheme_and_port_bearer_file_open_to_others_is_refused(
    tmp_path: Path, mode: int
) -> None:
    token = private_file(tmp_path / "token", "secret-token\n", mode)
    with pytest.raises(ConfigError) as err:
        BearerStore([CredentialRule(hosts=("a.example",), bearer_file=str(token))])
    assert err.value.reason == "credential-permissions"
    assert str(err.value).startswith("credentials[0].bearer_file: ")
    assert f"{mode:04o}" in str(err.value)
    assert "secret-token" not in str(err.value)
    token.chmod(0o600)
    BearerStore([CredentialRule(hosts=("a.example",), bearer_file=str(token))])  # owner-only: fine


def test_bearer_credentials_ignore_scheme_and_port_bearer_file_that_is_not_a_file_is_refused(
    tmp_path: Path,
) -> None:
    for path, reason in (
        (tmp_path / "missing", "credential-unreadable"),
        (tmp_path, "credential-unreadable"),
    ):
        with pytest.raises(ConfigError) as err:
            BearerStore([CredentialRule(hosts=("a.example",), bearer_file=str(path))])
        assert err.value.reason == reason
        assert str(err.value).startswith("credentials[0].bearer_file: ")


@pytest.mark.integration
def test_bearer_credentials_ignore_scheme_and_port_open_bearer_file_stops_start_and_reload(
    tmp_path: Path,
) -> None:
    open_token = private_file(tmp_path / "open-token", "open-secret\n", 0o644)
    config = {
        "listen": "127.0.0.1:0",
        "data_dir": str(tmp_path / "data"),
        "intercept": {"enabled": False},
        "credentials": [{"hosts": ["a.example"], "bearer_file": str(open_token)}],
    }
    key_path = tmp_path / "agent-key.pem"
    private_file(key_path, KEY.to_pem().decode())
    config["signing"] = {"key": str(key_path)}
    config_path = tmp_path / "start.yaml"
    config_path.write_text(yaml.safe_dump(config))
    done = run_cli("run", "--config", str(config_path), timeout_s=WAIT_S)
    assert done.returncode == 2, done.stderr
    assert "credentials[0].bearer_file: " in done.stderr
    assert "chmod 600" in done.stderr
    assert "open-secret" not in done.stderr

    with ProxyProcess(tmp_path, {"intercept": {"enabled": False}}, key=KEY) as proxy:
        # one answer first: the loop is then past installing its SIGHUP handler (printed before it)
        assert get_via(proxy, "/healthz") == 200
        running = yaml.safe_load((tmp_path / "config.yaml").read_text())
        (tmp_path / "config.yaml").write_text(
            yaml.safe_dump({**running, "credentials": config["credentials"]})
        )
        assert proxy.proc is not None
        proxy.proc.send_signal(signal.SIGHUP)
        wait_for(
            lambda: any("new configuration refused" in line for line in proxy.stderr_lines), "the refusal"
        )
        refusal = next(line for line in proxy.stderr_lines if "new configuration refused" in line)
    assert "credentials[0].bearer_file: " in refusal
    assert "readable by its owner only" in refusal


def auth_file(tmp_path: Path, data: bytes, mode: int) -> str:
    path = tmp_path / "proxy-users"
    path.write_bytes(data)
    path.chmod(mode)
    return str(path)


@pytest.mark.parametrize(
    ("data", "mode", "reason"),
    [
        (b"agent:s3cret\n", 0o644, "proxy-auth-permissions"),  # passwords readable by everyone
        (b"agent:s3cret\n", 0o640, "proxy-auth-permissions"),
        (b"agent:\xff\xfe\n", 0o600, "proxy-auth-malformed"),  # not text: was a bare UnicodeDecodeError
        (b"agent\n", 0o600, "proxy-auth-malformed"),
    ],
)
def test_a_proxy_auth_file_is_read_like_every_file_of_secrets(
    tmp_path: Path, data: bytes, mode: int, reason: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        AccessControl(AccessConfig(proxy_auth_file=auth_file(tmp_path, data, mode)))
    assert caught.value.reason == reason
    assert "s3cret" not in str(caught.value)


def test_an_owner_only_proxy_auth_file_is_read(tmp_path: Path) -> None:
    access = AccessControl(
        AccessConfig(proxy_auth_file=auth_file(tmp_path, b"# users\nagent:s3cret\n", 0o600))
    )
    assert access.check_proxy_auth("Basic " + base64.b64encode(b"agent:s3cret").decode()) == "agent"
    with pytest.raises(ProxyError) as refused:  # the file was read, not taken as empty (no check at all)
        access.check_proxy_auth("Basic " + base64.b64encode(b"agent:wrong").decode())
    assert refused.value.status == 407


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("\n", "credential-missing"),  # "Authorization: Bearer " went out
        ("   \n", "credential-missing"),
        ("two words\n", "credential-malformed"),  # "Bearer two words": no token68
        ("tok\x01en\n", "credential-malformed"),  # a control character, sent verbatim
        ("tok\ten\n", "credential-malformed"),
    ],
)
def test_a_bearer_file_with_no_usable_token_is_refused(tmp_path: Path, content: str, reason: str) -> None:
    token = private_file(tmp_path / "token", content)
    with pytest.raises(ConfigError) as err:
        BearerStore([CredentialRule(hosts=("a.example",), bearer_file=str(token))])
    assert err.value.reason == reason
    assert str(err.value).startswith("credentials[0]")
    assert content.strip() not in str(err.value) or not content.strip()
