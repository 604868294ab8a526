"""What a piece of code leaves held, by ``tracemalloc`` (the bound tests against strangers' input),
and what it leaves for the cycle collector alone (``left_in_cycles``)."""

from __future__ import annotations

import contextlib
import gc
import tracemalloc
import types
from collections import Counter
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


def left_in_cycles() -> Counter[str]:
    """What only the cycle collector would free now, by function (frames) or type name; then freed."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return Counter(
            o.f_code.co_qualname if isinstance(o, types.FrameType) else type(o).__name__ for o in gc.garbage
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.collect()  # what was saved is freed now
