"""Sweeps: the same training run once per value of one `launch.train` flag and per seed, with statistics over seeds.

    python -m launch.compare --flagfile=launch/configs/quickstart.cfg --eval_tasks=synthetic \
        --sweep=estimator=grpo,dr_grpo,rloo,reinforce_pp,opo --seeds=0,1,2 --out=runs/compare_estimators

Every run is `python -m launch.train` with the flags given here (a `--flagfile` included) plus `--FLAG=value`,
`--seed` and `--logdir=<out>/<FLAG>=<value>/seed=<seed>`; only those change between runs, so the runs differ by the
swept value and the seed alone. The flag and every value are checked against launch.train's flags before any run
starts. Up to `--parallel` runs train at once, each pinned to `--threads_per_run` cores of its own.

A run is finished when its directory holds `run_summary.json`: written (atomically) once `launch.train` exited 0
and printed its summary. Rerunning the same command skips finished runs and restarts the others: one that had saved
a checkpoint resumes from it (launch.train's own resume: same data position, RNG key and policy version, metrics past
the checkpoint dropped); one that had not starts over in an emptied directory. `<out>/compare.json` keeps the
training flags, and a rerun with different ones is refused. More seeds or values may be added to a finished sweep.

Per value, over seeds: the mean and 95% Student t interval of the final greedy score (`--score`, a key of
launch.train's summary: `eval.average_accuracy` is written with `--eval_tasks`; on the synthetic world any
`--eval_tasks` value evaluates the world's own questions greedily) and of the last fifth of `--metric` (the mean of
its last fifth of iterations, read from metrics.jsonl). Every pair of values is compared with Welch's two-sided
t-test and, over the seeds both finished, a paired t-test (a seed's runs share its world, warm start and draws), the
p-values of each Holm-adjusted over the pairs; a difference is significant where the adjusted p is below `--alpha`.
With three seeds such tests detect only large differences: "not significant" is not "equal".
Writes `<out>/summary.json`, `<out>/summary.md` (also printed) and `<out>/curves.png` (the mean curve per value with
its 95% band, and each seed's figures).
"""

from __future__ import annotations

import dataclasses
import difflib
import fcntl
import itertools
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from absl import app, flags

from launch.report import holm_adjusted, mean_interval, paired_test, welch_test
from rl.metrics import first_and_last_fifth, read_metrics

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
_OUT = flags.DEFINE_string(
    "out", "runs/compare", "The runs' logdirs, summary.json, summary.md and curves.png.", flag_values=COMPARE_FLAGS
)
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
_REPORT_ONLY = flags.DEFINE_bool(
    "report_only", False, "Report the finished runs in --out without starting any.", flag_values=COMPARE_FLAGS
)

# Set by the comparison for every run; a sweep over one of them would be overwritten.
RESERVED_FLAGS = frozenset({"seed", "logdir", "checkpoint_dir", "flagfile", "resume"})
RUN_SUMMARY = "run_summary.json"
CONFIDENCE = 0.95


@dataclasses.dataclass(frozen=True)
class Sweep:
    flag: str
    values: tuple[str, ...]

    def __post_init__(self):
        if not self.flag:
            raise ValueError("the sweep names no flag")
        if not self.values or any(not value for value in self.values):
            raise ValueError(f"--sweep={self.flag}=... needs one or more non-empty values, got {list(self.values)}")
        if len(set(self.values)) != len(self.values):
            raise ValueError(f"--sweep repeats a value: {list(self.values)}")
        names = [value_dirname(self.flag, value) for value in self.values]
        if len(set(names)) != len(names):
            raise ValueError(f"--sweep values {list(self.values)} map to the same directory names {names}")


@dataclasses.dataclass(frozen=True)
class Run:
    value: str
    seed: int
    logdir: pathlib.Path


def parse_sweep(spec: str, separator: str = ",") -> Sweep:
    """`FLAG=v1,v2,...` -> Sweep (a leading `--` on FLAG is allowed)."""
    flag, equals, values = spec.partition("=")
    if not equals:
        raise ValueError(f"--sweep={spec!r}: expected FLAG=v1{separator}v2{separator}...")
    return Sweep(flag.strip().removeprefix("--"), tuple(value.strip() for value in values.split(separator)))


def check_sweep(sweep: Sweep, train_flags: flags.FlagValues) -> None:
    """Raises ValueError, naming the problem, unless `sweep.flag` is a flag of launch.train that a sweep may set and
    every value parses as that flag's type (choices and bounds included)."""
    if sweep.flag in RESERVED_FLAGS:
        raise ValueError(f"--{sweep.flag} is set by the comparison for every run; it cannot be swept")
    if sweep.flag not in train_flags:
        close = difflib.get_close_matches(sweep.flag, list(train_flags), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(f"launch.train has no flag --{sweep.flag}{hint}")
    parser = train_flags[sweep.flag].parser
    for value in sweep.values:
        try:
            parser.parse(value)
        except (ValueError, TypeError) as error:
            raise ValueError(f"--{sweep.flag}={value} is not a valid value: {error}") from error


def check_train_args(args: Sequence[str], train_flags: flags.FlagValues) -> None:
    """Raises ValueError naming the first argument that launch.train would reject: a flag it does not define, a value
    its flag cannot parse, or a positional argument."""
    for arg in args:
        if not arg.startswith("-"):
            raise ValueError(f"launch.train takes no positional argument, got {arg!r}")
        name, equals, value = arg.lstrip("-").partition("=")
        if name in train_flags:
            if equals:
                try:
                    train_flags[name].parser.parse(value)
                except (ValueError, TypeError) as error:
                    raise ValueError(f"{arg}: {error}") from error
            elif train_flags[name].boolean is False:
                raise ValueError(f"{arg} needs a value")
        elif not (name.startswith("no") and name[2:] in train_flags and train_flags[name[2:]].boolean and not equals):
            raise ValueError(f"launch.train has no flag {arg.split('=')[0]}")


def value_dirname(flag: str, value: str) -> str:
    """`FLAG=value` with every character a file name should not hold replaced by `_`."""
    return re.sub(r"[^A-Za-z0-9._=+,-]", "_", f"{flag}={value}")


def seeds_from_flags(seeds: Sequence[str] | None, num_seeds: int) -> list[int]:
    chosen = [int(seed) for seed in seeds] if seeds else list(range(num_seeds))
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"--seeds repeats a seed: {chosen}")
    return chosen


def plan(sweep: Sweep, seeds: Sequence[int], out: pathlib.Path) -> list[Run]:
    """Every (value, seed) run, seed-major: with fewer runs at once than runs, each value has a seed done early."""
    return [Run(value, seed, out / value_dirname(sweep.flag, value) / f"seed={seed}")
            for seed, value in itertools.product(seeds, sweep.values)]


def train_command(train_args: Sequence[str], flag: str, run: Run) -> list[str]:
    """`launch.train` with the shared arguments; later flags win in absl, so the run's own override any given."""
    return [sys.executable, "-m", "launch.train", *train_args, f"--{flag}={run.value}", f"--seed={run.seed}",
            f"--logdir={run.logdir}"]


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


# -- a run's state on disk ---------------------------------------------------------------------------------------------


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


# -- running -----------------------------------------------------------------------------------------------------------


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


def check_same_training(out: pathlib.Path, train_args: Sequence[str]) -> None:
    """Records the training flags in `<out>/compare.json`, or refuses flags that differ from those recorded."""
    path = out / "compare.json"
    if path.exists():
        recorded = json.loads(path.read_text())["train_args"]
        if list(recorded) != list(train_args):
            added = [arg for arg in train_args if arg not in recorded]
            dropped = [arg for arg in recorded if arg not in train_args]
            raise ValueError(f"{out} holds runs trained with other flags (added {added}, dropped {dropped}); "
                             "use another --out")
        return
    write_json_atomically(path, {"train_args": list(train_args)})


# -- what the runs show ------------------------------------------------------------------------------------------------


def read_curve(logdir: pathlib.Path, metric: str) -> np.ndarray:
    """The metric per iteration, in step order, from a run's metrics.jsonl."""
    records = read_metrics(logdir)
    if not records or metric not in records[0]:
        raise KeyError(f"{logdir / 'metrics.jsonl'} has no scalar {metric!r}")
    return np.asarray([np.nan if record[metric] is None else record[metric] for record in records], dtype=np.float64)


def summary_value(summary: Mapping[str, Any], dotted_key: str) -> float | None:
    """`summary["a"]["b"]` for `a.b`; None where a key is absent."""
    value: Any = summary
    for key in dotted_key.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    if isinstance(value, Mapping):
        raise ValueError(f"--score={dotted_key} names a group of the summary ({', '.join(value)}), not a number")
    return None if value is None else float(value)


def seed_figures(run: Run, score: str, metric: str) -> dict[str, Any]:
    """A finished run's figures: the greedy score, the first and last fifth of the metric, its iterations."""
    recorded = run_record(run)
    curve = read_curve(run.logdir, metric)
    first, last = first_and_last_fifth(curve)
    return {"score": summary_value(recorded["train_summary"], score), "first_fifth": first, "last_fifth": last,
            "iterations": len(curve), "wall_s": recorded["wall_s"]}


FIGURES = ("score", "last_fifth")


def summarize(sweep: Sweep, runs: Sequence[Run], score: str, metric: str, alpha: float) -> dict[str, Any]:
    """Per value: each finished seed's figures, the mean and 95% interval of each figure over seeds, the seeds not
    finished; per figure, every pair of values' tests (`pair_tests`)."""
    values: dict[str, Any] = {}
    for value in sweep.values:
        mine = [run for run in runs if run.value == value]
        per_seed = {run.seed: seed_figures(run, score, metric) for run in mine if is_finished(run)}
        values[value] = {
            "seeds": per_seed,
            "unfinished_seeds": [run.seed for run in mine if not is_finished(run)],
            **{figure: mean_interval([f[figure] for f in per_seed.values() if f[figure] is not None], CONFIDENCE)
               for figure in FIGURES},
        }
    pairs = {figure: pair_tests(sweep.values, values, figure, alpha) for figure in FIGURES}
    return {
        "flag": sweep.flag, "score": score, "metric": metric, "confidence": CONFIDENCE, "alpha": alpha,
        "interval": "two-sided Student t interval of the mean over seeds",
        "tests": {"welch": "Welch's two-sided t-test over each value's seeds",
                  "paired": "two-sided paired t-test over the seeds both values finished"},
        "adjustment": "Holm, over the pairs of values, per figure and test",
        "values": values, "pairs": pairs,
    }


def pair_tests(names: Sequence[str], values: Mapping[str, Any], figure: str, alpha: float) -> list[dict[str, Any]]:
    """Every pair of values' Welch test (the primary one) and paired test of `figure`, Holm-adjusted per test."""
    tests = []
    for a, b in itertools.combinations(names, 2):
        seeds_a, seeds_b = ({seed: f[figure] for seed, f in values[v]["seeds"].items() if f[figure] is not None}
                            for v in (a, b))
        shared = sorted(set(seeds_a) & set(seeds_b))
        tests.append({
            "a": a, "b": b,
            "welch": welch_test(list(seeds_a.values()), list(seeds_b.values())),
            "paired": {**paired_test([seeds_a[s] for s in shared], [seeds_b[s] for s in shared]), "seeds": shared},
        })
    for kind in ("welch", "paired"):
        for test, adjusted in zip(tests, holm_adjusted([test[kind]["p"] for test in tests])):
            test[kind]["p_holm"] = adjusted
            test[kind]["significant"] = adjusted is not None and adjusted < alpha
    return tests


def _interval_text(interval: Mapping[str, Any]) -> str:
    if interval["mean"] is None:
        return "–"
    if interval["half_width"] is None:
        return f"{interval['mean']:.3f} (one seed: no interval)"
    return f"{interval['mean']:.3f} ± {interval['half_width']:.3f}"


def _p_text(test: Mapping[str, Any]) -> str:
    if test["p"] is None:
        return f"– ({test['note']})"
    return f"{test['p']:.3g} ({test['p_holm']:.3g}){' *' if test['significant'] else ''}"


def markdown_summary(summary: Mapping[str, Any]) -> str:
    flag, values = summary["flag"], summary["values"]
    lines = [
        f"| {flag} | seeds | greedy score `{summary['score']}` | `{summary['metric']}` first fifth | "
        f"`{summary['metric']}` last fifth |",
        "|---|---|---|---|---|",
    ]
    for value, entry in values.items():
        seeds = ",".join(str(seed) for seed in entry["seeds"]) or "none"
        if entry["unfinished_seeds"]:
            seeds += f" (unfinished: {','.join(map(str, entry['unfinished_seeds']))})"
        first = mean_interval([f["first_fifth"] for f in entry["seeds"].values()], summary["confidence"])
        lines.append(f"| {value} | {seeds} | {_interval_text(entry['score'])} | {_interval_text(first)} | "
                     f"{_interval_text(entry['last_fifth'])} |")
    lines += ["", f"Mean ± half-width of the {100 * summary['confidence']:.0f}% {summary['interval']}."]
    for figure, title in (("score", "greedy score"), ("last_fifth", f"`{summary['metric']}` last fifth")):
        lines += ["", f"| pair | Δ {title} | Welch p (Holm) | paired p (Holm) |", "|---|---|---|---|"]
        for test in summary["pairs"][figure]:
            difference = test["welch"]["difference"]
            lines.append(f"| {test['a']} − {test['b']} | {'–' if difference is None else f'{difference:+.3f}'} | "
                         f"{_p_text(test['welch'])} | {_p_text(test['paired'])} |")
    tests = summary["tests"]
    lines += ["", f"Δ: difference of the means. Welch: {tests['welch']}; paired: {tests['paired']} (runs of one seed "
                  f"share its world, warm start and draws until their policies part). p-values adjusted by "
                  f"{summary['adjustment']}; * significant at α = {summary['alpha']}. With a few seeds per value only "
                  "large differences can be detected: a difference that is not significant is not shown to be zero."]
    return "\n".join(lines) + "\n"


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over up to `window` values (the first points average what exists so far)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    sums = np.cumsum(np.concatenate([[0.0], values]))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(0, ends - window)
    return (sums[ends] - sums[starts]) / (ends - starts)


def curve_band(curves: Sequence[np.ndarray], window: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(mean, 95% half-width or None with one seed) per iteration over the seeds' smoothed curves, cut to the
    shortest so an unfinished seed does not skew the mean."""
    length = min(len(curve) for curve in curves)
    stacked = np.stack([moving_average(curve[:length], window) for curve in curves])
    if len(curves) == 1:
        return stacked[0], None
    return stacked.mean(axis=0), np.array([mean_interval(column, CONFIDENCE)["half_width"] for column in stacked.T])


def _padded_limits(values: Sequence[float]) -> tuple[float, float]:
    low, high = float(np.nanmin(values)), float(np.nanmax(values))
    pad = 0.1 * (high - low) or 0.05 * max(abs(high), 1e-3)
    return low - pad, high + pad


def plot(summary: Mapping[str, Any], curves: Mapping[str, Sequence[np.ndarray]], path: pathlib.Path,
         window: int) -> None:
    """Top: one panel per value, its mean curve over seeds with the 95% band, the other values' means in grey behind.
    Bottom: each seed's greedy score and last fifth (dots) with the mean and 95% interval (bar) per value. The axes
    span the seeds' own figures: a band or bar that leaves them is wider than anything the seeds showed."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    values = list(summary["values"])
    columns = min(len(values), 5)
    rows = -(-len(values) // columns)
    figure = pyplot.figure(figsize=(max(3.0 * columns, 9.0), 2.6 * rows + 3.2))
    grid = figure.add_gridspec(rows + 1, 2 * columns)
    bands = {value: curve_band(runs, window) for value, runs in curves.items() if runs}
    smoothed = [moving_average(curve, window) for runs in curves.values() for curve in runs]
    curve_limits = _padded_limits(np.concatenate(smoothed)) if smoothed else (0.0, 1.0)
    first_axis = None
    for index, value in enumerate(values):
        axis = figure.add_subplot(grid[index // columns, 2 * (index % columns):2 * (index % columns) + 2],
                                  sharex=first_axis, sharey=first_axis)
        first_axis = first_axis or axis
        for other, (mean, _) in bands.items():
            if other != value:
                axis.plot(np.arange(1, len(mean) + 1), mean, color="0.75", linewidth=1)
        if value in bands:
            mean, half_width = bands[value]
            steps = np.arange(1, len(mean) + 1)
            axis.plot(steps, mean, color=f"C{index}", linewidth=2)
            if half_width is not None:
                axis.fill_between(steps, mean - half_width, mean + half_width, color=f"C{index}", alpha=0.25)
        seeds = len(curves.get(value, []))
        axis.set_title(f"{value} ({seeds} seed{'' if seeds == 1 else 's'})", fontsize=10)
        axis.grid(alpha=0.3)
        if index % columns == 0:
            axis.set_ylabel(summary["metric"] + (f", {window}-iteration mean" if window > 1 else ""), fontsize=8)
        if index // columns == rows - 1:
            axis.set_xlabel("iteration", fontsize=8)
    if first_axis is not None:
        first_axis.set_ylim(*curve_limits)
    labels = (f"greedy score ({summary['score']})", f"{summary['metric']}, last fifth")
    for panel, (figure_name, label) in enumerate(zip(FIGURES, labels)):
        axis = figure.add_subplot(grid[rows, panel * columns:(panel + 1) * columns])
        points_seen = []
        for index, value in enumerate(values):
            entry = summary["values"][value]
            points = [f[figure_name] for f in entry["seeds"].values() if f[figure_name] is not None]
            points_seen += points
            axis.scatter([index - 0.1] * len(points), points, color=f"C{index}", s=18, alpha=0.8)
            interval = entry[figure_name]
            if interval["mean"] is not None:
                axis.errorbar(index + 0.1, interval["mean"], yerr=interval["half_width"] or 0.0, fmt="o",
                              color="black", capsize=4, markersize=4)
        if points_seen:
            axis.set_ylim(*_padded_limits(points_seen))
        axis.set_xticks(range(len(values)), values, rotation=20, ha="right", fontsize=8)
        axis.set_title(label, fontsize=10)
        axis.grid(alpha=0.3, axis="y")
    figure.suptitle(f"--{summary['flag']} sweep: mean over seeds with its {100 * summary['confidence']:.0f}% t "
                    "interval; dots are seeds")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    pyplot.close(figure)


def report(sweep: Sweep, runs: Sequence[Run], out: pathlib.Path, score: str, metric: str, window: int,
           alpha: float) -> dict[str, Any]:
    """summary.json, summary.md and curves.png from the finished runs; returns the summary."""
    summary = summarize(sweep, runs, score, metric, alpha)
    curves = {value: [read_curve(run.logdir, metric) for run in runs if run.value == value and is_finished(run)]
              for value in sweep.values}
    summary["png"] = str(out / "curves.png")
    if any(curves.values()):
        plot(summary, curves, out / "curves.png", window)
    write_json_atomically(out / "summary.json", summary)
    (out / "summary.md").write_text(markdown_summary(summary))
    return summary


# -- the entry point ---------------------------------------------------------------------------------------------------


def parse_own_flags(argv: list[str]) -> list[str]:
    """Parses this script's flags and returns the rest (a `--flagfile` expanded): what every training run gets."""
    if any(arg in ("-h", "-?", "--help", "--helpshort", "--helpfull") for arg in argv[1:]):
        print(f"{__doc__}\nflags:\n{COMPARE_FLAGS.module_help(COMPARE_FLAGS.find_module_defining_flag('sweep'))}\n\n"
              "Every other flag is passed to each training run: see `python -m launch.train --helpfull`.")
        sys.exit(0)
    rest = COMPARE_FLAGS(argv, known_only=True)
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
    out = pathlib.Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    runs = plan(sweep, seeds, out)
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
