"""Runs a sweep's unfinished runs side by side (`execute`), each `launch.train` in a subprocess pinned to cores of
its own with its thread pools sized to them; one sweep per directory at a time (`hold_lock`)."""

from __future__ import annotations

import fcntl
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Callable, Mapping, Sequence

from sweeps.grid import Run, train_command
from sweeps.records import is_finished, prepare_restart, record_finished


def thread_environment(base: Mapping[str, str], threads: int) -> dict[str, str]:
    """`base` with torch's and BLAS's thread pools sized `threads`, and with one thread XLA's Eigen kernels
    single-threaded. XLA has no flag for its CPU pool's size; `cores_of_slot`'s affinity bounds it."""
    environment = dict(base)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        environment[name] = str(threads)
    xla_flags = [flag for flag in environment.get("XLA_FLAGS", "").split()
                 if not flag.startswith("--xla_cpu_multi_thread_eigen")]
    if threads == 1:
        xla_flags.append("--xla_cpu_multi_thread_eigen=false")
    environment["XLA_FLAGS"] = " ".join(xla_flags)
    return environment


def cores_of_slot(slot: int, threads: int, cores: Sequence[int]) -> set[int]:
    """The cores the run in `slot` (0 .. parallel-1) is pinned to: `threads` consecutive ones, wrapping around, so
    the slots share the cores evenly."""
    return {cores[(slot * threads + offset) % len(cores)] for offset in range(min(threads, len(cores)))}


def usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def parallelism(parallel: int | None, threads_per_run: int | None, cores: int) -> tuple[int, int]:
    """(runs at once, threads per run): what is not given fills the cores."""
    if parallel is None:
        threads_per_run = threads_per_run or 2
        return max(1, cores // threads_per_run), threads_per_run
    return parallel, threads_per_run or max(1, cores // parallel)


class RunFailed(RuntimeError):
    pass


Starter = Callable[[Run, int, pathlib.Path, pathlib.Path], subprocess.Popen]


def execute(runs: Sequence[Run], flag: str, start: Starter, parallel: int, log: Callable[[str], None] = print,
            poll_s: float = 0.5) -> None:
    """Runs every unfinished run, up to `parallel` at once. `start(run, slot, stdout_path, stderr_path)` starts one
    (`launch.train` in a subprocess, or a test's fake) in a free slot, 0 .. parallel-1. After a failure no further
    run starts; the running ones finish (their work is kept), then RunFailed names every failure."""
    pending = [run for run in runs if not is_finished(run)]
    for run in runs:
        if is_finished(run):
            log(f"{run.logdir}: finished earlier, kept")
    running: dict[Run, tuple[subprocess.Popen, int, float]] = {}
    failures: list[str] = []
    try:
        while pending or running:
            while pending and len(running) < parallel and not failures:
                run = pending.pop(0)
                action = prepare_restart(run)
                run.logdir.mkdir(parents=True, exist_ok=True)
                log(f"{run.logdir}: {action}")
                slot = min(set(range(parallel)) - {slot for _, slot, _ in running.values()})
                process = start(run, slot, run.logdir / "train.stdout", run.logdir / "train.stderr")
                running[run] = (process, slot, time.time())
            if failures and not running:
                break
            time.sleep(poll_s)
            for run, (process, _, started) in list(running.items()):
                code = process.poll()
                if code is None:
                    continue
                del running[run]
                wall_s = time.time() - started
                stdout = (run.logdir / "train.stdout").read_text(errors="replace")
                if code == 0:
                    try:
                        record_finished(run, flag, process.args, stdout, wall_s)
                    except ValueError as error:
                        failures.append(f"{run.logdir}: exited 0 without a summary ({error})")
                        continue
                    log(f"{run.logdir}: finished in {wall_s:.0f} s")
                else:
                    failures.append(f"{run.logdir}: exit status {code}, see {run.logdir / 'train.stderr'}")
                    log(failures[-1])
    finally:
        for process, _, _ in running.values():  # interrupted: the runs stop with us and resume on the next call
            process.terminate()
        for process, _, _ in running.values():
            process.wait()
    if failures:
        raise RunFailed("; ".join(failures) + f" ({len(pending)} runs not started; rerun the same command to go on)")


def subprocess_starter(train_args: Sequence[str], flag: str, threads: int, cores: Sequence[int],
                       lock_fd: int) -> Starter:
    """Starts `launch.train` for a run, pinned to its slot's cores, its output in the run's directory. Each run
    inherits the comparison's lock, so a run orphaned by a killed comparison keeps the lock until it ends and a rerun
    cannot start it twice."""
    environment = thread_environment(os.environ, threads)

    def start(run: Run, slot: int, stdout_path: pathlib.Path, stderr_path: pathlib.Path) -> subprocess.Popen:
        with open(stdout_path, "a") as stdout, open(stderr_path, "a") as stderr:
            process = subprocess.Popen(train_command(train_args, flag, run), stdout=stdout, stderr=stderr,
                                       env=environment, pass_fds=(lock_fd,))
        # Set as the process starts, long before it imports JAX and torch, whose threads inherit it; execve
        # (launch.train restarts itself) keeps it.
        os.sched_setaffinity(process.pid, cores_of_slot(slot, threads, cores))
        return process

    return start


def stop_runs_on_sigterm() -> None:
    """`kill` then stops the runs too (execute's cleanup), as Ctrl-C does; only SIGKILL leaves them running, holding
    the lock until they end."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def hold_lock(out: pathlib.Path) -> int:
    """An exclusive lock on `<out>/.lock` for this process (and the runs it starts), or SystemExit if it is held."""
    fd = os.open(out / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SystemExit(f"{out} is in use by another comparison or by runs a killed one left running; wait for "
                         f"them to end (fuser {out / '.lock'} lists them)") from None
    return fd
