"""Keep freed host memory in the process, so that XLA's large CPU buffers are not faulted in and zeroed on every call.

XLA:CPU gives each run of a compiled program one temporary buffer and frees it when the run ends. glibc serves
blocks that large with `mmap` and returns them with `munmap`, so the next run faults the whole buffer in again and
the kernel zeroes it page by page: on a small CPU host that was a large share of a quickstart run's CPU time
(measurements: docs/decisions/005-host-memory-retained-where-jax-computes-on-the-cpu.md). The frees come from XLA's
worker threads. Their per-thread arenas hold at most 64 MB, so three settings are needed together:
- one arena (`arena_max`), so that every thread allocates from the main heap;
- no `mmap` for blocks below the threshold (`mmap_threshold`), so that they come from that heap;
- no trimming of the heap's top (`trim_threshold`), so that freed blocks stay mapped for the next call.
The price is a resident size that stays near its peak.

Only where JAX computes on the host CPU: `JAX_PLATFORMS` names `cpu` first, or, with `JAX_PLATFORMS` unset, no GPU or
TPU device node is visible. On a GPU host, XLA:GPU's temporary buffers live on the GPU, and the settings slow the
compiler down, most likely because the one arena serialises its many threads (on a GPU host a tiny model's first
compile did not finish with them; the same decision page). `RETAIN_HOST_MEMORY=1` applies them anyway,
`RETAIN_HOST_MEMORY=0` never.

Two ways to apply them, because glibc reads its tunables only when a process starts:
- `retain_freed_memory(restart=True)`, in an entry point run as `__main__`: the process restarts itself once (same
  command line, `os.execve`) with `GLIBC_TUNABLES` set, thresholds 64 GiB. Blocks of any size are then reused,
  which matters because one update of even a 135M model on a few thousand tokens needs a temporary buffer of several
  GB (the learner benchmark's figures with and without it: the same decision page). The restarted process removes
  the variable from its environment, so the programs it starts begin with glibc's defaults (an entry point among
  them restarts itself in turn; worker processes started inside `tunables_for_children()` keep them). A
  `GLIBC_TUNABLES` the user set is left alone: no restart, `mallopt` only.
- `retain_freed_memory()`, anywhere else (a test session, a module imported by an entry point): `mallopt` in the
  running process. It takes an int, so blocks over 2 GiB are still mapped afresh on every call. An arena limit set
  with `mallopt` only binds threads that have not allocated yet, so call it before importing JAX or torch.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import os
import sys
from typing import Iterator

# glibc's mallopt parameter numbers (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
_LARGEST_INT = 2**31 - 1
_TUNABLE_THRESHOLD = 1 << 36  # 64 GiB: larger than any buffer this machine can hold
TUNABLES = (
    f"glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold={_TUNABLE_THRESHOLD}"
    f":glibc.malloc.trim_threshold={_TUNABLE_THRESHOLD}"
)
SETTING_VARIABLE = "RETAIN_HOST_MEMORY"
# NVIDIA GPUs, TPUs (v4 through the accel driver, v5 and later through VFIO) and AMD GPUs (ROCm's kernel driver).
ACCELERATOR_DEVICE_PATTERNS = ("/dev/nvidia[0-9]*", "/dev/accel[0-9]*", "/dev/vfio/[0-9]*", "/dev/kfd")
RESTARTED_VARIABLE = "CONDUCTOR_RL_RESTARTED_WITH_TUNABLES"
# What a process started with the tunables finds in its environment (a restarted entry point, or a child started
# inside `tunables_for_children`), and clears.
_STARTED_WITH_TUNABLES = {"GLIBC_TUNABLES": TUNABLES, RESTARTED_VARIABLE: TUNABLES}

_started_with_tunables = False


def requested() -> bool:
    """Whether this process (and the entry points it starts) retain freed memory: as `RETAIN_HOST_MEMORY` says (`0`
    or `1`), else when JAX will compute on the host CPU."""
    setting = os.environ.get(SETTING_VARIABLE)
    if setting is not None:
        return setting != "0"
    return jax_computes_on_cpu()


def jax_computes_on_cpu() -> bool:
    """Decided before JAX starts (its backend would take the accelerator): `JAX_PLATFORMS`' first platform when it
    is set, else whether no accelerator device node exists."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return platforms.split(",")[0].strip() == "cpu"
    return not any(glob.glob(pattern) for pattern in ACCELERATOR_DEVICE_PATTERNS)


def retain_freed_memory(*, restart: bool = False) -> bool:
    """Applies the three glibc malloc settings above: with `restart`, by restarting this process with `GLIBC_TUNABLES`
    (the call does not return then), else with `mallopt`. Returns whether they took effect: False when
    not `requested()` or when the C library is not glibc."""
    global _started_with_tunables
    if _started_with_tunables:
        return True  # mallopt now would lower the thresholds to 2 GiB
    if not requested():
        return False
    libc = _glibc()
    if libc is None:
        return False
    if all(os.environ.get(name) == value for name, value in _STARTED_WITH_TUNABLES.items()):
        for name in _STARTED_WITH_TUNABLES:
            del os.environ[name]
        _started_with_tunables = True
        return True
    if restart and "GLIBC_TUNABLES" not in os.environ:
        environment = {**os.environ, **_STARTED_WITH_TUNABLES}
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environment)
    settings = ((M_ARENA_MAX, 1), (M_MMAP_THRESHOLD, _LARGEST_INT), (M_TRIM_THRESHOLD, _LARGEST_INT))
    return all(libc.mallopt(option, value) == 1 for option, value in settings)


@contextlib.contextmanager
def tunables_for_children() -> Iterator[None]:
    """While open, the Python processes this one starts (multiprocessing's `spawn` children among them) start with
    the tunables this process restarted with, and keep them: their `retain_freed_memory` recognises and clears the
    variables, as a restarted entry point does. A benchmark's engine processes then reuse blocks over 2 GiB as their
    parent does. Does nothing where this process did not start with the tunables."""
    if not _started_with_tunables:
        yield
        return
    os.environ.update(_STARTED_WITH_TUNABLES)
    try:
        yield
    finally:
        for name in _STARTED_WITH_TUNABLES:
            os.environ.pop(name, None)


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc
