"""Configuration: the embedded defaults equal config/default.yaml; mistakes name their key path."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from signing_proxy.config import Config, ConfigError, load_config, parse_config, redacted
from signing_proxy.config.checks import host_matches
from signing_proxy.config.loading import _problem

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"


def test_default_yaml_is_the_embedded_default() -> None:
    assert load_config(CONFIG_DIR / "default.yaml") == Config()
    assert load_config(None) == Config()


def _key_paths(tree: dict[str, Any], prefix: str = "") -> set[str]:
    paths: set[str] = set()
    for key, value in tree.items():
        nested = isinstance(value, dict) and value
        paths |= _key_paths(value, f"{prefix}{key}.") if nested else {f"{prefix}{key}"}
    return paths


def test_default_yaml_spells_out_every_key() -> None:
    """It says it spells out the embedded default: a key left out (gateway.hosts was) still parsed
    equal, so only the key paths themselves show it."""
    written = _key_paths(yaml.safe_load((CONFIG_DIR / "default.yaml").read_text()))
    assert written == _key_paths(dataclasses.asdict(Config()))


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_config_is_valid(path: Path) -> None:
    load_config(path)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"limits": {"max_body_bytes": 0}}, "limits.max_body_bytes: must be a positive integer"),
        ({"limits": {"max_body_bytes": "10MiB"}}, "limits.max_body_bytes: must be an integer"),
        ({"limits": {"max_body_byte": 1}}, "limits.max_body_byte: unknown key"),
        ({"signin": {}}, "signin: unknown key"),
        ({"timeouts": {"read_s": -1}}, "timeouts.read_s: must be a positive"),
        ({"signing": {"label": "Agent"}}, "signing.label: must be a structured-field key"),
        (
            {"signing": {"signature_agent": "agent.example"}},
            "signing.signature_agent: must be an http(s) URL",
        ),
        ({"signing": {"validity_s": 90000}}, "signing.validity_s: must be at most 86400"),
        ({"listen": "8080"}, "listen: must be HOST:PORT"),
        ({"listen": "127.0.0.1:99999"}, "listen: the port must be 1-65535"),
        ({"listen": "0.0.0.0:8080"}, "listen: 0.0.0.0:8080 is not a loopback address"),
        ({"access": {"allow_clients": ["10.0.0.0/33"]}}, "access.allow_clients[0]: not a CIDR"),
        ({"log": {"level": "loud"}}, "log.level: must be one of debug, info, warning, error"),
        ({"log": {"access_log": "yes"}}, "log.access_log: must be true or false"),
        (
            {"routes": [{"prefix": "exchange", "upstream": "https://x.example/"}]},
            "routes[0].prefix: must start",
        ),
        (
            {"routes": [{"prefix": "/x/", "upstream": "ftp://x/"}]},
            "routes[0].upstream: must be an absolute http(s) URL",
        ),
        (
            {"routes": [{"prefix": "/healthz/", "upstream": "https://x.example/"}]},
            "collides with the proxy's own",
        ),
        ({"credentials": [{"hosts": ["a"]}]}, "credentials[0]: set exactly one of bearer_file or bearer_env"),
        ({"credentials": [{"hosts": []}]}, "credentials[0].hosts: must list at least one host pattern"),
        ({"credentials": [{"bearer_env": "X"}]}, "credentials[0]:"),
        ({"hosts": {"unsigned": ["a.*.b"]}}, "hosts.unsigned[0]: host patterns are"),
        ({"routes": {"prefix": "/x/"}}, "routes: must be a list"),
        (
            {"gateway": {"upstream": "http://127.0.0.1:9000/#x"}},
            "gateway.upstream: must be an absolute http(s) URL",
        ),
        (
            {"gateway": {"broker_directories": ["https://broker.example/ a"]}},
            "gateway.broker_directories[0]: must be an absolute http(s) URL",
        ),
        (
            {"gateway": {"trusted_issuers": {"iss": {"directory": "http:///x"}}}},
            "gateway.trusted_issuers.iss.directory: must be an absolute http(s) URL",
        ),
        (["not", "a", "mapping"], "config: must be a mapping"),
        ({"mode": "relay", "relay": {"max_hops": 17}}, "relay.max_hops: must be at most 16"),
        ({"gateway": {"max_hops": 17}}, "gateway.max_hops: must be at most 16"),
    ],
)
def test_mistakes_are_refused_with_their_key_path(raw: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    assert str(err.value).startswith(message) or message in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("agent", "words"),
    [
        ("https://alice:s3cret@agent.example", "an http(s) URL without user:password@"),
        ("https://agent.example@127.0.0.1/agents/alice", "an http(s) URL without user:password@"),
        ("https://user@agent.example", "an http(s) URL without user:password@"),
        ("https://agent.example#me", "must be an absolute http(s) URL"),
        ("https://agent.example?x=1", "not a key directory's base URL a verifier accepts"),
    ],
)
@pytest.mark.parametrize("profiles", [{}, {"default": "web-bot-auth"}])
def test_a_signature_agent_verifiers_cannot_fetch_is_refused_in_any_profile(
    agent: str, words: str, profiles: dict[str, Any]
) -> None:
    """Userinfo was accepted (outside web-bot-auth), then sent as it is in the Signature-Agent of
    every signed request (the password to every origin); every verifier's egress refuses userinfo
    and fragments, so its directory was never fetched. Refused by signing's own check (as the other
    URL settings are), the password never shown."""
    with pytest.raises(ConfigError) as err:
        parse_config({"signing": {"signature_agent": agent}, "profiles": profiles})
    message = str(err.value)
    assert message.startswith(f"signing.signature_agent: {words}"), message
    assert not any(part in message for part in ("s3cret", "alice", "127.0.0.1")), message


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"upstream": {"next_hop": "http://u:s3cret@relay:8080"}},
            "upstream.next_hop: an http(s) URL without",
        ),
        (
            {"upstream": {"next_hop": "http://u:s3cret@relay:8080/x"}},
            "upstream.next_hop: an http(s) URL without",
        ),
        (
            {"routes": [{"prefix": "/x/", "upstream": "https://u:s3cret@up.example/"}]},
            "routes[0].upstream: an http(s) URL without",
        ),
        (
            {"routes": [{"prefix": "/x/", "upstream": "ftp://u:s3cret@up.example/"}]},
            "routes[0].upstream: must",
        ),
        (
            {"mode": "relay", "relay": {"broker_directories": ["https://u:s3cret@broker.example"]}},
            "relay.broker_directories[0]: an http(s) URL without",
        ),
        ({"gateway": {"store": "Redis://:s3cret@redis.example:6379/0"}}, "gateway.store: sqlite"),
    ],
)
def test_userinfo_in_a_url_setting_is_refused_and_never_shown(raw: Any, message: str) -> None:
    """Each took ``user:password@`` and dropped it silently (a next hop or route never got it; egress
    never fetches a broker's directory with it), and a refusal quoted the value, password and all."""
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    assert str(err.value).startswith(message), str(err.value)
    assert "s3cret" not in str(err.value)


def test_public_listen_is_allowed_with_an_allow_list_with_or_without_auth(tmp_path: Path) -> None:
    parse_config({"listen": "0.0.0.0:8080", "access": {"allow_clients": ["10.0.0.0/8"]}})
    users = str(tmp_path / "users")
    parse_config(
        {"listen": "0.0.0.0:8080", "access": {"allow_clients": ["0.0.0.0/0"], "proxy_auth_file": users}}
    )


def test_config_is_frozen_and_overrides_are_validated() -> None:
    config = parse_config({})
    with pytest.raises(AttributeError):
        config.listen = "x"  # type: ignore[misc]
    assert config.with_overrides(**{"signing.key": "/k.pem"}).signing.key == "/k.pem"
    with pytest.raises(ConfigError):
        config.with_overrides(listen="nope")


def test_unreadable_and_invalid_yaml_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_redacted_view_names_env_vars_not_values() -> None:
    config = parse_config({"credentials": [{"hosts": ["a"], "bearer_env": "TOKEN"}]})
    text = yaml.safe_dump(redacted(config))
    assert "TOKEN (value not shown)" in text


def test_signing_key_may_be_a_pkcs11_uri_and_a_bad_one_names_the_key() -> None:
    config = parse_config({"signing": {"key": "pkcs11:token=t;object=agent", "pkcs11": {"pin_env": "PIN"}}})
    assert config.signing.key == "pkcs11:token=t;object=agent"
    assert config.signing.pkcs11.pin_env == "PIN"
    with pytest.raises(ConfigError, match=r"^signing\.key: .*name the key"):
        parse_config({"signing": {"key": "pkcs11:token=t"}})


def test_signing_pkcs11_takes_one_pin_source() -> None:
    with pytest.raises(ConfigError, match=r"^signing\.pkcs11: set at most one"):
        parse_config({"signing": {"pkcs11": {"pin": "1", "pin_env": "PIN"}}})
    with pytest.raises(ConfigError, match=r"^signing\.pkcs11\.pinn"):
        parse_config({"signing": {"pkcs11": {"pinn": "1"}}})


def test_config_check_masks_the_token_pin() -> None:
    config = parse_config(
        {"signing": {"key": "pkcs11:token=t;object=k?pin-value=4711", "pkcs11": {"pin": "4711"}}}
    )
    shown = redacted(config)
    assert "4711" not in repr(shown)
    assert shown["signing"]["pkcs11"]["pin"] == "(not shown)"
    env = redacted(parse_config({"signing": {"pkcs11": {"pin_env": "TOKEN_PIN"}}}))
    assert env["signing"]["pkcs11"]["pin_env"] == "TOKEN_PIN (value not shown)"


@pytest.mark.parametrize(
    "key",
    [
        "pkcs11:token=t;object=k?pin-value=SECRET-4711",
        "pkcs11;token=t;object=k?pin-value=SECRET-4711",  # a mistyped scheme: taken for a key path
    ],
)
def test_the_parsed_configuration_never_shows_a_pin_in_its_repr(key: str) -> None:
    """Not only ``config check``: repr() of the configuration, of its signing section (a log line, a
    traceback's locals) and of the in-process Signer that holds it showed the PIN."""
    config = parse_config({"signing": {"key": key, "pkcs11": {"pin": "SECRET-4711"}}})
    for shown in (repr(config), repr(config.signing), str(config.signing), repr(config.signing.pkcs11)):
        assert "SECRET-4711" not in shown
    assert "object=k?pin-value=(not shown)" in repr(config.signing)  # the rest of the key is shown
    assert config.signing.key == key  # masked for display only
    assert config.signing.pkcs11.pin == "SECRET-4711"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('signing:\n  pkcs11:\n    module: /m.so\n    pin: "SECRET-PIN-4711\n', "not valid YAML at line"),
        ("signing:\n  pkcs11: {pin: SECRET-PIN-4711 }}\n", "not valid YAML at line"),  # a stray brace
        # an unquoted value read as a tag or an alias: PyYAML's problem named it, the PIN after ! or *
        ("signing:\n  pkcs11:\n    module: /m.so\n    pin: !Passw0rd-SECRET\n", "line 4, column 10"),
        ("signing:\n  pkcs11:\n    module: /m.so\n    pin: *SECRET-PIN\n", "needs quotes"),
    ],
)
def test_a_yaml_slip_is_located_without_quoting_the_line(tmp_path: Path, text: str, said: str) -> None:
    """PyYAML's message quotes the offending line; on the line of a PIN that was the PIN, printed
    by ``config check`` and logged by a refused SIGHUP reload."""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert said in str(caught.value)
    assert "SECRET" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            "signing:\n  label: a\nlisten: 127.0.0.1:1\nsigning:\n  label: b\n",
            "line 4, column 1 (the key signing",
        ),
        ("listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n", "line 2, column 1 (the key listen"),
        ("log:\n  level: info\n  level: debug\n", "line 3, column 3 (the key level"),
    ],
)
def test_a_key_given_twice_is_refused(tmp_path: Path, text: str, where: str) -> None:
    """PyYAML keeps the last of two equal keys: a second ``signing:`` block silently dropped the
    first one's settings, and ``config check`` said OK."""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="given twice") as caught:
        load_config(path)
    assert where in str(caught.value)


def test_a_merged_key_may_be_overridden(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("log:\n  <<: {level: info, format: json}\n  level: debug\n")
    assert load_config(path).log.level == "debug"


def test_a_config_file_that_is_not_utf8_is_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"listen: 127.0.0.1:8080\n# caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin1\.yaml: not UTF-8 text \(line 2\)"):
        load_config(path)


def test_a_schema_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("signing:\n  lable: x\n")
    with pytest.raises(ConfigError, match=r"config\.yaml: signing\.lable: unknown key"):
        load_config(path)


@pytest.mark.parametrize(("lifetime_s", "max_age_s"), [(3600, 86_400), (3630, 3600), (7200, 7170)])
def test_a_key_that_cannot_outlive_a_cached_directory_is_refused(lifetime_s: int, max_age_s: int) -> None:
    """With a key lifetime under the directory's max-age, every rotation let a key sign before the
    verifiers holding a cached directory could know it (``keys rotate`` only warned)."""
    raw = {"signing": {"key_lifetime_s": lifetime_s}, "publish": {"directory_max_age_s": max_age_s}}
    with pytest.raises(
        ConfigError, match=r"signing\.key_lifetime_s: .* must exceed publish\.directory_max_age_s"
    ):
        parse_config(raw)


def test_a_key_that_outlives_a_cached_directory_by_the_margin_is_accepted() -> None:
    config = parse_config({"signing": {"key_lifetime_s": 3631}, "publish": {"directory_max_age_s": 3600}})
    assert config.signing.key_lifetime_s == 3631


@pytest.mark.parametrize(
    "agent",
    [
        "https://registry.example/agents/alice",
        "http://agent.example",
        "https://agent.example/a/",  # a query passed a check of the path alone: it is refused in any
        # profile now, as userinfo and a fragment are (test_a_signature_agent_verifiers_cannot_fetch_...)
    ],
)
@pytest.mark.parametrize(
    "profiles",
    [
        {"default": "web-bot-auth"},
        {"rules": [{"hosts": ["*.example.com"], "profile": "web-bot-auth"}]},
        {"learn": True},  # a learned host is signed in the dictionary form too
    ],
)
def test_web_bot_auth_members_must_name_an_https_origin(agent: str, profiles: dict[str, Any]) -> None:
    """protocol-02: a Signature-Agent member (the dictionary form) is an https origin; a verifier
    ignores anything else, so the proxy signed requests no verifier could place."""
    with pytest.raises(ConfigError, match=r"signing\.signature_agent: .* https origin"):
        parse_config({"signing": {"signature_agent": agent}, "profiles": profiles})


@pytest.mark.parametrize(
    ("profiles", "setting"),
    [
        ({"default": "web-bot-auth"}, r"by profiles\.default: web-bot-auth"),
        (
            {
                "rules": [
                    {"hosts": ["a.example"], "profile": "web-bot-auth", "signature_agent": "string"},
                    {"hosts": ["b.example"], "profile": "web-bot-auth"},
                ],
                "learn": True,
            },
            r"by profiles\.rules\[1\] \(web-bot-auth\)",
        ),
        ({"learn": True}, r"to the hosts profiles\.learn: true switches to web-bot-auth"),
    ],
)
def test_the_refusal_names_the_setting_that_chose_web_bot_auth(
    profiles: dict[str, Any], setting: str
) -> None:
    """``learn: true`` with a registry path was accepted, and every learned host was then signed with
    a Signature-Agent member a protocol-02 verifier ignores."""
    with pytest.raises(ConfigError, match=rf"^signing\.signature_agent: '[^']*/agents/alice' .*{setting}"):
        parse_config(
            {"signing": {"signature_agent": "https://registry.example/agents/alice"}, "profiles": profiles}
        )


def test_learning_with_an_origin_or_no_signature_agent_is_accepted() -> None:
    for agent in ("https://agent.example", "https://agent.example/", ""):
        config = parse_config({"signing": {"signature_agent": agent}, "profiles": {"learn": True}})
        assert config.profiles.learn


def test_the_legacy_string_form_and_the_spec_profile_keep_any_http_url() -> None:
    legacy = {"rules": [{"hosts": ["a.example"], "profile": "web-bot-auth", "signature_agent": "string"}]}
    for profiles in (legacy, {"default": "svc"}):
        config = parse_config(
            {"signing": {"signature_agent": "https://registry.example/agents/alice"}, "profiles": profiles}
        )
        assert config.signing.signature_agent.endswith("/alice")
    web = parse_config(
        {"signing": {"signature_agent": "https://agent.example/"}, "profiles": {"default": "web-bot-auth"}}
    )
    assert web.signing.signature_agent == "https://agent.example/"


@pytest.mark.parametrize("section", ["verify", "relay"])
@pytest.mark.parametrize("skew", [-1, 301])
def test_a_clock_skew_is_from_0_to_300_seconds(section: str, skew: int) -> None:
    """A skew forgives a created in the future: 0 to MAX_SKEW_S (300 s), as verify-origin's --skew
    (verify.skew_s took any number above 0, and a negative one refused every signature)."""
    with pytest.raises(ConfigError, match=rf"^{section}\.skew_s: must be an integer from 0 to 300"):
        parse_config({section: {"skew_s": skew}})
    assert getattr(parse_config({section: {"skew_s": 300}}), section).skew_s == 300


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("upstream", "http://user:s3cret@backend:9000"),  # was dropped silently
        ("external_origin", "https://user:s3cret@exchange.example"),
        ("upstream", "user:s3cret@backend:9000"),  # no scheme: refused without quoting it
    ],
)
def test_a_url_with_user_and_password_is_refused_without_showing_it(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"^gateway\.{key}: ") as caught:
        parse_config({"mode": "gateway", "gateway": {"upstream": "http://127.0.0.1:9000", key: value}})
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    ("origin", "said"),
    [
        ("https://exchange.example:abc", "invalid port"),
        ("https://exchange.example:99999", "invalid port"),
        ("https://exchange..example", "missing or invalid host"),
        ("https://exchange.example/v1", "an origin, without a path"),
    ],
)
def test_an_external_origin_is_an_origin(origin: str, said: str) -> None:
    """It passed start-up with a bad port or host, then every request was refused malformed-target."""
    with pytest.raises(ConfigError, match=r"^gateway\.external_origin: ") as caught:
        parse_config(
            {"mode": "gateway", "gateway": {"upstream": "http://127.0.0.1:9000", "external_origin": origin}}
        )
    assert said in str(caught.value)
    for good in ("https://exchange.example", "https://exchange.example/", "http://[::1]:8443"):
        parse_config(
            {"mode": "gateway", "gateway": {"upstream": "http://127.0.0.1:9000", "external_origin": good}}
        )


@pytest.mark.parametrize("problem", ["found character 'SECRET that cannot start", 'expected "SECRET here'])
def test_a_yaml_problem_with_an_unbalanced_quote_is_not_shown(problem: str) -> None:
    """No file found here makes PyYAML say that; the guard is what holds if one does (a quoted part
    that cannot be masked is not shown at all)."""
    shown = _problem(yaml.MarkedYAMLError(problem=problem))
    assert "SECRET" not in shown
    assert shown == "syntax error"


@pytest.mark.parametrize(
    ("pattern", "host", "matches"),
    [
        ("::1", "[::1]", True),  # a CONNECT to [::1] or [0:0::1]: the target's host is "[::1]"
        ("[0:0::1]", "[::1]", True),
        ("[::1]", "[::2]", False),
        ("api.internal", "api.internal.", True),  # a URL target keeps its root dot
        ("API.internal.", "api.internal", True),
        ("*.example", "x.example.", True),
        ("*.example", "example", False),
        ("a.example", "b.a.example", False),
    ],
)
def test_a_host_pattern_matches_every_spelling_of_its_host(pattern: str, host: str, matches: bool) -> None:
    """Patterns were compared as written, lower-cased: ``::1`` or ``[0:0::1]`` never matched a target
    (whose host is ``[::1]``), nor ``api.internal`` a target written ``api.internal.``; a tunnel rule
    missed, and the host was intercepted and signed."""
    assert host_matches(pattern, host) is matches


@pytest.mark.parametrize("pattern", ["host:8443", "[::1]:443", "*.[::1]", "[zz]", "*.a:1"])
def test_a_host_pattern_with_a_port_or_a_broken_address_is_refused(pattern: str) -> None:
    """``host:8443`` was taken and matched nothing: a pattern names a host on every port."""
    with pytest.raises(ConfigError) as err:
        parse_config({"intercept": {"tunnel": [pattern]}})
    assert str(err.value).startswith("intercept.tunnel[0]: host patterns are 'host' or '*.domain' (no port")
