"""``run`` sets glibc's malloc thresholds so that uvloop's 256 KiB TLS read buffer, allocated and
shrunk on every upstream TLS read, stays on the heap instead of costing mmap, mremap and munmap per
response (strace under intercepted HTTPS load). Observed in a child process with mallinfo2(3):
bytes in mmapped chunks while such a buffer is alive, at glibc's default threshold, then after; and
bytes of heap handed back to the system once freed, below and above the 4 MiB trim threshold."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from signing_proxy.cli.run import _YOUNG_PASS_EVERY

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt(3) is glibc's")

MALLINFO = """
import ctypes

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD at glibc's documented default (fixed, not dynamic)
libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD likewise
"""

CHILD = (
    MALLINFO
    + """
from signing_proxy.cli.run import _keep_tls_reads_on_the_heap, _settle_heap

def mapped_while_alive():
    before = libc.mallinfo2().hblkhd
    # what uvloop's SSL read allocates (then shrinks) per record; 32 at once, more than the heap
    # may happen to have free
    buffers = [bytearray(256 * 1024) for _ in range(32)]
    return libc.mallinfo2().hblkhd - before

default = mapped_while_alive()
CALL
print(default, mapped_while_alive())
"""
)

TRIM_CHILD = (
    MALLINFO
    + """
from signing_proxy.cli.run import _keep_tls_reads_on_the_heap

def returned_once_freed(mib):
    # on the heap (above the mmap threshold), at its top: freed, they make one free top chunk
    buffers = [bytearray(256 * 1024) for _ in range(int(4 * mib))]
    alive = libc.mallinfo2().arena
    del buffers
    return alive - libc.mallinfo2().arena  # what free() gave back to the system (sbrk)

assert _keep_tls_reads_on_the_heap()
libc.malloc_trim(0)  # whatever start-up left free at the top, returned: only the buffers are there
print(returned_once_freed(3.5), returned_once_freed(4.5))
"""
)


def _child(script: str) -> list[int]:
    out = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return [int(n) for n in out.stdout.split()]


def _mapped_after(call: str) -> int:
    """Bytes mmapped for 32 live 256 KiB buffers once ``call`` has run in the child (at glibc's
    default threshold, first, they must have mappings of their own)."""
    default, after = _child(CHILD.replace("CALL", call))
    assert default >= 16 * 256 * 1024  # mappings of their own, unmapped again when freed
    return after


def test_a_256_kib_buffer_comes_from_the_heap_once_run_has_set_the_thresholds() -> None:
    assert _mapped_after("assert _keep_tls_reads_on_the_heap()") == 0


def test_settling_the_heap_before_the_first_request_sets_the_thresholds() -> None:
    # run's own call, before the first request, not only a helper nothing may call
    assert _mapped_after("_settle_heap()") == 0


def test_settling_the_heap_freezes_start_up_and_spaces_the_young_passes() -> None:
    script = (
        "import gc\n"
        "from signing_proxy.cli.run import _settle_heap\n"
        "default = gc.get_threshold()\n"
        "_settle_heap()\n"
        "print(*default, *gc.get_threshold(), gc.get_freeze_count())\n"
    )
    default_young, *default_older, young, older1, older2, frozen = _child(script)
    assert (default_young, young) == (700, _YOUNG_PASS_EVERY)
    assert [older1, older2] == default_older  # the older generations keep Python's own thresholds
    assert frozen > 10_000  # start-up's objects, out of every later pass


def test_freed_tls_buffers_stay_on_the_heap_up_to_4_mib_and_go_back_beyond() -> None:
    # at glibc's 128 KiB trim threshold, freeing 3.5 MiB at the top of the heap would shrink it (and
    # the next response would grow it again); at 4 MiB it stays, and 4.5 MiB freed is trimmed
    below, above = _child(TRIM_CHILD)
    assert below == 0
    assert above >= 1024 * 1024
