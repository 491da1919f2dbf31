"""Benchmarks: `python -m launch.benchmark --suite=NAME`.

Each suite lives in `launch/benchmark_suites/<NAME>.py` and exposes `run() -> Report`; this entry point prints the
table and, as its last line, one JSON object of the figures. Speed goals are checked here, never in pytest.
Started on several hosts as one job (`conductor/distributed.py`), the learner suite runs over all their devices and
process 0 prints the report.
"""

from __future__ import annotations

from conductor.host_memory import retain_freed_memory

# First, before JAX and torch start their threads; run as a program, restart with glibc tunables
# (conductor/host_memory.py).
retain_freed_memory(restart=__name__ == "__main__")

import importlib
import inspect

from absl import app, flags

from conductor import console, distributed
from launch.benchmark_suites.common import emit
from launch.flag_groups import console as console_flags
from launch.flag_groups import distributed as distributed_flags

SUITES = ("forward", "learner", "rollout", "sync", "env", "e2e", "gpu", "pipeline", "memory")

_SUITE = flags.DEFINE_enum("suite", None, SUITES, "Which benchmark suite to run.")
_PROFILE_DIR = flags.DEFINE_string(
    "profile_dir", None, "Where a suite that profiles (gpu) writes its jax.profiler trace; default a temporary one."
)


def main(argv: list[str]) -> None:
    del argv
    console.configure(console_flags.LIBRARY_LOGS.value)
    distributed.initialize(distributed_flags.from_flags())
    module = importlib.import_module(f"launch.benchmark_suites.{_SUITE.value}")
    profiles = "profile_dir" in inspect.signature(module.run).parameters
    if _PROFILE_DIR.value and not profiles:
        raise app.UsageError(f"--profile_dir: the {_SUITE.value} suite does not profile")
    report = module.run(profile_dir=_PROFILE_DIR.value) if profiles else module.run()
    if distributed.is_main_process():
        emit(report)


if __name__ == "__main__":
    # Required only when this module is the program: importing it (tests, other launchers) must not
    # impose its flag on their parses of the global FLAGS.
    flags.mark_flag_as_required("suite")
    app.run(main)
