"""YAML anchors and aliases are refused in a configuration file, before anything is built from it.

An alias is a reference: PyYAML builds it as one shared object, and the build's walks (``check_json``
over ``requester.ext``) then went through every expanded path. 332 bytes of six nested levels took
4.2 s; seven levels held the event loop for 50 s on a SIGHUP reload, and were accepted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from signing_proxy.config import ConfigError, load_config, loading

_BOMB_HEAD = """requester:
  id: x
  domain: a.example
  type: 1
  exchanges: [https://e.example/]
  ext:
    a: &a [x,x,x,x,x,x,x,x,x,x]
"""


def _bomb(levels: int) -> str:
    names = "abcdefghij"
    return _BOMB_HEAD + "".join(
        f"    {names[i]}: &{names[i]} [{','.join(['*' + names[i - 1]] * 10)}]\n" for i in range(1, levels)
    )


def test_an_alias_bomb_is_refused_before_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def never(raw: Any) -> Any:
        raise AssertionError("the aliases reached the build, which walks them expanded")

    monkeypatch.setattr(loading, "parse_config", never)  # the old code spent minutes in there
    path = tmp_path / "config.yaml"
    path.write_text(_bomb(7))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    said = str(caught.value)
    assert "YAML aliases and anchors are not supported in the configuration" in said
    assert "at line 7, column 8" in said  # the first anchor, &a


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("log: &l {level: info}\n", "line 1, column 6"),  # an anchor alone was accepted
        ("log:\n  <<: &base {level: info}\n  format: json\n", "line 2, column 7"),
        (
            "access:\n  allow_clients: &nets [10.0.0.0/8]\nadmin:\n  allow_clients: *nets\n",
            "line 2, column 18",  # refused at its anchor, before the alias is reached
        ),
        ("log:\n  level: *info\n", "line 2, column 10"),  # an alias of nothing
    ],
)
def test_an_anchor_or_an_alias_is_refused_by_line(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="YAML aliases and anchors are not supported") as caught:
        load_config(path)
    assert where in str(caught.value)


def test_an_unquoted_pin_read_as_an_anchor_is_refused_unshown(tmp_path: Path) -> None:
    """``pin: &SECRET`` was an anchor on an empty value: the PIN silently became null."""
    path = tmp_path / "config.yaml"
    path.write_text("signing:\n  pkcs11:\n    module: /m.so\n    pin: &SECRET-PIN-4711\n")
    with pytest.raises(ConfigError, match="needs quotes") as caught:
        load_config(path)
    assert "SECRET" not in str(caught.value)


def test_a_file_without_aliases_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "listen: 127.0.0.1:8080\nlog:\n  <<: {level: info, format: json}\n  level: debug\n"
        'hosts:\n  unsigned: ["*.internal.example"]\n'
    )
    config = load_config(path)
    assert config.log.level == "debug"
    assert config.log.format == "json"
    assert config.hosts.unsigned == ("*.internal.example",)
