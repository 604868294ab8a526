"""``run`` sets glibc's malloc thresholds so that uvloop's 256 KiB TLS read buffer, allocated and
shrunk on every upstream TLS read, stays on the heap instead of costing mmap, mremap and munmap per
response (strace under intercepted HTTPS load). Observed in a child process with mallinfo2(3):
bytes in mmapped chunks while such a buffer is alive, at glibc's default threshold, then after."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

CHILD = """
import ctypes
from signing_proxy.cli.run import _keep_tls_reads_on_the_heap

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD at glibc's documented default (fixed, not dynamic)

def mapped_while_alive():
    before = libc.mallinfo2().hblkhd
    # what uvloop's SSL read allocates (then shrinks) per record; 32 at once, more than the heap
    # may happen to have free
    buffers = [bytearray(256 * 1024) for _ in range(32)]
    return libc.mallinfo2().hblkhd - before

default = mapped_while_alive()
assert _keep_tls_reads_on_the_heap()
print(default, mapped_while_alive())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt(3) is glibc's")
def test_a_256_kib_buffer_comes_from_the_heap_once_run_has_set_the_thresholds() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], check=False, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    default, tuned = (int(n) for n in out.stdout.split())
    assert default >= 16 * 256 * 1024  # mappings of their own, unmapped again when freed
    assert tuned == 0
