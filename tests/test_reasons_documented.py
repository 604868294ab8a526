"""Every stable reason the package can send to a client or show an operator is in the README.

A user who gets ``403 interception-disabled`` must be able to look it up: the README's "Refusal
reasons" tables name each one in backticks. The reasons are read from the source with ``ast``, not
from a list kept by hand: the reason argument (positional or ``reason=``) of every construction of
an exception of the package's one tree (``core.errors.Error`` and its subclasses), of every function
or dataclass with a parameter named ``reason`` (``problem_body``, ``_refuse``, the metrics' counters),
of every function that passes one of its own parameters on as such an argument (found to a fixpoint),
the ``reason`` member of dict literals (the documents discovery sends), and the literal default of a
``reason`` parameter. A name is followed to the string it is bound to: a module constant (imported
or not), a tuple constant spread with ``*``, a local assigned only literals. ``x.reason`` passes on a
reason built elsewhere and is not counted again.

What is computed (an f-string, a call) cannot be read so: each such argument is listed in
``COMPUTED`` with the finite set it expands to, and a computed argument the list does not know, or
one it lists that is gone, fails the test, so that a new one is looked at and documented."""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "signing_proxy"
README = ROOT / "README.md"
ERROR_ROOT = ("signing_proxy.core.errors", "Error")

Def = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
Function = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda


@dataclass(frozen=True)
class Computed:
    """A computed reason argument: how many sites have it, and every reason it can be."""

    sites: int
    reasons: frozenset[str]


_DIRECTORY_PARSER_REASONS = (  # core.keys.parse_directory, and public_key_from_jwk and parse_rfc3339 it calls
    "malformed-directory",
    "too-many-keys",
    "private-member-in-directory",
    "malformed-jwk",
    "unsupported-key-type",
    "private-member-in-public-jwk",
    "unsupported-key-use",
    "unsupported-key-alg",
    "kid-mismatch",
    "missing-key-window",
    "bad-key-window",
    "malformed-timestamp",
    "duplicate-key",
    "bad-revocation-url",
)

# (module, the argument as ast.unparse writes it) -> its sites and what it expands to. Keep each
# expansion exact: the README documents every reason in it.
COMPUTED: dict[tuple[str, str], Computed] = {
    # parse_field_dictionary(value, name): the fields parsed by name (Signature-Input, Signature,
    # Signature-Key, Signature-Agent, Accept-Signature), and the field of a covered ;key= component
    # (Message.dictionary), which the profiles allow on Signature, Signature-Input and Signature-Agent only
    ("signing_proxy/core/signature_components.py", "f'malformed-{name.lower()}'"): Computed(
        1,
        frozenset(
            {
                "malformed-signature-input",
                "malformed-signature",
                "malformed-signature-key",
                "malformed-signature-agent",
                "malformed-accept-signature",
            }
        ),
    ),
    # for name in ("created", "expires")
    ("signing_proxy/core/signature_verify.py", "f'missing-{name}'"): Computed(
        1, frozenset({"missing-created", "missing-expires"})
    ),
    # read_secret_text(..., reasons=): "proxy-auth" (proxy.access) and "credential" (bearer files)
    ("signing_proxy/proxy/credentials.py", "f'{reasons}-permissions'"): Computed(
        1, frozenset({"proxy-auth-permissions", "credential-permissions"})
    ),
    ("signing_proxy/proxy/credentials.py", "f'{reasons}-unreadable'"): Computed(
        1, frozenset({"proxy-auth-unreadable", "credential-unreadable"})
    ),
    ("signing_proxy/proxy/credentials.py", "f'{reasons}-malformed'"): Computed(
        2, frozenset({"proxy-auth-malformed", "credential-malformed"})
    ),
    # fetch_parsed / settle: kind is "directory" or "revocation"
    ("signing_proxy/verify/directory.py", "f'{kind}-fetch-failed'"): Computed(
        1, frozenset({"directory-fetch-failed", "revocation-fetch-failed"})
    ),
    ("signing_proxy/verify/directory.py", "f'{kind}-fetch-timeout'"): Computed(
        1, frozenset({"directory-fetch-timeout", "revocation-fetch-timeout"})
    ),
    ("signing_proxy/verify/directory.py", "f'{kind}-unusable'"): Computed(
        1, frozenset({"directory-unusable", "revocation-unusable"})
    ),
    # fetch_parsed: a parser's reason, "directory-" put before it for a directory (unless it starts
    # so); the revocation list's parser reasons are kept as they are (collected at their raise)
    ("signing_proxy/verify/directory.py", "reason"): Computed(
        1, frozenset(f"directory-{reason}" for reason in _DIRECTORY_PARSER_REASONS)
    ),
    # _failure(exc): the reason of the EgressError or ProxyError it is given, passed on
    ("signing_proxy/proxy/discovery.py", "*_failure(exc)"): Computed(1, frozenset()),
    ("signing_proxy/proxy/discovery.py", "dict:reason"): Computed(
        2,
        # getattr(exc, "reason", "requester-unavailable"), and _failure's reason passed on
        frozenset({"requester-unavailable"}),
    ),
    # the reason of a TokenError the handle saved when its key was refused, raised again
    ("signing_proxy/storage/pkcs11.py", "*refused"): Computed(1, frozenset()),
    # status, outcome = 500, "internal-error" (the other outcomes are access-log words, not reasons)
    ("signing_proxy/proxy/exchange.py", "outcome"): Computed(1, frozenset({"internal-error"})),
}


class Module:
    """One source file: its top-level definitions and constants, its imports, each node's parent."""

    def __init__(self, name: str, path: Path, root: Path) -> None:
        self.name = name
        self.rel = path.relative_to(root).as_posix()
        self.tree = ast.parse(path.read_text(encoding="utf-8"), self.rel)
        self.top: dict[str, ast.AST] = {}  # a def, or the value a constant is bound to
        self.imports: dict[str, str] = {}  # local name -> dotted name it was imported as
        for node in self.tree.body:
            if isinstance(node, Def):
                self.top[node.name] = node
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(name, node.module, node.level, path.name == "__init__.py")
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        self.top[target.id] = node.value
        self.parent: dict[ast.AST, ast.AST] = {
            child: node for node in ast.walk(self.tree) for child in ast.iter_child_nodes(node)
        }

    def scopes(self, node: ast.AST) -> list[Def | ast.Lambda]:
        """The functions and classes around ``node``, innermost first."""
        out: list[Def | ast.Lambda] = []
        cur = self.parent.get(node)
        while cur is not None:
            if isinstance(cur, Def | ast.Lambda):
                out.append(cur)
            cur = self.parent.get(cur)
        return out


def _absolute(module: str, target: str | None, level: int, is_package: bool) -> str:
    if level == 0:
        return target or ""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, target] if target else parts)


Ref = tuple[Module, ast.AST | None]  # a definition or constant value in a module; None: the module


@dataclass(frozen=True)
class Sink:
    """Where a callable takes its reason: a position among the call's arguments, and a keyword."""

    position: int | None
    keyword: str


@dataclass
class Found:
    reasons: dict[str, set[str]] = field(default_factory=dict)  # reason -> "path:line" sites
    computed: Counter[tuple[str, str]] = field(default_factory=Counter)

    def add(self, reasons: frozenset[str], module: Module, node: ast.AST) -> None:
        for reason in reasons:
            self.reasons.setdefault(reason, set()).add(f"{module.rel}:{getattr(node, 'lineno', 0)}")


LITERAL, PARAMETER, PASSED_ON, COMPUTED_ARG = "literal", "parameter", "passed-on", "computed"


@dataclass(frozen=True)
class Value:
    """What a reason argument is: literal strings, a parameter of the function around it (its
    callers' arguments are read instead), a reason passed on (``x.reason``), or computed."""

    kind: str
    reasons: frozenset[str] = frozenset()
    parameter: tuple[Function, str] | None = None


class Package:
    """The package's modules under ``root`` (the repository), and the callables that take a reason."""

    def __init__(self, root: Path = ROOT) -> None:
        self.modules: dict[str, Module] = {}
        for path in sorted((root / PACKAGE.name).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            self.modules[".".join(parts)] = Module(".".join(parts), path, root)
        self.sinks: dict[ast.AST, Sink] = {}
        self._definitions = [
            (module, node)
            for module in self.modules.values()
            for node in ast.walk(module.tree)
            if isinstance(node, Def)
        ]

    # --- names
    def lookup(self, dotted: str, depth: int = 0) -> Ref | None:
        if dotted in self.modules:
            return self.modules[dotted], None
        module_name, _, name = dotted.rpartition(".")
        module = self.modules.get(module_name)
        if module is None or depth > 10:
            return None
        return self.lookup_name(module, name, depth)

    def lookup_name(self, module: Module, name: str, depth: int = 0) -> Ref | None:
        if name in module.top:
            return module, module.top[name]
        if name in module.imports:
            return self.lookup(module.imports[name], depth + 1)
        return None

    def resolve(self, module: Module, expr: ast.expr) -> Ref | None:
        """What a Name or dotted Attribute names (through modules and class bodies)."""
        if isinstance(expr, ast.Name):
            return self.lookup_name(module, expr.id)
        if isinstance(expr, ast.Attribute):
            base = self.resolve(module, expr.value)
            if base is None:
                return None
            owner, node = base
            if node is None:
                return self.lookup_name(owner, expr.attr)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, Def) and item.name == expr.attr:
                        return owner, item
                    if isinstance(item, ast.Assign | ast.AnnAssign) and item.value is not None:
                        targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                        if any(isinstance(t, ast.Name) and t.id == expr.attr for t in targets):
                            return owner, item.value
        return None

    # --- classes
    def bases(self, module: Module, cls: ast.ClassDef) -> list[tuple[Module, ast.ClassDef]]:
        out = []
        for base in cls.bases:
            ref = self.resolve(module, base)
            if ref is not None and isinstance(ref[1], ast.ClassDef):
                out.append((ref[0], ref[1]))
        return out

    def is_error(self, module: Module, cls: ast.ClassDef) -> bool:
        if (module.name, cls.name) == ERROR_ROOT:
            return True
        return any(self.is_error(m, c) for m, c in self.bases(module, cls))

    def method(self, module: Module, cls: ast.ClassDef, name: str) -> tuple[Module, Def] | None:
        for item in cls.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == name:
                return module, item
        for base_module, base in self.bases(module, cls):
            found = self.method(base_module, base, name)
            if found is not None:
                return found
        return None

    # --- sinks
    def sink_of(self, module: Module, node: Def, name: str) -> Sink | None:
        """Where ``node`` (a function, or a class: its ``__init__`` or dataclass fields) takes ``name``."""
        if isinstance(node, ast.ClassDef):
            if _is_dataclass(node):
                fields = [
                    item.target.id
                    for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                ]
                return Sink(fields.index(name), name) if name in fields else None
            init = self.method(module, node, "__init__")
            return None if init is None else self.sink_of(init[0], init[1], name)
        args = node.args
        positional = [a.arg for a in args.posonlyargs + args.args]
        in_class = isinstance(module.parent.get(node), ast.ClassDef)
        if in_class and positional and not _decorated(node, "staticmethod"):
            positional = positional[1:]  # self or cls
        if name in positional:
            return Sink(positional.index(name), name)
        if name in [a.arg for a in args.kwonlyargs]:
            return Sink(None, name)
        return None

    def add_sink(self, module: Module, node: Def, name: str) -> bool:
        sink = self.sink_of(module, node, name)
        if sink is None or node in self.sinks:
            return False
        self.sinks[node] = sink
        return True

    def callee(self, module: Module, call: ast.Call) -> tuple[Module, Def] | None:
        func = call.func
        scopes = module.scopes(call)
        cls = next((s for s in scopes if isinstance(s, ast.ClassDef)), None)
        if isinstance(func, ast.Name):
            for scope in scopes:  # a function defined inside the caller's
                if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
                    for item in ast.walk(scope):
                        if (
                            isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                            and item is not scope
                            and item.name == func.id
                            and module.scopes(item)[0] is scope
                        ):
                            return module, item
            if func.id == "cls" and cls is not None:
                return module, cls
            ref = self.lookup_name(module, func.id)
        elif isinstance(func, ast.Attribute):
            target = func.value
            if _is_super(target) and cls is not None:
                for base_module, base in self.bases(module, cls):
                    found = self.method(base_module, base, func.attr)
                    if found is not None:
                        return found
                return None
            if isinstance(target, ast.Name) and target.id in ("self", "cls") and cls is not None:
                return self.method(module, cls, func.attr)
            ref = self.resolve(module, func)
            if ref is None and not func.attr.startswith("__"):  # obj.method(): the one sink of that name
                named = [
                    (m, n)
                    for m, n in self._definitions
                    if n in self.sinks and n.name == func.attr and not isinstance(n, ast.ClassDef)
                ]
                return named[0] if len(named) == 1 else None
        else:
            return None
        if ref is not None and isinstance(ref[1], Def):
            return ref[0], ref[1]
        return None

    # --- values
    def value(self, module: Module, expr: ast.expr, at: ast.AST) -> Value:
        """What ``expr``, an argument at ``at``, is as a reason."""
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return Value(LITERAL, frozenset({expr.value}))
        if isinstance(expr, ast.IfExp):
            one, other = self.value(module, expr.body, at), self.value(module, expr.orelse, at)
            if one.kind == LITERAL and other.kind == LITERAL:
                return Value(LITERAL, one.reasons | other.reasons)
            return Value(COMPUTED_ARG)
        if isinstance(expr, ast.Attribute):
            if expr.attr == "reason":  # an error's reason, passed on: collected where it was built
                return Value(PASSED_ON)
            ref = self.resolve(module, expr)
            if ref is not None and isinstance(ref[1], ast.expr):
                return self.value(ref[0], ref[1], ref[1])
            return Value(COMPUTED_ARG)
        if isinstance(expr, ast.Name):
            for scope in module.scopes(at):
                if isinstance(scope, ast.ClassDef):
                    continue
                found = self._local(module, scope, expr.id)
                if found is not None:
                    return found
            ref = self.lookup_name(module, expr.id)
            if ref is not None and isinstance(ref[1], ast.expr):
                return self.value(ref[0], ref[1], ref[1])
        return Value(COMPUTED_ARG)

    def _local(self, module: Module, scope: Function, name: str) -> Value | None:
        """``name`` inside ``scope``: a parameter, a local assigned only literals, or None (not local)."""
        args = scope.args
        if name in [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]:
            return Value(PARAMETER, parameter=(scope, name))
        stores = [
            node
            for node in ast.walk(scope)
            if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store)
        ]
        if not stores:
            return None
        reasons: frozenset[str] = frozenset()
        for store in stores:
            assign = module.parent.get(store)
            if not isinstance(assign, ast.Assign | ast.AnnAssign) or assign.value is None:
                return Value(COMPUTED_ARG)  # unpacked, a loop variable, a walrus
            found = self.value(module, assign.value, assign)
            if found.kind != LITERAL:
                return Value(COMPUTED_ARG)
            reasons |= found.reasons
        return Value(LITERAL, reasons)

    def argument(self, module: Module, call: ast.Call, sink: Sink) -> ast.expr | str | None:
        """The reason argument of ``call``, or a string naming a spread that cannot be read."""
        for keyword in call.keywords:
            if keyword.arg == sink.keyword:
                return keyword.value
        args: list[ast.expr] = []
        for arg in call.args:
            if isinstance(arg, ast.Starred):
                ref = self.resolve(module, arg.value)
                if ref is not None and isinstance(ref[1], ast.Tuple):
                    args.extend(ref[1].elts)
                    continue
                return ast.unparse(arg)
            args.append(arg)
        if sink.position is not None and sink.position < len(args):
            return args[sink.position]
        if any(keyword.arg is None for keyword in call.keywords):
            return ast.unparse(call)
        return None  # the default: collected from the signature

    # --- the collection
    def collect(self) -> Found:
        for module, node in self._definitions:
            if not isinstance(node, ast.ClassDef) or self.is_error(module, node) or _is_dataclass(node):
                self.add_sink(module, node, "reason")
        calls = [
            (module, node)
            for module in self.modules.values()
            for node in ast.walk(module.tree)
            if isinstance(node, ast.Call)
        ]
        changed = True
        while changed:  # a function passing its parameter on as a reason is a sink for its callers
            changed = False
            for module, call in calls:
                callee = self.callee(module, call)
                if callee is None or callee[1] not in self.sinks:
                    continue
                arg = self.argument(module, call, self.sinks[callee[1]])
                if isinstance(arg, ast.expr):
                    parameter = self.value(module, arg, call).parameter
                    if parameter is not None and not isinstance(parameter[0], ast.Lambda):
                        changed |= self.add_sink(module, parameter[0], parameter[1])
        found = Found()
        for module, call in calls:
            callee = self.callee(module, call)
            if callee is not None and callee[1] in self.sinks:
                self._take(found, module, call, self.argument(module, call, self.sinks[callee[1]]))
        for module, node in self._definitions:
            if node in self.sinks and not isinstance(node, ast.ClassDef):
                for name, default in _defaults(node):
                    if name == self.sinks[node].keyword:
                        self._take(found, module, node, default)
        for module in self.modules.values():  # {"reason": ...}: a document's error member
            for item in ast.walk(module.tree):
                if isinstance(item, ast.Dict):
                    for key, value in zip(item.keys, item.values, strict=True):
                        if isinstance(key, ast.Constant) and key.value == "reason":
                            self._take(found, module, item, value, prefix="dict:")
        return found

    def _take(
        self, found: Found, module: Module, at: ast.AST, arg: ast.expr | str | None, prefix: str = ""
    ) -> None:
        if arg is None:
            return
        if isinstance(arg, str):
            found.computed[(module.rel, prefix + arg)] += 1
            return
        value = self.value(module, arg, at)
        if value.kind == LITERAL:
            found.add(value.reasons, module, at)
        elif value.kind == COMPUTED_ARG:
            found.computed[(module.rel, prefix + ast.unparse(arg))] += 1


def _is_super(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "super"


def _decorated(node: Def, name: str) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if (isinstance(target, ast.Name) and target.id == name) or (
            isinstance(target, ast.Attribute) and target.attr == name
        ):
            return True
    return False


def _is_dataclass(node: ast.ClassDef) -> bool:
    return _decorated(node, "dataclass")


def _defaults(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, ast.expr]]:
    args = node.args
    positional = args.posonlyargs + args.args
    out = [
        (arg.arg, default)
        for arg, default in zip(
            positional[len(positional) - len(args.defaults) :], args.defaults, strict=True
        )
    ]
    out += [
        (arg.arg, default)
        for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True)
        if default is not None
    ]
    return out


@cache
def collect() -> Found:
    return Package().collect()


def _sites(found: Found, reason: str) -> str:
    sites = sorted(found.reasons.get(reason, {"COMPUTED"}))
    return ", ".join(sites[:3]) + (f", +{len(sites) - 3}" if len(sites) > 3 else "")


def documented() -> str:
    return README.read_text(encoding="utf-8")


def test_every_computed_reason_argument_is_known() -> None:
    found = collect()
    expected = Counter({key: known.sites for key, known in COMPUTED.items()})
    unknown = {key: n for key, n in found.computed.items() if expected.get(key) != n}
    gone = {key: n for key, n in expected.items() if found.computed.get(key) != n}
    assert not unknown, (
        "computed reason arguments not in COMPUTED (or at another number of sites): list each with "
        f"the reasons it can be, and document them: {unknown}"
    )
    assert not gone, f"COMPUTED lists arguments the source no longer has (or fewer of): {gone}"


def test_the_collector_sees_the_reasons_it_must() -> None:
    """A guard on the collector itself: reasons reached each way it reads are found."""
    reasons = collect().reasons
    for reason in (
        "connect-not-supported",  # ProxyError(405, ...), status first
        "malformed-header",  # ProxyError in the engine
        "not-found",  # publish._problem(404, ...)
        "client-not-allowed",  # problem_body(403, *_NOT_ALLOWED): a tuple constant spread
        "verifier-busy",  # VERIFIER_BUSY, a module constant imported elsewhere
        "quota-store-full",  # super().__init__(QUOTA_STORE_FULL, ...)
        "usage",  # CliError: its reason fixed in super().__init__
        "config-invalid",  # ConfigError's default reason
        "signing-token-unavailable",  # metrics.signing_failure(...)
        "discover-resources-malformed",  # {"reason": ...} in discovery's documents
        "chain-linkage-broken",  # link_error(reason, ...): a helper passing its parameter on
    ):
        assert reason in reasons, reason


def test_every_reason_is_documented_in_the_readme() -> None:
    found = collect()
    reasons = set(found.reasons)
    for known in COMPUTED.values():
        reasons |= known.reasons
    text = documented()
    missing = sorted(reason for reason in reasons if f"`{reason}`" not in text)
    assert not missing, (
        "reasons the README does not name in backticks (add them to '## Refusal reasons'):\n"
        + ("\n".join(f"  {reason}  ({_sites(found, reason)})" for reason in missing))
    )


def test_a_computed_reason_is_counted_and_a_passed_on_one_followed(tmp_path: Path) -> None:
    """The collector on a package of three files: a reason passed through a helper's parameter and
    bound to a module constant is found at the helper's caller; an f-string reason is counted."""
    package = tmp_path / PACKAGE.name
    (package / "core").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "core" / "__init__.py").write_text("")
    (package / "core" / "errors.py").write_text(
        "class Error(Exception):\n"
        "    def __init__(self, reason: str, detail: str = '') -> None:\n"
        "        self.reason = reason\n"
    )
    (package / "proxy.py").write_text(
        "from .core.errors import Error\n"
        "BUSY = 'busy-now'\n"
        "def wrap(code: str) -> Error:\n"
        "    return Error(code)\n"
        "def busy() -> Error:\n"
        "    return wrap(BUSY)\n"
        "def refuse(name: str) -> Error:\n"
        "    return Error(f'malformed-{name}')\n"
    )
    found = Package(tmp_path).collect()
    assert set(found.reasons) == {"busy-now"}
    assert found.computed == Counter({(f"{PACKAGE.name}/proxy.py", "f'malformed-{name}'"): 1})
