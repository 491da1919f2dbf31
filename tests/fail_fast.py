"""A pytest plugin (`tests/conftest.py` loads it) that ends a stuck test run and says where it was stuck.

- A time limit per test (`test_time_limit` in pyproject, `@pytest.mark.time_limit(seconds)` for one test): past it,
  faulthandler's watchdog, a C thread that needs no Python lock, writes every thread's stack to the process's real
  stderr and ends the process. That works where the test is blocked inside C code (an XLA compile, a native sleep),
  which a signal handler in Python never reaches, and under xdist, whose workers discard what pytest-timeout writes
  to their terminal. The worker's end is a crash, and pyproject's `--max-worker-restart=0` turns the first crash into
  the end of the run, with xdist naming the test it was running; with a replacement worker, one run had waited for
  work the controller no longer handed out, until CI's own limit killed it.
- SIGUSR1: every pytest process (controller and workers) answers it with its threads' stacks and goes on.
  `.ci/with_time_limit` sends it to the whole process group when a step outlives its limit, which catches what no
  test's limit can: a process stuck outside any test, such as the xdist controller waiting for events.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from typing import TextIO

import pytest

DUMP_SIGNAL = signal.SIGUSR1
_STREAM = pytest.StashKey[TextIO]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("test_time_limit", "seconds one test may take, setup and teardown included (0: no limit)", default="0")
    parser.addoption("--test-time-limit", type=float, default=None, help="overrides the test_time_limit ini value")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "time_limit(seconds): this test's own time limit (tests/fail_fast.py)")
    # A duplicate of the process's real stderr, taken before any test's output capture redirects fd 2: a stack
    # written into a capture file would be lost with the process.
    stream = os.fdopen(os.dup(sys.__stderr__.fileno()), "w")
    config.stash[_STREAM] = stream
    faulthandler.register(DUMP_SIGNAL, file=stream, all_threads=True, chain=False)


def pytest_unconfigure(config: pytest.Config) -> None:
    faulthandler.unregister(DUMP_SIGNAL)
    config.stash[_STREAM].close()


def time_limit(item: pytest.Item) -> float:
    """The item's limit in seconds: its `time_limit` marker, else `--test-time-limit`, else the ini value."""
    marker = item.get_closest_marker("time_limit")
    if marker is not None:
        return float(marker.args[0])
    option = item.config.getoption("--test-time-limit")
    return float(item.config.getini("test_time_limit")) if option is None else option


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    limit = time_limit(item)
    if limit <= 0:
        return (yield)
    faulthandler.dump_traceback_later(limit, exit=True, file=item.config.stash[_STREAM])
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()
