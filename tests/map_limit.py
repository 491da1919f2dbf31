"""A pytest plugin (`tests/conftest.py` loads it) that keeps each test process below the kernel's limit on memory maps.

XLA:CPU maps every compiled program's kernels into the process (code, read-only data and data: about three maps a
kernel), and JAX keeps every program it compiled for as long as its jitted function lives; for a module-level
function, that is the whole process. A test worker compiles thousands of programs, and one reached 44,000 maps a
fifth of the way through the suite, against Linux's default `vm.max_map_count` of 65,530. At the limit, the next
`mmap` fails wherever it comes: a thread's stack (XLA aborts, "Thread tf_XLAEigen creation via pthread_create()
failed") or the code pages of the program being compiled or loaded from the persistent cache (a segfault). That was
issue 61's crash, in XLA's compile and in the cache's executable reads and writes, always late in a worker's run
(`tests/test_map_limit.py` reproduces it and checks this plugin).

After each test, when the process holds more than `map_limit_share` of the limit, JAX's caches are cleared: its
compiled programs are freed and their maps returned, and the next test compiles what it needs again. Each process
writes one line at its end with its peak map count and how many times it cleared.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

_LIMIT = pytest.StashKey["int | None"]()
_PEAK = pytest.StashKey[int]()
_CLEARS = pytest.StashKey[int]()


def max_map_count() -> int | None:
    """The kernel's limit on one process's memory maps, or None where there is none to read (not Linux)."""
    try:
        return int(pathlib.Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return None


def map_count() -> int:
    """How many memory maps this process holds now (a line of /proc/self/maps each)."""
    with open("/proc/self/maps", "rb") as maps:
        return maps.read().count(b"\n")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "map_limit_share", "share of vm.max_map_count past which JAX's compiled programs are freed after a test",
        default="0.5",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_LIMIT] = max_map_count()
    config.stash[_PEAK] = 0
    config.stash[_CLEARS] = 0


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    limit = item.config.stash[_LIMIT]
    if limit is None or "jax" not in sys.modules:
        return
    count = map_count()
    item.config.stash[_PEAK] = max(item.config.stash[_PEAK], count)
    if count > float(item.config.getini("map_limit_share")) * limit:
        sys.modules["jax"].clear_caches()
        item.config.stash[_CLEARS] += 1


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.stash.get(_PEAK, 0):
        print(
            f"map_limit: peak {config.stash[_PEAK]} memory maps of {config.stash[_LIMIT]}, "
            f"JAX's caches cleared {config.stash[_CLEARS]} times",
            file=sys.__stderr__, flush=True,
        )
