"""``return_freed_heap``: blocks freed into glibc's heap stay resident until it runs, and leave with it."""

import json
import os
import platform
import subprocess
import sys

import pytest

from tests.trainer.cli import HANG_GUARD_S

BLOCKS, BLOCK_MIB = 64, 4

# In a fresh process, so that the heap holds nothing of the suite's: freeing a 16 MiB block raises glibc's mmap
# threshold to 16 MiB (as an update's first freed activations do), so the next 4 MiB blocks come from the heap, each
# pinned there by a 100 KiB block taken from the heap's top right after it (too large for glibc's caches of freed
# small blocks, which could place it elsewhere). Resident sizes from /proc/self/statm.
PROGRAM = f"""
import ctypes, json, os
from hybridflow.workers.training import return_freed_heap
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
page = os.sysconf("SC_PAGE_SIZE")
def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * page
libc.free(libc.malloc(16 << 20))
blocks, pins = [], []
for _ in range({BLOCKS}):
    blocks.append(libc.malloc({BLOCK_MIB} << 20))
    ctypes.memset(blocks[-1], 1, {BLOCK_MIB} << 20)
    pins.append(libc.malloc(100 << 10))
before_free = resident()
for block in blocks:
    libc.free(block)
after_free = resident()
return_freed_heap()
print(json.dumps({{"before_free": before_free, "after_free": after_free, "after_trim": resident()}}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's heap; other allocators return freed blocks")
def test_freed_heap_blocks_stay_resident_until_returned():
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=HANG_GUARD_S, check=True
    )
    sizes = json.loads(done.stdout)
    freed = BLOCKS * BLOCK_MIB << 20
    # Free alone returns nothing from the middle of the heap: at most the last block, were it at the top.
    assert sizes["before_free"] - sizes["after_free"] <= BLOCK_MIB << 20
    # The trim returns every whole page of each free block: all but the page holding its chunk header and the
    # partial page at its end.
    assert sizes["after_free"] - sizes["after_trim"] >= freed - BLOCKS * 2 * os.sysconf("SC_PAGE_SIZE")
