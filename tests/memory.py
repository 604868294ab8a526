"""What a piece of code leaves held, by ``tracemalloc``: the bound tests against strangers' input."""

from __future__ import annotations

import contextlib
import gc
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class Held:
    """Bytes allocated inside the ``with`` and still held at its end (after a collection)."""

    bytes: int = 0

    @property
    def mib(self) -> float:
        return self.bytes / 2**20


@contextlib.contextmanager
def held_after() -> Iterator[Held]:
    """``with held_after() as held: ...``; then ``held.mib``."""
    held = Held()
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        yield held
        gc.collect()
        held.bytes = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
