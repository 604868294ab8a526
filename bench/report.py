"""Issue 21's figures as the README prints them, read from one run's JSON.

    .venv/bin/python bench/run.py --json run.json
    .venv/bin/python bench/report.py run.json          # markdown on stdout

Nothing is measured here: every figure comes from the file, so the README's performance tables are
the run's own, not copied by hand. It prints the table (POST 1 KiB), the alternating rounds with
their medians, and each of issue 21's targets with what the table and the medians gave. A figure
the run did not take (``--quick``, ``--headline-rounds 0``) is shown as "—" and its target as "not
measured", never as met.
"""

from __future__ import annotations

import argparse
import json
import operator
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from run import (  # the names bench/run.py gives its rows
    DEFAULT_ROW,
    FLOOR_ROW,
    GATEWAY_ROW,
    NAIVE_PASS_ROW,
    NAIVE_RELAY_ROW,
    NAIVE_SIGN_ROW,
    RELAY_ROW,
    TUNED_ROW,
    WORKERS_ROW,
)

Doc = Mapping[str, Any]

# (config in the run's table, label in the README); POST rows, in this order
_ROWS = (
    (DEFAULT_ROW, "**default configuration**"),
    (TUNED_ROW, "tuned (access log off, warnings)"),
    (WORKERS_ROW, "default, `--workers {n}` (unpinned, sharing both cores with wrk and the origin)"),
    (NAIVE_SIGN_ROW, "naive aiohttp signer (reference)"),
    (NAIVE_PASS_ROW, "naive aiohttp passthrough, no signing (reference)"),
    (FLOOR_ROW, "floor: uvloop + llhttp forwarding only (reference)"),
)
_SIDE = (
    ("relay_table", RELAY_ROW, "**relay hop** (verify one label, stack ours), default configuration"),
    ("relay_table", NAIVE_RELAY_ROW, "naive aiohttp relay on `http-message-signatures` (reference)"),
    ("gateway_table", GATEWAY_ROW, "**gateway** (verify the agent's label, forward), default configuration"),
)
_HTTPS = "**intercepted HTTPS**, keep-alive tunnels, default configuration"
MISSING = "—"
_MINUS = "\N{MINUS SIGN}"


def _post(doc: Doc, config: str, conns: int) -> Mapping[str, Any] | None:
    for row in doc.get("table", ()):
        name = row["config"]
        named = name == config or (config == WORKERS_ROW and name.startswith(config))
        if named and row["method"] == "POST" and row["connections"] == conns:
            return row  # type: ignore[no-any-return]
    return None


def _side(doc: Doc, table: str, config: str, conns: int) -> Mapping[str, Any] | None:
    return next((r for r in doc.get(table, ()) if r["config"] == config and r["connections"] == conns), None)


def _https(doc: Doc, conns: int) -> Mapping[str, Any] | None:
    return next((r for r in doc.get("https", ()) if r["connections"] == conns), None)


def _ms(value: float) -> str:
    return f"{value:.2f} ms"


def _us(value: float) -> str:
    return f"{value:,.0f} µs"


def table(doc: Doc) -> Iterator[str]:
    """The README's main table: POST 1 KiB, every row the run measured at 1 (ours), 16 and 64."""
    yield "| row | conns | req/s | p50 | p99 | CPU/request | added p50 over direct |"
    yield "|---|---:|---:|---:|---:|---:|---:|"
    for config, label in _ROWS:
        for conns in (1, 16, 64):
            row = _post(doc, config, conns)
            if row is None or (conns == 1 and config != DEFAULT_ROW):
                continue
            name = label.format(n=row["config"].partition("=")[2])
            added = _ms(row["proxy_p50_ms"] - row["direct_p50_ms"])
            yield (
                f"| {name} | {conns} | {row['proxy_rps']:,.0f} | {_ms(row['proxy_p50_ms'])} | "
                f"{_ms(row['proxy_p99_ms'])} | {_us(row['proxy_cpu_us_per_request'])} | {added} |"
            )
    for conns in (16, 64):
        if (row := _https(doc, conns)) is not None:
            yield (
                f"| {_HTTPS} | {conns} | {row['rps']:,.0f} | {_ms(row['p50_ms'])} | {_ms(row['p99_ms'])} | "
                f"{_us(row['proxy_cpu_us_per_request'])} | {MISSING} |"
            )
    for key, config, label in _SIDE:
        for conns in (16, 64):
            if (row := _side(doc, key, config, conns)) is None or (config == NAIVE_RELAY_ROW and conns != 64):
                continue
            yield (
                f"| {label} | {conns} | {row['rps']:,.0f} | {_ms(row['p50_ms'])} | {_ms(row['p99_ms'])} | "
                f"{_us(row['cpu_us_per_request'])} | {MISSING} |"
            )


def rounds(doc: Doc) -> Iterator[str]:
    """The alternating rounds and their medians (nothing when the run took none)."""
    headline = doc.get("headline")
    if not headline:
        return
    yield (
        "| round | default, 64 conns | naive signer, 64 conns | ratio | p99 | added p50, 1 conn "
        "| HTTPS, 64 tunnels | HTTPS paired | access log, on \N{MINUS SIGN} off |"
    )
    yield "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    named = [(str(i), r) for i, r in enumerate(headline["rounds"], 1)] + [("**median**", headline["median"])]
    for name, r in named:
        yield (
            f"| {name} | {r['rps']:,.0f} req/s, {r['cpu_us_per_request']:.1f} µs | "
            f"{r['naive_rps']:,.0f} req/s, {r['naive_cpu_us_per_request']:.1f} µs | {r['ratio']:.2f}x | "
            f"{_ms(r['p99_ms'])} | {_added(r)} | {r['https_rps']:,.0f} req/s, "
            f"{r['https_share']:.0%} of plain, {r['https_cpu_us_per_request']:.1f} µs | "
            f"{_paired(r)} | {r['access_log_us']:+.1f} µs "
            f"({r['access_log_on_us']:.1f} {_MINUS} {r['access_log_off_us']:.1f}) |"
        )


def _added(r: Mapping[str, Any]) -> str:
    """The added p50 at one connection, and the floor forwarder's beside it (runs that measured it)."""
    floor = r.get("floor_added_p50_ms_1conn")
    added = _ms(r["added_p50_ms_1conn"])
    return added if floor is None else f"{added} (floor {_ms(floor)})"


def _paired(r: Mapping[str, Any]) -> str:
    """The paired HTTPS share of a round (runs before it had none)."""
    if "https_paired_share" not in r:
        return MISSING
    return f"{r['https_paired_share']:.0%} ({r['https_paired_plain_us']:.1f} / {r['https_paired_us']:.1f} µs)"


@dataclass(frozen=True)
class Target:
    """One of issue 21's targets: what the table gave, what the rounds' medians gave."""

    name: str
    limit: float
    at_most: bool  # True: the figure must be <= limit; False: >= limit
    unit: str
    in_table: Callable[[Doc], float | None]
    in_rounds: Callable[[Doc], float | None]

    def met(self, value: float | None) -> bool | None:
        if value is None:
            return None
        return bool((operator.le if self.at_most else operator.ge)(value, self.limit))


def _ratio(
    a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, key: str, key_b: str = ""
) -> float | None:
    return None if a is None or b is None else float(a[key]) / float(b[key_b or key])


def _median(key: str) -> Callable[[Doc], float | None]:
    def read(doc: Doc) -> float | None:
        headline = doc.get("headline")
        value = headline["median"].get(key) if headline else None  # runs before a figure lack it
        return None if value is None else float(value)

    return read


def _figure(doc: Doc, key: str) -> float | None:
    return float(doc[key]) if key in doc else None


def _table_field(config: str, conns: int, key: str) -> Callable[[Doc], float | None]:
    def read(doc: Doc) -> float | None:
        row = _post(doc, config, conns)
        return None if row is None else float(row[key])

    return read


def _added_p50(doc: Doc) -> float | None:
    row = _post(doc, DEFAULT_ROW, 1)
    return None if row is None else float(row["proxy_p50_ms"] - row["direct_p50_ms"])


def _none(_doc: Doc) -> None:
    return None


TARGETS = (
    Target(
        "requests/s against the naive signer, 64 connections",
        2.0,
        False,
        "x",
        lambda d: _ratio(_post(d, DEFAULT_ROW, 64), _post(d, NAIVE_SIGN_ROW, 64), "proxy_rps"),
        _median("ratio"),
    ),
    Target(
        "CPU per request, 64 connections",
        95,
        True,
        " µs",
        _table_field(DEFAULT_ROW, 64, "proxy_cpu_us_per_request"),
        _median("cpu_us_per_request"),
    ),
    Target(
        "p99, 64 connections",
        15,
        True,
        " ms",
        _table_field(DEFAULT_ROW, 64, "proxy_p99_ms"),
        _median("p99_ms"),
    ),
    Target("added p50 at 1 connection", 0.25, True, " ms", _added_p50, _median("added_p50_ms_1conn")),
    Target(
        "intercepted HTTPS against plain HTTP, 64",
        0.80,
        False,
        "",
        lambda d: _ratio(_https(d, 64), _post(d, DEFAULT_ROW, 64), "rps", "proxy_rps"),
        _median("https_share"),
    ),
    Target(
        "intercepted HTTPS against plain HTTP, paired (at once, CPU per request)",
        0.80,
        False,
        "",
        _none,
        _median("https_paired_share"),
    ),
    Target(
        "relay against the naive relay, 64 connections",
        2.0,
        False,
        "x",
        lambda d: _ratio(
            _side(d, "relay_table", RELAY_ROW, 64), _side(d, "relay_table", NAIVE_RELAY_ROW, 64), "rps"
        ),
        _none,
    ),
    Target(
        "RSS growth streaming 100 MiB",
        5,
        True,
        " MiB",
        lambda d: _figure(d, "streaming 100 MiB: RSS growth (MiB)"),
        _none,
    ),
    Target("idle RSS", 60, True, " MiB", lambda d: _figure(d, "proxy idle RSS (MiB)"), _none),
    Target("access log, on \N{MINUS SIGN} off", 3, True, " µs", _none, _median("access_log_us")),
)


def _shown(target: Target, value: float | None, extra: int = 0) -> str:
    if value is None:
        return MISSING
    if target.unit == "" and target.limit < 1:  # a share
        return f"{value:.{extra}%}"
    digits = (2 if target.unit in {"x", " ms"} else 1) + extra
    return f"{value:.{digits}f}{target.unit}"


def _beside_limit(target: Target, value: float | None) -> str:
    """``value`` as shown, with the digits it takes not to read as the limit it misses (3.007 µs
    against 3.0 was shown "3.0 µs", beside "no")."""
    for extra in range(4):
        text = _shown(target, value, extra)
        if value is None or target.met(value) or text != _shown(target, target.limit, extra):
            return text
    return text


def targets(doc: Doc) -> Iterator[str]:
    """Each target, the table's figure and the medians', and whether the run met it."""
    yield "| target | limit | table | median of rounds | met |"
    yield "|---|---:|---:|---:|---|"
    for target in TARGETS:
        table_value, rounds_value = target.in_table(doc), target.in_rounds(doc)
        verdicts = [v for v in (target.met(table_value), target.met(rounds_value)) if v is not None]
        verdict = "not measured" if not verdicts else "yes" if all(verdicts) else "**no**"
        sign = "≤" if target.at_most else "≥"
        yield (
            f"| {target.name} | {sign} {_shown(target, target.limit)} | {_beside_limit(target, table_value)} "
            f"| {_beside_limit(target, rounds_value)} | {verdict} |"
        )


def render(doc: Doc) -> str:
    parts = [f"Machine: {doc.get('machine', MISSING)}.", "", *table(doc)]
    if doc.get("headline"):
        parts += ["", *rounds(doc)]
    parts += ["", *targets(doc)]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path, help="the JSON that bench/run.py --json wrote")
    args = parser.parse_args(argv)
    try:
        doc = json.loads(args.run.read_text())
    except (OSError, ValueError) as exc:
        print(f"report: {args.run}: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
