"""Every entry point starts as a user starts it, and the console shows our progress, not libraries' chatter.

`--helpfull` imports an entry point's whole module graph and parses its flags, so a dependency missing from
`pyproject.toml` or a flag defined twice shows up here as a traceback instead of part-way through a user's run.
"""

from __future__ import annotations

import logging
import pathlib
import subprocess
import sys

import pytest
from absl import flags
from absl.testing import flagsaver

from conductor import console

REPO = pathlib.Path(__file__).resolve().parents[2]
# Each entry point with one flag it defines itself, which its help must list.
ENTRY_POINTS = {
    "train": "estimator",
    "sft": "warm_start_teacher",
    "eval": "methods",
    "serve": "format_attempts",
    "compare": "seeds",
    "benchmark": "suite",
    "sglang_servers": "num_servers",
    "data": "recheck",
}


def test_every_entry_point_prints_its_flags_with_helpfull():
    processes = {
        name: subprocess.Popen(
            [sys.executable, "-m", f"launch.{name}", "--helpfull"], cwd=REPO, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        for name in ENTRY_POINTS
    }
    failures = []
    for name, process in processes.items():
        output, _ = process.communicate(timeout=600)
        # absl's help exits 1 after printing; an import error exits 1 too, so the output is what tells them apart.
        listed = f"--{ENTRY_POINTS[name]}:" in output or f"--[no]{ENTRY_POINTS[name]}:" in output
        if "Traceback" in output or not listed or process.returncode not in (0, 1):
            failures.append(f"launch.{name} (exit {process.returncode}):\n{output[-3000:]}")
    assert not failures, "\n\n".join(failures)


@pytest.fixture
def restore_logger_levels():
    names = ("", "absl", "conductor", "rl", "launch", "__main__", "math_verify")
    saved = {name: logging.getLogger(name).level for name in names}
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


def _effective_levels() -> dict[str, int]:
    loggers = ("rl.loop", "conductor.warm_start", "launch.sft", "__main__", "orbax.checkpoint", "absl",
               "jax._src.xla_bridge", "math_verify.grader")
    return {name: logging.getLogger(name).getEffectiveLevel() for name in loggers}


def test_by_default_our_progress_shows_and_library_info_does_not(restore_logger_levels):
    flags.FLAGS.mark_as_parsed()
    with flagsaver.flagsaver(verbosity=0):
        console.configure(library_logs=False)
        levels = _effective_levels()
    assert levels == {
        "rl.loop": logging.INFO, "conductor.warm_start": logging.INFO, "launch.sft": logging.INFO,
        "__main__": logging.INFO,
        "orbax.checkpoint": logging.WARNING, "absl": logging.WARNING, "jax._src.xla_bridge": logging.WARNING,
        "math_verify.grader": logging.ERROR,
    }


@pytest.mark.parametrize("switch", [{"library_logs": True, "verbosity": 0}, {"library_logs": False, "verbosity": 1}])
def test_library_logs_or_absl_verbosity_bring_library_info_back(restore_logger_levels, switch):
    flags.FLAGS.mark_as_parsed()
    with flagsaver.flagsaver(verbosity=switch["verbosity"]):
        console.configure(library_logs=switch["library_logs"])
        levels = _effective_levels()
    library_level = logging.DEBUG if switch["verbosity"] else logging.INFO
    assert levels["orbax.checkpoint"] == levels["absl"] == levels["jax._src.xla_bridge"] == library_level
    assert levels["rl.loop"] == logging.INFO
