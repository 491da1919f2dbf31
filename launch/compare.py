"""Estimator comparison: the same training run once per advantage estimator and seed, reward curves in one PNG.

    python -m launch.compare --flagfile=launch/configs/synthetic.cfg --estimators=grpo,dr_grpo,rloo --seeds=0,1 \
        --out_dir=runs/compare

Every run is `python -m launch.train` with the flags given here (a `--flagfile` included) plus `--estimator`,
`--seed` and `--logdir=<out_dir>/<estimator>-seed<seed>`; only those change between runs, so the curves differ by
estimator and seed alone. A run whose logdir already holds checkpoints resumes, so an interrupted comparison is
rerun with the same command. The plot shows each estimator's mean over seeds of `--metric`, smoothed over
`--smooth` iterations, with the per-seed curves faint behind it; `<out_dir>/summary.json` keeps the numbers.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Mapping, Sequence

import numpy as np
from absl import app, flags

from rl.advantages import ESTIMATORS
from rl.metrics import first_and_last_fifth, read_metrics

# Own FlagValues: everything it does not define goes to launch.train untouched, even where a test process has
# imported launch.train and its flags live in the global FLAGS.
COMPARE_FLAGS = flags.FlagValues()
_ESTIMATORS = flags.DEFINE_list(
    "estimators", ["grpo", "dr_grpo", "rloo"], "Advantage estimators to compare.", flag_values=COMPARE_FLAGS
)
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds; every estimator runs with each.", flag_values=COMPARE_FLAGS)
_OUT_DIR = flags.DEFINE_string(
    "out_dir", "runs/compare", "Run logdirs, the PNG and summary.json go here.", flag_values=COMPARE_FLAGS
)
_METRIC = flags.DEFINE_string("metric", "reward/mean", "metrics.jsonl scalar to plot.", flag_values=COMPARE_FLAGS)
_SMOOTH = flags.DEFINE_integer(
    "smooth", 5, "Trailing moving-average window of the plotted curves (iterations).", flag_values=COMPARE_FLAGS
)
_PLOT_ONLY = flags.DEFINE_bool(
    "plot_only", False, "Plot the runs already in --out_dir without training.", flag_values=COMPARE_FLAGS
)


def run_dir(out_dir: pathlib.Path, estimator: str, seed: int) -> pathlib.Path:
    return out_dir / f"{estimator}-seed{seed}"


def train_command(train_args: Sequence[str], estimator: str, seed: int, logdir: pathlib.Path) -> list[str]:
    """`launch.train` with the shared arguments; later flags win in absl, so these three override any given."""
    return [sys.executable, "-m", "launch.train", *train_args, f"--estimator={estimator}", f"--seed={seed}",
            f"--logdir={logdir}"]


def read_curve(logdir: pathlib.Path, metric: str) -> np.ndarray:
    """The metric per iteration, in step order, from a run's metrics.jsonl."""
    records = read_metrics(logdir)
    if not records or metric not in records[0]:
        raise KeyError(f"{logdir / 'metrics.jsonl'} has no scalar {metric!r}")
    return np.asarray([record[metric] for record in records], dtype=np.float64)


def aligned(runs: Sequence[np.ndarray]) -> np.ndarray:
    """`[seeds, iterations]`: every seed's curve cut to the shortest, so an unfinished seed does not skew the mean."""
    length = min(len(curve) for curve in runs)
    return np.stack([curve[:length] for curve in runs])


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over up to `window` values (the first points average what exists so far)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    sums = np.cumsum(np.concatenate([[0.0], values]))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(0, ends - window)
    return (sums[ends] - sums[starts]) / (ends - starts)


def summarize(curves: Mapping[str, Sequence[np.ndarray]]) -> dict[str, dict[str, float]]:
    """Per estimator: the first and last fifth of the mean over seeds (curves cut to the shortest seed)."""
    summary = {}
    for estimator, runs in curves.items():
        stacked = aligned(runs)
        first, last = first_and_last_fifth(stacked.mean(axis=0))
        summary[estimator] = {
            "iterations": float(stacked.shape[1]),
            "seeds": float(len(runs)),
            "first_fifth": first,
            "last_fifth": last,
        }
    return summary


def plot_curves(curves: Mapping[str, Sequence[np.ndarray]], path: pathlib.Path, metric: str, window: int,
                title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axis = pyplot.subplots(figsize=(8, 5))
    for index, (estimator, runs) in enumerate(curves.items()):
        color = f"C{index}"
        stacked = aligned(runs)
        steps = np.arange(1, stacked.shape[1] + 1)
        for curve in stacked:
            axis.plot(steps, moving_average(curve, window), color=color, alpha=0.25, linewidth=1)
        axis.plot(steps, moving_average(stacked.mean(axis=0), window), color=color, linewidth=2,
                  label=f"{estimator} ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
    axis.set_xlabel("iteration")
    axis.set_ylabel(f"{metric} (moving average over {window})")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


def parse_own_flags(argv: list[str]) -> list[str]:
    """Parses this script's flags and returns the rest (a `--flagfile` expanded): what every training run gets."""
    if any(arg in ("-h", "-?", "--help", "--helpshort", "--helpfull") for arg in argv[1:]):
        print(f"{__doc__}\nflags:\n{COMPARE_FLAGS.module_help(COMPARE_FLAGS.find_module_defining_flag('seeds'))}\n\n"
              "Every other flag is passed to each training run: see `python -m launch.train --helpfull`.")
        sys.exit(0)
    rest = COMPARE_FLAGS(argv, known_only=True)
    # absl's own flags (--only_check_args, logging) keep their defaults; marking rather than parsing also skips the
    # validators of flags that other launch modules imported into the same process may have registered.
    flags.FLAGS.mark_as_parsed()
    return rest


def main(argv: list[str]) -> None:
    train_args = argv[1:]
    unknown = sorted(set(_ESTIMATORS.value) - set(ESTIMATORS))
    if unknown:
        raise app.UsageError(f"unknown --estimators {unknown}; choose from {', '.join(sorted(ESTIMATORS))}")
    seeds = [int(seed) for seed in _SEEDS.value]
    out_dir = pathlib.Path(_OUT_DIR.value)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not _PLOT_ONLY.value:
        for estimator in _ESTIMATORS.value:
            for seed in seeds:
                logdir = run_dir(out_dir, estimator, seed)
                print(f"training {estimator} seed {seed} -> {logdir}", flush=True)
                subprocess.run(train_command(train_args, estimator, seed, logdir), check=True)
    curves = {e: [read_curve(run_dir(out_dir, e, s), _METRIC.value) for s in seeds] for e in _ESTIMATORS.value}
    png = out_dir / "estimators.png"
    plot_curves(curves, png, _METRIC.value, _SMOOTH.value, f"{', '.join(curves)} on the same seeds")
    summary = {"metric": _METRIC.value, "png": str(png), "estimators": summarize(curves)}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    app.run(main, flags_parser=parse_own_flags)
