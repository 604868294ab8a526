"""The ``signing-proxy`` entry point (the console script and ``python -m signing_proxy``), kept light.

For the serving commands (``run``, ``gateway``) it holds SIGHUP before the command's modules are
imported, which takes most of a second: a SIGHUP then (a supervisor's reload, ``keys rotate``'s
note followed at once) was left to its default action and ended the proxy without a line. Now it is
recorded and applied once the proxy is up, as one during the rest of start-up is
(``service.workers.hold_sighup``). The other commands keep SIGHUP's default action: a terminal that
closes still ends them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..service.workers import hold_sighup

__all__ = ["SERVING", "main"]

SERVING = frozenset({"run", "gateway"})  # the commands whose event loop takes SIGHUP as "reload"


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if next((word for word in words if not word.startswith("-")), None) in SERVING:
        hold_sighup()  # the only top-level option, --version, takes no value: the first word is the command
    from .main import main as dispatch  # noqa: PLC0415 - imported after the hold: this is the slow part

    return dispatch(argv)
