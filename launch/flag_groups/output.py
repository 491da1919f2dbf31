"""Where a run writes: every entry point that writes a run's files names that directory --logdir (issue 63).

One flag for all of them, so a process that imports several entry points (a test session) defines it once; each
entry point keeps its own default directory under runs/.
"""

from __future__ import annotations

import pathlib

from absl import flags

from launch.flag_groups import renamed  # noqa: F401  (the old names, --out_dir, --sft_out and --workdir, fail)

LOGDIR = flags.DEFINE_string(
    "logdir", None,
    "Where the run writes its files (default: runs/<entry point>: runs/train, runs/eval, runs/sft/conductor, "
    "runs/serve).",
)


def logdir(default: str) -> pathlib.Path:
    """--logdir, or the entry point's own default when it is not set."""
    return pathlib.Path(LOGDIR.value or default)
