"""Loading a configuration: YAML text, then ``SIGNING_PROXY_*`` environment overrides.

Precedence: the YAML file, then the environment variables, then command-line flags. A bad variable
is refused with both names, the variable's and the key path's (``SIGNING_PROXY_LISTEN (listen):
must be HOST:PORT``). ``SIGNING_PROXY_CONFIG`` names the file when ``--config`` is not given.
The file is a regular one of at most ``MAX_CONFIG_BYTES`` (a pipe too at start-up, never on a reload).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import typing
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Final

import yaml

from ..errors import ConfigError
from .build import build
from .schema import Config

__all__ = [
    "ENV_CONFIG_FILE",
    "ENV_OVERRIDES",
    "MAX_CONFIG_BYTES",
    "apply_env_overrides",
    "load_config",
    "parse_config",
    "reloading",
]

ENV_CONFIG_FILE = "SIGNING_PROXY_CONFIG"
# Our choice: the shipped files are a few KiB; /dev/zero given as the file was read without end.
MAX_CONFIG_BYTES: Final = 1024 * 1024
_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK: Final = getattr(os, "O_NONBLOCK", 0)  # a FIFO's open waits for a writer without it
_RELOADING: ContextVar[bool] = ContextVar("signing_proxy_config_reloading", default=False)

# variable -> (dotted key path, is a comma-separated list)
ENV_OVERRIDES: dict[str, tuple[str, bool]] = {
    "SIGNING_PROXY_MODE": ("mode", False),
    "SIGNING_PROXY_LISTEN": ("listen", False),
    "SIGNING_PROXY_DATA_DIR": ("data_dir", False),
    "SIGNING_PROXY_KEY": ("signing.key", False),
    "SIGNING_PROXY_LABEL": ("signing.label", False),
    "SIGNING_PROXY_SIGNATURE_AGENT": ("signing.signature_agent", False),
    "SIGNING_PROXY_PUBLISH_LISTEN": ("publish.listen", False),
    "SIGNING_PROXY_PUBLISH_DOMAIN": ("publish.domain", False),
    "SIGNING_PROXY_NEXT_HOP": ("upstream.next_hop", False),
    "SIGNING_PROXY_ADMIN_LISTEN": ("admin.listen", False),
    "SIGNING_PROXY_ADMIN_ALLOW_CLIENTS": ("admin.allow_clients", True),
    "SIGNING_PROXY_ALLOW_CLIENTS": ("access.allow_clients", True),
    "SIGNING_PROXY_PROXY_AUTH_FILE": ("access.proxy_auth_file", False),
    "SIGNING_PROXY_LOG_LEVEL": ("log.level", False),
    "SIGNING_PROXY_LOG_FORMAT": ("log.format", False),
}


def parse_config(raw: Any) -> Config:
    """Build a validated Config from parsed YAML (``None`` or ``{}`` gives the defaults)."""
    return typing.cast(Config, build(Config, raw or {}, ""))


def load_config(path: Path | None) -> Config:
    """Load and validate a YAML file (UTF-8, no key twice in one mapping); ``None`` gives the
    embedded defaults."""
    if path is None:
        return parse_config({})
    data = _read(path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}: not UTF-8 text (line {line}); save it as UTF-8") from None
    try:
        raw = yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        # the position only: PyYAML's message quotes the offending line, which may hold a secret
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where} ({_problem(exc)})") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML (nested too deeply)") from None
    except _CONSTRUCTOR_SLIPS:  # outside any node (construct_object locates the rest): text unshown
        raise ConfigError(f"{path}: not valid YAML ({_BAD_VALUE})") from None
    try:
        return parse_config(raw)
    except ConfigError as exc:  # the key path, and the file it is in
        raise ConfigError(f"{path}: {exc}", reason=exc.reason) from None


@contextlib.contextmanager
def reloading() -> Iterator[None]:
    """While a serving proxy re-reads its configuration (SIGHUP): a path that is not a regular file
    is refused, never opened to wait. A FIFO read there held the event loop, every request and
    SIGTERM with it, until someone wrote to it; at start-up one is read (``--config <(...)``)."""
    token = _RELOADING.set(True)
    try:
        yield
    finally:
        _RELOADING.reset(token)


def _read(path: Path) -> bytes:
    """The file's bytes, at most ``MAX_CONFIG_BYTES``; ConfigError naming the path. The opened file is
    the one checked (fstat): a regular file, or at start-up a FIFO (a pipe nothing serves behind yet);
    a device, such as ``/dev/zero`` (read without end), or a folder is refused."""
    reload = _RELOADING.get()
    try:
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC | (_O_NONBLOCK if reload else 0))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file ({exc.strerror})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode) and (reload or not stat.S_ISFIFO(mode)):
            also = " (a pipe is read at start-up only)" if stat.S_ISFIFO(mode) else ""
            raise ConfigError(f"{path}: not a regular file{also}; cannot read config file")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_CONFIG_BYTES:  # a pipe gives what was written so far per read
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file ({exc.strerror})") from None
    finally:
        os.close(fd)
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; not a config file")
    return b"".join(chunks)


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping: it kept the last silently,
    so a second ``signing:`` block dropped the first one's settings (``<<`` merges may be overridden).

    Anchors and aliases are refused where they stand, before anything is built: an alias is a
    reference, so a few hundred bytes of nested aliases (a "billion laughs") expanded to millions of
    nodes that the build's walks then went through, 50 s for 7 levels while a SIGHUP reload held
    the event loop. No configuration needs them, and an unquoted PIN beginning with ``*`` or ``&``
    was read as one.

    Explicit tags (``!!int``, ``!!timestamp``, ``!name``) are refused there too: PyYAML's constructor
    for one raised ValueError or KeyError quoting the value (``pin: !!int 4711`` printed the PIN in a
    traceback, and a SIGHUP reload logged it). The non-specific ``!`` is left as PyYAML reads it."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(None, None, _NO_ALIASES, event.start_mark)
        if getattr(event, "tag", None) not in (None, "!"):
            raise yaml.composer.ComposerError(None, None, _NO_TAGS, event.start_mark)
        return super().compose_node(parent, index)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """A value PyYAML's own resolution cannot build (``2020-13-45`` read as a date, ``0x_`` as a
        number) is a ConstructorError at its line and column, never the exception quoting it."""
        try:
            return super().construct_object(node, deep=deep)
        except _CONSTRUCTOR_SLIPS:
            raise yaml.constructor.ConstructorError(None, None, _BAD_VALUE, node.start_mark) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                twice = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: PyYAML refuses it below
                continue
            if twice:
                name = key if isinstance(key, str) and _NAME.fullmatch(key) else None
                problem = f"the key {name} is given twice" if name else "a key is given twice"
                raise yaml.constructor.ConstructorError(None, None, problem, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")  # a configuration key: shown; anything else: not
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_NO_ALIASES = (
    "YAML aliases and anchors are not supported in the configuration; a value starting with * or &"
    " needs quotes"
)
_NO_TAGS = (
    "YAML tags (!!int, !!timestamp, !name) are not supported in the configuration; a value starting"
    " with ! needs quotes"
)
_BAD_VALUE = "a value YAML reads as a date or a number is not a valid one; quote it to keep it as text"
# what PyYAML's constructors raise besides its YAMLError, each with the value in its text
_CONSTRUCTOR_SLIPS = (ValueError, TypeError, KeyError, AttributeError, OverflowError)
_TAG_OR_ALIAS = ("could not determine a constructor", "found undefined alias")  # of a value unquoted


def _problem(exc: yaml.YAMLError) -> str:
    """What PyYAML says went wrong, without what it quotes of the file: a tag or an alias it names
    is the text after ``!`` or ``*``, and an unquoted PIN such as ``!Passw0rd`` was printed whole."""
    problem = getattr(exc, "problem", None)
    if not isinstance(problem, str) or not problem:
        return "syntax error"
    shown = _QUOTED.sub("'…'", problem)
    if "'" in shown.replace("'…'", "") or '"' in shown:
        return "syntax error"
    if shown != problem and problem.startswith(_TAG_OR_ALIAS):
        shown += "; a value starting with ! or * needs quotes"
    return shown


def apply_env_overrides(config: Config, environ: Mapping[str, str]) -> Config:
    """``config`` with every set ``SIGNING_PROXY_*`` variable applied together (some only make sense
    in pairs, like a public ``listen`` with ``allow_clients``); ConfigError names the variable."""
    changes: dict[str, Any] = {}
    by_path: dict[str, str] = {}
    for name, (dotted, is_list) in ENV_OVERRIDES.items():
        raw = environ.get(name)
        if raw is None:
            continue
        changes[dotted] = [item.strip() for item in raw.split(",") if item.strip()] if is_list else raw
        by_path[dotted] = name
    if not changes:
        return config
    try:
        return config.with_overrides(**changes)
    except ConfigError as exc:
        message = str(exc)
        culprit = next((var for path, var in by_path.items() if message.startswith(path)), None)
        names = culprit or ", ".join(by_path.values())
        raise ConfigError(f"{names} ({message})") from None
