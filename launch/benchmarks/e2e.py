"""End-to-end iteration time: a few iterations of `launch/configs/quickstart.cfg`, run as a user runs it.

Reports seconds per iteration and each phase's share (generate, score, learn, sync), from the run's metrics.jsonl.
The first iteration (jit compilation) is excluded. Goal: learn + sync <= 35% of an iteration, as in a balanced RL
system where generation and scoring dominate.
"""

from __future__ import annotations

import pathlib
import statistics
import subprocess
import sys
import tempfile

from launch.benchmarks.common import Report
from rl.metrics import read_metrics

ITERATIONS = 6
PHASES = ("generate", "score", "learn", "sync")
GOAL_LEARN_SYNC_SHARE = 0.35


def run() -> Report:
    repo = pathlib.Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as logdir:
        command = [
            sys.executable, "-m", "launch.train", "--flagfile=launch/configs/quickstart.cfg",
            f"--logdir={logdir}", f"--iterations={ITERATIONS}", f"--checkpoint_every={ITERATIONS}",
        ]
        subprocess.run(command, cwd=repo, check=True, capture_output=True, text=True)
        records = read_metrics(logdir)
    timed = records[1:]
    per_iteration = statistics.median(r["time/iteration"] for r in timed)
    phase_seconds = {phase: statistics.median(r[f"time/{phase}"] for r in timed) for phase in PHASES}
    shares = {phase: seconds / per_iteration for phase, seconds in phase_seconds.items()}
    learn_sync = shares["learn"] + shares["sync"]
    rows = [[phase, phase_seconds[phase], shares[phase]] for phase in PHASES]
    rows.append(["iteration", per_iteration, 1.0])
    return Report(
        suite="e2e",
        columns=["phase", "median_s", "share"],
        rows=rows,
        figures={
            "config": "launch/configs/quickstart.cfg",
            "iterations_timed": len(timed),
            "seconds_per_iteration": per_iteration,
            **{f"{phase}_share": share for phase, share in shares.items()},
            "learn_sync_share": learn_sync,
            "goal_learn_sync_share_max": GOAL_LEARN_SYNC_SHARE,
            "goal_met": learn_sync <= GOAL_LEARN_SYNC_SHARE,
        },
        notes=[f"{len(timed)} iterations after the first (compilation); learn + sync = {learn_sync:.1%} of an iteration"],
    )
