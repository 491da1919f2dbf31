"""A sweep run's state on disk: finished once its directory holds `run_summary.json` (written atomically after
launch.train exited 0 and printed its summary), resumable from its checkpoint otherwise; and the training flags a
sweep's directory was started with (`compare.json`)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from typing import Any, Sequence

from sweeps.grid import Run

RUN_SUMMARY = "run_summary.json"


def write_json_atomically(path: pathlib.Path, payload: Any) -> None:
    """Written beside `path`, then renamed over it: a reader sees the old file or the whole new one."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(partial, path)


def is_finished(run: Run) -> bool:
    return (run.logdir / RUN_SUMMARY).exists()


def run_record(run: Run) -> dict[str, Any]:
    """A finished run's `run_summary.json`: flag, value, seed, wall time, command and launch.train's summary."""
    return json.loads((run.logdir / RUN_SUMMARY).read_text())


def finished_runs(out: pathlib.Path, flag: str) -> list[Run]:
    """The finished runs of `flag`'s sweep under `out`, with the value and seed their records name, for readers of a
    comparison's directory that do not know its values and seeds."""
    runs = []
    for path in sorted(out.glob(f"*/seed=*/{RUN_SUMMARY}")):
        recorded = json.loads(path.read_text())
        if recorded["flag"] == flag:
            runs.append(Run(recorded["value"], recorded["seed"], path.parent))
    return runs


def has_checkpoint(run: Run) -> bool:
    checkpoints = run.logdir / "checkpoints"
    return checkpoints.is_dir() and any(entry.name.isdigit() for entry in checkpoints.iterdir())


def prepare_restart(run: Run) -> str:
    """Readies an unfinished run's directory for its next attempt; says what the attempt will do. Without a
    checkpoint, launch.train would warm-start and train afresh but append to the metrics the killed attempt logged,
    so the directory is emptied first."""
    if not run.logdir.exists():
        return "starts"
    if has_checkpoint(run):
        return "resumes from its checkpoint"
    shutil.rmtree(run.logdir)
    return "starts over (killed before its first checkpoint)"


def summary_line(stdout: str) -> dict[str, Any]:
    """launch.train's summary: the last line of its stdout, one JSON object."""
    for line in reversed(stdout.splitlines()):
        if line.strip():
            summary = json.loads(line)
            if not isinstance(summary, dict):
                raise ValueError(f"the last stdout line is not a JSON object: {line[:200]!r}")
            return summary
    raise ValueError("launch.train printed no summary")


def record_finished(run: Run, flag: str, command: Sequence[str], stdout: str, wall_s: float) -> None:
    summary = summary_line(stdout)
    write_json_atomically(run.logdir / RUN_SUMMARY, {
        "flag": flag, "value": run.value, "seed": run.seed, "wall_s": round(wall_s, 1), "command": list(command),
        "train_summary": summary,
    })


def check_same_training(out: pathlib.Path, train_args: Sequence[str]) -> None:
    """Records the training flags in `<out>/compare.json`, or refuses flags that differ from those recorded."""
    path = out / "compare.json"
    if path.exists():
        recorded = json.loads(path.read_text())["train_args"]
        if list(recorded) != list(train_args):
            added = [arg for arg in train_args if arg not in recorded]
            dropped = [arg for arg in recorded if arg not in train_args]
            raise ValueError(f"{out} holds runs trained with other flags (added {added}, dropped {dropped}); "
                             "use another --logdir")
        return
    write_json_atomically(path, {"train_args": list(train_args)})
