"""Host memory freed by the trainer goes back to the system at once.

glibc's malloc serves a request of at least its mmap threshold with a mapping of its own, which
``free`` unmaps; smaller ones come from its heaps, whose freed space it keeps. The threshold
starts at 128 KiB and, unless set, rises to the size of each mapped block freed, up to 32 MiB
(mallopt(3), M_MMAP_THRESHOLD). A training step frees tensors of a few MiB to tens of MiB by the
hundred (gathered FSDP2 units, gradients, activations), so after the first step nearly all of
them come from the heaps, and the heaps keep what the next step's differently sized tensors
cannot reuse: resident memory grows step after step to far above what the tensors need.
Setting the threshold fixes it (no rise): every tensor of 1 MiB or more is its own mapping,
returned when freed, and resident memory follows the tensors alive.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3
"""mallopt's parameter number (glibc's malloc.h)."""
MMAP_THRESHOLD_BYTES = 1 << 20
"""Requests of this size or more are mapped on their own; smaller ones (bookkeeping, small
tensors) stay in the heaps, where their reuse is cheapest."""


def return_freed_memory() -> bool:
    """Fix malloc's mmap threshold for this process; False where the C library has no mallopt
    (a musl or macOS build), which then keeps its own behaviour."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
