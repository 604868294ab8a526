"""The ``signing-proxy`` entry point (the console script and ``python -m signing_proxy``), kept light.

For the serving commands (``run``, ``gateway``) it holds SIGHUP before the command's modules are
imported, which takes most of a second: a SIGHUP then (a supervisor's reload, ``keys rotate``'s
note followed at once) was left to its default action and ended the proxy without a line. Now it is
recorded and applied once the proxy is up, as one during the rest of start-up is
(``service.workers.hold_sighup``). The other commands keep SIGHUP's default action: a terminal that
closes still ends them.

A reader of stdout that goes away (``signing-proxy config check | head``) ends the command with exit
status 1 and no traceback: what is left to write goes to ``/dev/null``, as the Python documentation
recommends (``signal`` module, "Note on SIGPIPE"), since Python ignores SIGPIPE and the write raises
``BrokenPipeError`` instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ..service.workers import hold_sighup

__all__ = ["EXIT_STDOUT_GONE", "SERVING", "main"]

SERVING = frozenset({"run", "gateway"})  # the commands whose event loop takes SIGHUP as "reload"
EXIT_STDOUT_GONE = 1  # a runtime failure (cli.main's statuses), what Python exits with on EPIPE


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if next((word for word in words if not word.startswith("-")), None) in SERVING:
        hold_sighup()  # the only top-level option, --version, takes no value: the first word is the command
    from .main import main as dispatch  # noqa: PLC0415 - imported after the hold: this is the slow part

    try:
        try:
            status = dispatch(argv)
        except SystemExit:  # argparse's --help and --version: their text may still be buffered
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # what is still buffered, written here: at exit it failed as "Exception ignored"
        return status
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_STDOUT_GONE


def _stdout_to_devnull() -> None:
    """Point stdout's descriptor at ``/dev/null``: the flush at interpreter exit of what is still
    buffered raised ``BrokenPipeError`` again (a second message, exit status 120)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
