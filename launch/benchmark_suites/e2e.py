"""End-to-end iteration time: a few iterations of `launch/configs/quickstart.cfg`, run as a user runs it.

Reports seconds per iteration and each phase's share (generate, score, learn, sync), from the run's metrics.jsonl.
The first iteration (jit compilation) is excluded, and medians keep out the iterations that compile a new shape.
Goal: learn + sync <= 35% of an iteration, as in a balanced RL system where generation and scoring dominate.

The same iterations also run with `--norun_duplicates_once`, one run after the other, so that what running a
group's repeated completions once saves is measured side by side. Both runs start from the same weights and seed,
and their updates differ only by rounding, so they sample the same completions until that rounding flips a token.

Where torch sees a CUDA GPU, the torch generator runs on it (`--generator_device=cuda`), beside the learner on JAX's
default device, and the in-process weight sync hands the learner's arrays over as DLPack views.
"""

from __future__ import annotations

import pathlib
import statistics
import subprocess
import sys
import tempfile

import torch

from launch.benchmark_suites.common import Report
from rl.metrics import read_metrics

ITERATIONS = 6
PHASES = ("generate", "score", "learn", "sync")
GOAL_LEARN_SYNC_SHARE = 0.35
BASELINE_FLAGS = ("--norun_duplicates_once",)


def _generator_flags() -> tuple[str, ...]:
    return ("--generator_device=cuda",) if torch.cuda.is_available() else ()


def _medians(extra_flags: tuple[str, ...]) -> dict[str, float]:
    """Median seconds of each phase and of the iteration over the timed iterations, and the median fraction of the
    batch's rows the learner ran."""
    repo = pathlib.Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as logdir:
        command = [
            sys.executable, "-m", "launch.train", "--flagfile=launch/configs/quickstart.cfg",
            f"--logdir={logdir}", f"--iterations={ITERATIONS}", f"--checkpoint_every={ITERATIONS}", *extra_flags,
        ]
        result = subprocess.run(command, cwd=repo, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited with {result.returncode}:\n{result.stderr[-4000:]}")
        timed = read_metrics(logdir)[1:]
    medians = {name: statistics.median(r[f"time/{name}"] for r in timed) for name in (*PHASES, "iteration")}
    return medians | {"model_rows": statistics.median(r["learner/model_rows"] for r in timed), "timed": len(timed)}


def run() -> Report:
    generator_flags = _generator_flags()
    shipped, baseline = _medians(generator_flags), _medians(generator_flags + BASELINE_FLAGS)

    def shares(medians):
        return {phase: medians[phase] / medians["iteration"] for phase in PHASES}

    shipped_shares, baseline_shares = shares(shipped), shares(baseline)
    learn_sync = shipped_shares["learn"] + shipped_shares["sync"]
    baseline_learn_sync = baseline_shares["learn"] + baseline_shares["sync"]
    rows = [[phase, shipped[phase], shipped_shares[phase], baseline[phase], baseline_shares[phase]] for phase in PHASES]
    rows.append(["iteration", shipped["iteration"], 1.0, baseline["iteration"], 1.0])
    return Report(
        suite="e2e",
        columns=["phase", "median_s", "share", "median_s (no merging)", "share (no merging)"],
        rows=rows,
        figures={
            "config": "launch/configs/quickstart.cfg",
            "generator_device": "cuda" if generator_flags else "cpu",
            "iterations_timed": shipped["timed"],
            "seconds_per_iteration": shipped["iteration"],
            **{f"{phase}_share": share for phase, share in shipped_shares.items()},
            "learn_sync_share": learn_sync,
            "learner_model_rows": shipped["model_rows"],
            "goal_learn_sync_share_max": GOAL_LEARN_SYNC_SHARE,
            "goal_met": learn_sync <= GOAL_LEARN_SYNC_SHARE,
            "without_run_duplicates_once": {
                "seconds_per_iteration": baseline["iteration"],
                "learn_sync_share": baseline_learn_sync,
            },
            "learn_speedup_from_run_duplicates_once": baseline["learn"] / shipped["learn"],
        },
        notes=[
            f"{shipped['timed']} iterations after the first (compilation); learn + sync = {learn_sync:.1%} of an "
            f"iteration (goal <= {GOAL_LEARN_SYNC_SHARE:.0%}); the learner ran {shipped['model_rows']:.0%} of the "
            "batch's rows (median), each distinct completion of a group once",
            f"with --norun_duplicates_once, run after it: learn + sync = {baseline_learn_sync:.1%}; learn "
            f"{baseline['learn'] / shipped['learn']:.2f}x faster with the repeats run once",
        ],
    )
