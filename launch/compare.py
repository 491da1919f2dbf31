"""Sweeps: the same training run once per value of one `launch.train` flag and per seed, with statistics over seeds.

    python -m launch.compare --flagfile=launch/configs/quickstart.cfg --eval_tasks=synthetic \
        --sweep=estimator=grpo,dr_grpo,rloo,reinforce_pp,opo --seeds=0,1,2 --logdir=runs/compare_estimators

Every run is `python -m launch.train` with the flags given here (a `--flagfile` included) plus `--FLAG=value`,
`--seed` and `--logdir=<logdir>/<FLAG>=<value>/seed=<seed>`; only those change between runs, so the runs differ by
the swept value and the seed alone. This program's own flags, `--logdir` (the sweep's directory) among them, are
read from its command line only: a flagfile holds launch.train's flags, and its `--logdir` (every shipped one sets
it) is replaced by each run's own, so no run writes into the flagfile's directory. Runs that warm up alike (the same
seed, and a swept flag that does not change the warm-start: an estimator, a learning rate, a reward's penalty)
share it: the first stores it in `<logdir>/warm_starts`, the others load it (`--share_warm_start`, on by default;
`--warm_start_cache_dir`). A `--checkpoint_dir` is refused: the runs would share it. The flag and every value are
checked against launch.train's flags before any run starts. Up to `--parallel` runs train at once, each pinned to
`--threads_per_run` cores of its own.

A run is finished when its directory holds `run_summary.json`: written (atomically) once `launch.train` exited 0
and printed its summary. Rerunning the same command skips finished runs and restarts the others: one that had saved
a checkpoint resumes from it (launch.train's own resume: same data position, RNG key and policy version, metrics past
the checkpoint dropped); one that had not starts over in an emptied directory. `<logdir>/compare.json` keeps the
training flags, and a rerun with different ones is refused. More seeds or values may be added to a finished sweep.

Per value, over seeds: the mean and 95% Student t interval of the final greedy score (`--score`, a key of
launch.train's summary: `eval.average_accuracy` is written with `--eval_tasks`; on the synthetic world any
`--eval_tasks` value evaluates the world's own questions greedily) and of the last fifth of `--metric` (the mean of
its last fifth of iterations, read from metrics.jsonl). Every pair of values is compared with Welch's two-sided
t-test and, over the seeds both finished, a paired t-test (a seed's runs share its world, warm start and draws), the
p-values of each Holm-adjusted over the pairs; a difference is significant where the adjusted p is below `--alpha`.
With three seeds such tests detect only large differences: "not significant" is not "equal".
Writes `<logdir>/summary.json`, `<logdir>/summary.md` (also printed) and `<logdir>/curves.png` (the mean curve per
value with its 95% band, and each seed's figures). The code is the `sweeps` package's; this module is its flags.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any, Sequence

from absl import app, flags

from launch.flag_groups import renamed
from sweeps import plots
from sweeps.grid import Run, Sweep, check_sweep, check_train_args, parse_sweep, plan, seeds_from_flags
from sweeps.records import check_same_training, is_finished, write_json_atomically
from sweeps.runner import (RunFailed, execute, hold_lock, parallelism, stop_runs_on_sigterm, subprocess_starter,
                           usable_cores)
from sweeps.stats import markdown_summary, read_curve, summarize

# Own FlagValues: everything it does not define goes to launch.train untouched, even where a test process has
# imported launch.train and its flags live in the global FLAGS.
COMPARE_FLAGS = flags.FlagValues()
_SWEEP = flags.DEFINE_string(
    "sweep", None, "FLAG=v1,v2,...: the launch.train flag to vary and its values.", flag_values=COMPARE_FLAGS
)
_SWEEP_SEPARATOR = flags.DEFINE_string(
    "sweep_separator", ",", "What separates --sweep's values (another character where the values hold commas).",
    flag_values=COMPARE_FLAGS,
)
_SEEDS = flags.DEFINE_list(
    "seeds", None, "Seeds every value runs with (default: 0 .. --num_seeds-1).", flag_values=COMPARE_FLAGS
)
_NUM_SEEDS = flags.DEFINE_integer(
    "num_seeds", 3, "Seeds 0 .. N-1 when --seeds is not given.", lower_bound=1, flag_values=COMPARE_FLAGS
)
_LOGDIR = flags.DEFINE_string(
    "logdir", "runs/compare",
    "The sweep's directory: the runs' logdirs, compare.json, summary.json, summary.md and curves.png (a flagfile's "
    "--logdir is not read here: each run gets its own under this one).",
    flag_values=COMPARE_FLAGS,
)
renamed.define_renamed("out", "logdir", flag_values=COMPARE_FLAGS)
_PARALLEL = flags.DEFINE_integer(
    "parallel", None, "How many runs train at once (default: the usable CPU cores // --threads_per_run, at least 1).",
    lower_bound=1, flag_values=COMPARE_FLAGS,
)
_THREADS_PER_RUN = flags.DEFINE_integer(
    "threads_per_run", None,
    "Cores each run is pinned to, and the size of its torch and BLAS thread pools, so parallel runs do not "
    "oversubscribe the cores (default: the usable cores // --parallel, or 2 when --parallel is not given either).",
    lower_bound=1, flag_values=COMPARE_FLAGS,
)
_SCORE = flags.DEFINE_string(
    "score", "eval.average_accuracy", "The final greedy score: a dotted key of launch.train's summary.",
    flag_values=COMPARE_FLAGS,
)
_METRIC = flags.DEFINE_string(
    "metric", "reward/mean", "metrics.jsonl scalar whose curve is plotted and whose last fifth is compared.",
    flag_values=COMPARE_FLAGS,
)
_SMOOTH = flags.DEFINE_integer(
    "smooth", 3, "Trailing moving-average window applied to each seed's plotted curve (iterations).", lower_bound=1,
    flag_values=COMPARE_FLAGS,
)
_ALPHA = flags.DEFINE_float(
    "alpha", 0.05, "Significance level of the Holm-adjusted pairwise tests.", lower_bound=0.0, upper_bound=1.0,
    flag_values=COMPARE_FLAGS,
)
_SHARE_WARM_START = flags.DEFINE_bool(
    "share_warm_start", True,
    "Give every run --warm_start_cache_dir=<logdir>/warm_starts (unless the training flags name one), and start "
    "every seed of the first value before the other values: runs that would warm up alike (same seed, and a swept "
    "flag that does not change the warm-start) do it once and load it after.",
    flag_values=COMPARE_FLAGS,
)
_REPORT_ONLY = flags.DEFINE_bool(
    "report_only", False, "Report the finished runs in --logdir without starting any.", flag_values=COMPARE_FLAGS
)



def report(sweep: Sweep, runs: Sequence[Run], out: pathlib.Path, score: str, metric: str, window: int,
           alpha: float) -> dict[str, Any]:
    """summary.json, summary.md and curves.png from the finished runs; returns the summary."""
    summary = summarize(sweep, runs, score, metric, alpha)
    curves = {value: [read_curve(run.logdir, metric) for run in runs if run.value == value and is_finished(run)]
              for value in sweep.values}
    summary["png"] = str(out / "curves.png")
    if any(curves.values()):
        plots.plot(summary, curves, out / "curves.png", window)
    write_json_atomically(out / "summary.json", summary)
    (out / "summary.md").write_text(markdown_summary(summary))
    return summary


def parse_own_flags(argv: list[str]) -> list[str]:
    """Parses this script's flags from the command line and returns `argv[0]` and the rest, each `--flagfile` expanded
    in its place: what every training run gets. A flagfile's flags all go to the runs, `--logdir` among them."""
    if any(arg in ("-h", "-?", "--help", "--helpshort", "--helpfull") for arg in argv[1:]):
        print(f"{__doc__}\nflags:\n{COMPARE_FLAGS.module_help(COMPARE_FLAGS.find_module_defining_flag('sweep'))}\n\n"
              "Every other flag is passed to each training run: see `python -m launch.train --helpfull`.")
        sys.exit(0)
    rest = [argv[0]]
    # Parsed in segments between the flagfiles, so that the training arguments keep their order (absl keeps a
    # repeated flag's last value, a flagfile's as any other).
    segment: list[str] = []
    tokens = iter(argv[1:])
    for token in tokens:
        if token.lstrip("-").partition("=")[0] != "flagfile":
            segment.append(token)
            continue
        rest += COMPARE_FLAGS([argv[0], *segment], known_only=True)[1:]
        segment = []
        directive = [token] if "=" in token else [token, next(tokens, "")]
        rest += flags.FlagValues().read_flags_from_files(directive, force_gnu=True)
    rest += COMPARE_FLAGS([argv[0], *segment], known_only=True)[1:]
    # absl's own flags (--only_check_args, logging) keep their defaults; marking rather than parsing also skips the
    # validators of flags that other launch modules imported into the same process may have registered.
    flags.FLAGS.mark_as_parsed()
    return rest


def train_flag_values() -> flags.FlagValues:
    """launch.train's flags: imported here, not at the top, so --help and --report_only start in a second."""
    import launch.train  # noqa: F401  (registers its flags)

    return flags.FLAGS


def main(argv: list[str]) -> None:
    train_args = argv[1:]
    if _SWEEP.value is None:
        raise app.UsageError("--sweep=FLAG=v1,v2,... is required")
    try:
        sweep = parse_sweep(_SWEEP.value, _SWEEP_SEPARATOR.value)
        seeds = seeds_from_flags(_SEEDS.value, _NUM_SEEDS.value)
        if not _REPORT_ONLY.value:
            train_flags = train_flag_values()
            check_sweep(sweep, train_flags)
            check_train_args(train_args, train_flags)
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    out = pathlib.Path(_LOGDIR.value)
    out.mkdir(parents=True, exist_ok=True)
    runs = plan(sweep, seeds, out, value_major=_SHARE_WARM_START.value)
    if not _REPORT_ONLY.value:
        lock_fd = hold_lock(out)
        stop_runs_on_sigterm()
        try:
            check_same_training(out, train_args)
        except ValueError as error:
            raise app.UsageError(str(error)) from error
        cores = usable_cores()
        parallel, threads = parallelism(_PARALLEL.value, _THREADS_PER_RUN.value, len(cores))
        print(f"{len(runs)} runs ({len(sweep.values)} values x {len(seeds)} seeds), {parallel} at once with "
              f"{threads} threads each", flush=True)
        if _SHARE_WARM_START.value:
            # First, so that a --warm_start_cache_dir among the training flags wins.
            train_args = [f"--warm_start_cache_dir={out / 'warm_starts'}", *train_args]
        try:
            execute(runs, sweep.flag, subprocess_starter(train_args, sweep.flag, threads, cores, lock_fd), parallel,
                    log=lambda line: print(line, flush=True))
        except RunFailed as error:
            report(sweep, runs, out, _SCORE.value, _METRIC.value, _SMOOTH.value, _ALPHA.value)
            raise SystemExit(f"launch.compare: {error}") from None
    summary = report(sweep, runs, out, _SCORE.value, _METRIC.value, _SMOOTH.value, _ALPHA.value)
    print(markdown_summary(summary), flush=True)
    finished = [entry for entry in summary["values"].values() if entry["seeds"]]
    if finished and all(entry["score"]["n"] == 0 for entry in finished):
        print(f"No run's summary holds {_SCORE.value!r}: launch.train writes eval.average_accuracy with --eval_tasks "
              "(on the synthetic world any value evaluates the world's own questions).", flush=True)
    print(f"wrote {out / 'summary.json'}, {out / 'summary.md'}, {summary['png']}", flush=True)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_own_flags)
