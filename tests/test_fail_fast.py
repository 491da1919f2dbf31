"""A crashing or hanging test ends a test run within seconds of its limit, naming the test and showing its stack.

Each case runs pytest in a subprocess, the way the README's test command does (this project's pytest settings from
pyproject.toml, two xdist workers), over a small test directory written here, beside files of passing tests that
would keep a waiting run alive.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
PASSING = "import time\n\ndef test_passes():\n    time.sleep(0.5)\n"
CRASHING = "import ctypes\n\ndef test_segfaults():\n    ctypes.string_at(0)\n"
# Blocked inside C, where a signal-based timeout never gets control.
# A signal (the time limit's SIGUSR1) ends libc's sleep early, so it sleeps again: the test stays blocked in C until
# it is killed, wherever the stack dump's signal lands.
HANGING = "import ctypes\n\ndef test_hangs_in_c():\n    while True:\n        ctypes.CDLL(None).sleep(3600)\n"


def run_pytest(directory: pathlib.Path, stuck_test: str, *options: str, time_limit: int | None = None,
               grace: int | None = None):
    (directory / "test_a_stuck.py").write_text(stuck_test)
    for i in range(6):
        (directory / f"test_passing_{i}.py").write_text(PASSING)
    command = [
        sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "--rootdir", str(directory),
        "-p", "tests.fail_fast", "-p", "tests.cpu_durations", "-n", "2", *options, str(directory),
    ]
    if time_limit is not None:
        command = [str(REPO / ".ci" / "with_time_limit"), str(time_limit), *command]
    environment = os.environ if grace is None else os.environ | {"WITH_TIME_LIMIT_GRACE_S": str(grace)}
    start = time.monotonic()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, env=environment)
    return result, time.monotonic() - start, result.stdout + result.stderr


def test_a_segfaulting_test_ends_the_run_at_once_with_its_name_and_stack(tmp_path):
    result, seconds, output = run_pytest(tmp_path, CRASHING)
    assert result.returncode == 1, output
    assert "crashed while running 'test_a_stuck.py::test_segfaults'" in output, output
    assert "Fatal Python error: Segmentation fault" in output and "in test_segfaults" in output, output
    assert "crashed and worker restarting disabled" in output, output
    assert seconds < 60, output


def test_a_test_blocked_in_c_past_its_timeout_ends_the_run_with_its_name_and_stack(tmp_path):
    result, seconds, output = run_pytest(tmp_path, HANGING, "-o", "test_time_limit=3")
    assert result.returncode == 1, output
    assert "Timeout (0:00:03)!" in output and "in test_hangs_in_c" in output, output
    assert "crashed while running 'test_a_stuck.py::test_hangs_in_c'" in output, output
    assert seconds < 60, output


def test_a_run_past_the_ci_time_limit_dumps_every_process_stack_and_is_killed(tmp_path):
    """With no per-test timeout, only `.ci/run`'s outer limit stops the run; every pytest process prints its
    stacks first (the worker running the hanging test among them), and the limit's exit status fails CI. The limit
    leaves the workers time to start on a loaded machine. Stacks print at the limit's signal, so the kill that
    follows (30 s later in CI) comes 5 s later here: a hung test waits for no more than it checks."""
    result, seconds, output = run_pytest(tmp_path, HANGING, "-o", "test_time_limit=0", time_limit=20, grace=5)
    assert result.returncode in (124, 137), output
    # Every process writes its stacks into the one pipe at once, and faulthandler writes a frame's line in pieces
    # (the file name, the line number, the function name), so the pieces of two processes interleave: ci13 printed
    # "test_a_stuck.py", line 5" and "test_hangs_in_c" with another thread's header between them. Each piece is one
    # write, so the names themselves arrive whole.
    assert "test_a_stuck.py" in output and "test_hangs_in_c" in output, output
    assert "was still running after 20 s" in output, output
    assert seconds < 20 + 5 + 20, output
