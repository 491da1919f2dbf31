"""Keep freed host memory in the process, so that XLA's large CPU buffers are not faulted in and zeroed on every call.

XLA:CPU gives each run of a compiled program one temporary buffer and frees it when the run ends. glibc serves
blocks that large with `mmap` and returns them with `munmap`, so the next run faults the whole buffer in again and
the kernel zeroes it page by page. On this project's 2-core machine a quickstart run spent 86 of its 364 CPU-seconds
in the kernel, and 7 with the settings below (BUILD_NOTES.md, issue 6). The frees come from XLA's worker
threads. Their per-thread arenas hold at most 64 MB, so three settings are needed together:
- one arena (`M_ARENA_MAX`), so that every thread allocates from the main heap;
- no `mmap` below 2 GiB (`M_MMAP_THRESHOLD`), so that those blocks come from that heap;
- no trimming of the heap's top (`M_TRIM_THRESHOLD`), so that freed blocks stay mapped for the next call.
The price is a resident size that stays near its peak. Set `RETAIN_HOST_MEMORY=0` to keep glibc's defaults.

`mallopt` takes an int, so blocks over 2 GiB (an update of a 135M model on 2,048 tokens has a 5.2 GB buffer) are
still mapped per call. Setting `GLIBC_TUNABLES=glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=68719476736:`
`glibc.malloc.trim_threshold=68719476736` before the process starts covers those too.

An arena limit set with `mallopt` only binds threads that have not allocated yet. Entry points therefore call
`retain_freed_memory()` before they import JAX or torch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# glibc's mallopt parameter numbers (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
_LARGEST_INT = 2**31 - 1
OPT_OUT_VARIABLE = "RETAIN_HOST_MEMORY"


def requested() -> bool:
    """Whether this process (and the entry points it starts) retain freed memory: unless `RETAIN_HOST_MEMORY=0`."""
    return os.environ.get(OPT_OUT_VARIABLE, "1") != "0"


def retain_freed_memory() -> bool:
    """Applies the three glibc malloc settings above. Returns whether they took effect: False when
    `RETAIN_HOST_MEMORY=0` or when the C library is not glibc."""
    if not requested():
        return False
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    settings = ((M_ARENA_MAX, 1), (M_MMAP_THRESHOLD, _LARGEST_INT), (M_TRIM_THRESHOLD, _LARGEST_INT))
    return all(libc.mallopt(option, value) == 1 for option, value in settings)
