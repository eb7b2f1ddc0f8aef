"""``return_freed_heap``: a phase's freed host memory goes back to the system when the phase ends.

glibc serves blocks below its mmap threshold from its heaps and raises that threshold (up to 32 MiB) to the size
of each mapped block freed, so from an update's first freed activations on, all of them come from the heap.
Freed, they stay resident around the blocks that outlive the phase (gradients, optimizer state, the samples), and
the next phase grows the heap past them: a 30M fp32 run at 128 tokens held 1.66 GiB after one update, where its
gradients and optimizer state need 0.34 (issue 27). ``malloc_trim`` at the end of each generation, update and
forward pass hands the heap's free pages back, for one walk of its free lists and the page faults of the next
phase's first touch: the host-side counterpart of a GPU's ``empty_cache``.

``bench_scaling``'s hybridflow side, fp32, on a 2-core AVX2 VM (2026-12-05; peak resident GiB, s/step): 30M x 128
tokens 2.18-2.27 -> 1.92-2.01, 100M x 16 3.43-3.54 -> 2.84-2.97, 30M x 16 1.58 -> 1.50, the steps' times within
the runs' noise (3%). A fixed mmap threshold (``mallopt``) cut more, 1.78 and 2.48 GiB at 4 MiB, but cost 1.5-7%
of the step, likely in page faults: every block from the threshold on, an FSDP2 layer's gathered weights and
gradients included, is then a fresh mapping the kernel zeroes page by page, at every micro-batch.
"""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl): another allocator, with its own way of returning memory
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def return_freed_heap() -> None:
    """Hand the pages of every heap's free chunks back to the system (glibc ``malloc_trim(0)``)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
