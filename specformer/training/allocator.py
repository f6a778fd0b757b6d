"""Freed memory kept for the next training step (glibc's malloc, Linux).

A training step on the CPU allocates and frees the same activations, gradients and
autocast copies every time. glibc's malloc serves each block over its mmap threshold
(128 KiB at first, rising with the largest such block freed, to 32 MiB at most) with a
mapping of its own, unmapped when freed, and gives the top of its heap back to the system
once more than its trim threshold is free there. Either way the next step writes to fresh
pages, and each 4 KiB page costs a page fault: 18,000-27,000 faults a step for a 50M-
parameter llama-style model at 512 tokens in bfloat16 autocast, whose step took 312-354 ms
with them and 287-289 ms without, on a 2-core virtual machine (``benchmarks/RESULTS.md``).

:func:`keep_freed_memory` raises both thresholds for the whole process (``mallopt``), so a
freed block stays in the heap for the next step's allocation of its size. Resident memory
then stays at the peak of a step between steps, a peak every step reaches anyway; it is
not given back until the process ends. It changes nothing where the C library is not
glibc, and nothing where glibc's own settings are given in the environment
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or ``GLIBC_TUNABLES`` naming
``glibc.malloc``): set one of those to keep glibc's behaviour, or to choose other values.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["keep_freed_memory", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

# mallopt's parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest on 64-bit systems (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int

_ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_applied = False


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    if not version.startswith("glibc"):
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Keep memory freed by one training step for the next (see the module's text); True
    when the process's malloc now does so (also when an earlier call made it so)."""
    global _applied
    if _applied:
        return True
    if any(os.environ.get(name) for name in _ENVIRONMENT) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    libc = _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    _applied = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    return _applied
