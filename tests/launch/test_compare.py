"""launch.compare and its `sweeps` package: the sweep it plans and checks against launch.train's flags, the runs it starts side by side and
picks up after a kill, and the statistics, table and plot it reports."""

from __future__ import annotations

import itertools
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from absl import flags

from launch import compare
from sweeps import grid, plots, records, runner, stats
from sweeps.stats import holm_adjusted, mean_interval, paired_test, pooled_effect_size, seeds_for_power, welch_test

REPO = pathlib.Path(__file__).resolve().parents[2]

# A stand-in for launch.train with its contract: takes --estimator, --seed, --logdir (and --iterations); logs one
# metrics.jsonl record per iteration, checkpoints every 2 iterations (checkpoints/<step>), resumes from the latest one
# dropping the metrics logged past it, prints its summary as the last stdout line. A fresh start into a directory
# that holds metrics exits 3, so a test sees the duplicates launch.train would have appended. `DIE_AT` in the
# environment, "<estimator>:<seed>:<iteration>", SIGKILLs that run once it has logged that iteration; `HOLD`,
# "<estimator>:<seed>", keeps that run from ending before the DIE_AT run is dead (exit 4 if it is not dead within
# 2 minutes), so which runs overlap the failure does not depend on how fast the machine starts processes. Every start
# and end is appended to `EVENTS`.
FAKE_TRAIN = textwrap.dedent('''
    import json, os, pathlib, signal, sys, time
    args = dict(arg[2:].split("=", 1) for arg in sys.argv[1:])
    logdir, seed, estimator = pathlib.Path(args["logdir"]), int(args["seed"]), args["estimator"]
    iterations = int(args.get("iterations", 6))
    events = open(os.environ["EVENTS"], "a")
    events.write(json.dumps({"event": "start", "run": f"{estimator}:{seed}", "time": time.time(),
                             "pid": os.getpid()}) + "\\n")
    events.flush()
    base = {"grpo": 0.5, "rloo": 0.6, "opo": 0.9}[estimator]
    checkpoints = logdir / "checkpoints"
    metrics = logdir / "metrics.jsonl"
    steps = sorted(int(p.name) for p in checkpoints.iterdir()) if checkpoints.exists() else []
    start = steps[-1] if steps else 0
    if start == 0 and metrics.exists():
        sys.exit(3)
    if start:
        kept = [line for line in metrics.read_text().splitlines() if json.loads(line)["step"] <= start]
        metrics.write_text("".join(line + "\\n" for line in kept))
    died = pathlib.Path(os.environ["EVENTS"] + ".died")
    if os.environ.get("HOLD") == f"{estimator}:{seed}":
        deadline = time.time() + 120
        while not died.exists():
            if time.time() > deadline:
                sys.exit(4)
            time.sleep(0.01)
    for step in range(start + 1, iterations + 1):
        time.sleep(0.05)
        with open(metrics, "a") as f:
            f.write(json.dumps({"step": step, "reward/mean": base + 0.01 * seed + 0.02 * step}) + "\\n")
        if step % 2 == 0:
            (checkpoints / str(step)).mkdir(parents=True, exist_ok=True)
        if os.environ.get("DIE_AT") == f"{estimator}:{seed}:{step}":
            died.touch()
            os.kill(os.getpid(), signal.SIGKILL)
    events.write(json.dumps({"event": "end", "run": f"{estimator}:{seed}", "time": time.time()}) + "\\n")
    print("iter lines go to stderr in launch.train; this one is not the summary")
    print(json.dumps({"iterations": iterations, "eval": {"average_accuracy": base + 0.05 * seed}}))
''')


@pytest.fixture
def fake_train(tmp_path, monkeypatch):
    """A starter running FAKE_TRAIN with launch.train's command line; returns (starter, events file)."""
    program = tmp_path / "fake_train.py"
    program.write_text(FAKE_TRAIN)
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("EVENTS", str(events))

    def starter(train_args):
        def start(run, slot, stdout_path, stderr_path):
            command = grid.train_command(train_args, "estimator", run)
            assert command[1:3] == ["-m", "launch.train"]
            with open(stdout_path, "a") as stdout, open(stderr_path, "a") as stderr:
                return subprocess.Popen([sys.executable, str(program), *command[3:]], stdout=stdout, stderr=stderr)
        return start

    return starter, events


def read_events(events: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []


# -- the sweep and its checks ------------------------------------------------------------------------------------------


def test_sweep_spec_parses_flag_and_values_and_rejects_malformed_ones():
    assert grid.parse_sweep("estimator=grpo,dr_grpo, rloo") == grid.Sweep("estimator", ("grpo", "dr_grpo", "rloo"))
    assert grid.parse_sweep("--step_penalty=0,0.05") == grid.Sweep("step_penalty", ("0", "0.05"))
    skills = grid.parse_sweep("synthetic_skills=0.8,0.2|0.5,0.5", separator="|")
    assert skills.values == ("0.8,0.2", "0.5,0.5")
    for bad, message in (("estimator", "expected FLAG="), ("estimator=grpo,,rloo", "non-empty"),
                         ("estimator=grpo,grpo", "repeats"), ("=grpo", "no flag"), ("tasks=a/b,a_b", "same directory")):
        with pytest.raises(ValueError, match=message):
            grid.parse_sweep(bad)


@pytest.fixture
def train_like_flags():
    """A FlagValues with the kinds of flags launch.train has."""
    values = flags.FlagValues()
    flags.DEFINE_enum("estimator", "grpo", ["grpo", "rloo", "opo"], "", flag_values=values)
    flags.DEFINE_integer("group_size", 8, "", lower_bound=2, flag_values=values)
    flags.DEFINE_float("step_penalty", 0.0, "", flag_values=values)
    flags.DEFINE_boolean("expected_grades", False, "", flag_values=values)
    flags.DEFINE_list("eval_tasks", [], "", flag_values=values)
    flags.DEFINE_integer("seed", 0, "", flag_values=values)
    return values


def test_sweep_is_checked_against_the_training_flags_before_any_run(train_like_flags):
    grid.check_sweep(grid.Sweep("estimator", ("grpo", "opo")), train_like_flags)
    grid.check_sweep(grid.Sweep("step_penalty", ("0", "0.05", "1e-1")), train_like_flags)
    grid.check_sweep(grid.Sweep("expected_grades", ("true", "false")), train_like_flags)
    for sweep, message in (
        (grid.Sweep("estimatr", ("grpo",)), "no flag --estimatr .*did you mean estimator"),
        (grid.Sweep("estimator", ("grpo", "ppo_magic")), "--estimator=ppo_magic is not a valid value"),
        (grid.Sweep("group_size", ("8", "1")), "--group_size=1 is not a valid value"),
        (grid.Sweep("step_penalty", ("0.1", "a lot")), "--step_penalty=a lot"),
        (grid.Sweep("seed", ("1", "2")), "set by the comparison"),
    ):
        with pytest.raises(ValueError, match=message):
            grid.check_sweep(sweep, train_like_flags)


def test_training_arguments_are_checked_name_by_name_and_value_by_value(train_like_flags):
    grid.check_train_args(["--estimator=rloo", "--group_size=4", "--noexpected_grades", "--expected_grades",
                              "--eval_tasks=a,b"], train_like_flags)
    for args, message in ((["--iteratoins=3"], "no flag --iteratoins"), (["--group_size=one"], "--group_size=one"),
                          (["--group_size"], "needs a value"), (["extra"], "positional"),
                          (["--nogroup_size"], "no flag --nogroup_size")):
        with pytest.raises(ValueError, match=message):
            grid.check_train_args(args, train_like_flags)


def test_plan_runs_every_value_of_a_seed_before_the_next_seed_or_every_seed_of_a_value_first(tmp_path):
    runs = grid.plan(grid.Sweep("estimator", ("grpo", "rloo")), [0, 1], tmp_path)
    assert [(run.value, run.seed) for run in runs] == [("grpo", 0), ("rloo", 0), ("grpo", 1), ("rloo", 1)]
    value_major = grid.plan(grid.Sweep("estimator", ("grpo", "rloo")), [0, 1], tmp_path, value_major=True)
    assert [(run.value, run.seed) for run in value_major] == [("grpo", 0), ("grpo", 1), ("rloo", 0), ("rloo", 1)]
    assert {run.logdir for run in value_major} == {run.logdir for run in runs}
    assert runs[3].logdir == tmp_path / "estimator=rloo" / "seed=1"
    assert grid.value_dirname("tasks", "mmlu_test/a b") == "tasks=mmlu_test_a_b"
    assert grid.seeds_from_flags(None, 3) == [0, 1, 2] and grid.seeds_from_flags(["4", "7"], 3) == [4, 7]
    with pytest.raises(ValueError, match="repeats"):
        grid.seeds_from_flags(["1", "1"], 3)


def test_the_run_command_ends_with_the_swept_value_seed_and_logdir(tmp_path):
    run = grid.Run("rloo", 4, tmp_path / "estimator=rloo" / "seed=4")
    command = grid.train_command(["--estimator=grpo", "--iterations=7"], "estimator", run)
    assert command[:3] == [sys.executable, "-m", "launch.train"]
    # absl keeps the last value of a repeated flag, so the run's value overrides the flagfile's.
    assert command[3:] == ["--estimator=grpo", "--iterations=7", "--estimator=rloo", "--seed=4",
                           f"--logdir={run.logdir}"]


def test_parallel_runs_share_the_cores_without_oversubscribing_them():
    assert runner.parallelism(None, None, 16) == (8, 2)
    assert runner.parallelism(None, 4, 16) == (4, 4)
    assert runner.parallelism(2, None, 2) == (2, 1)
    assert runner.parallelism(3, None, 2) == (3, 1)
    assert runner.parallelism(None, None, 1) == (1, 2)
    assert [runner.cores_of_slot(slot, 2, [0, 1, 2, 3]) for slot in range(2)] == [{0, 1}, {2, 3}]
    assert [runner.cores_of_slot(slot, 1, [4, 5]) for slot in range(3)] == [{4}, {5}, {4}]
    assert runner.cores_of_slot(0, 8, [0, 1]) == {0, 1}
    environment = runner.thread_environment({"XLA_FLAGS": "--xla_dump_to=/tmp/x --xla_cpu_multi_thread_eigen=true",
                                              "PATH": "/bin"}, 1)
    assert environment["OMP_NUM_THREADS"] == environment["MKL_NUM_THREADS"] == "1" and environment["PATH"] == "/bin"
    assert environment["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_cpu_multi_thread_eigen=false"
    assert runner.thread_environment({}, 4)["XLA_FLAGS"] == "" and runner.thread_environment({}, 4)[
        "OMP_NUM_THREADS"] == "4"


# -- statistics --------------------------------------------------------------------------------------------------------


def _student_t_two_sided_p(t: float, df: float) -> float:
    """Reference p-value: the Student t density integrated numerically beyond |t| (no scipy)."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    x = np.linspace(abs(t), abs(t) + 4000.0, 4_000_001)
    density = np.exp(log_norm - (df + 1) / 2 * np.log1p(x**2 / df))
    tail = np.sum((density[1:] + density[:-1]) / 2 * np.diff(x))
    return float(2 * tail)


def test_mean_interval_is_the_student_t_interval_over_seeds():
    interval = mean_interval([1.0, 2.0, 3.0])
    # t(0.975, 2) = 4.3027 (any t table); s = 1, n = 3.
    assert interval["n"] == 3 and interval["mean"] == 2.0 and interval["std"] == pytest.approx(1.0)
    assert interval["half_width"] == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert (interval["low"], interval["high"]) == pytest.approx((2 - 2.484138, 2 + 2.484138), rel=1e-6)
    # t(0.95, 4) = 2.1318 for a 90% interval of five values.
    values = [0.8, 0.85, 0.9, 0.7, 0.95]
    assert mean_interval(values, 0.90)["half_width"] == pytest.approx(
        2.131847 * np.std(values, ddof=1) / math.sqrt(5), rel=1e-6)
    assert mean_interval([0.7, 0.7, 0.7])["half_width"] == 0.0


def test_one_value_has_a_mean_but_no_interval_and_none_has_neither():
    assert mean_interval([0.4]) == {"n": 1, "mean": 0.4, "std": None, "half_width": None, "low": None, "high": None}
    assert mean_interval([])["mean"] is None


def test_welch_test_matches_the_formula_and_a_numerically_integrated_t_distribution():
    a, b = [0.81, 0.86, 0.84, 0.90], [0.78, 0.80, 0.77]
    test = welch_test(a, b)
    var_a, var_b = np.var(a, ddof=1) / 4, np.var(b, ddof=1) / 3
    t = (np.mean(a) - np.mean(b)) / math.sqrt(var_a + var_b)
    df = (var_a + var_b) ** 2 / (var_a**2 / 3 + var_b**2 / 2)
    assert test["difference"] == pytest.approx(np.mean(a) - np.mean(b))
    assert (test["t"], test["df"]) == pytest.approx((t, df))
    assert test["p"] == pytest.approx(_student_t_two_sided_p(t, df), abs=1e-6)
    assert 0.01 < test["p"] < 0.05  # a difference of 0.058 with these spreads
    assert welch_test(b, a)["p"] == pytest.approx(test["p"]) and welch_test(b, a)["t"] == pytest.approx(-t)


def test_welch_test_of_identical_groups_is_p_one_and_undefined_cases_say_why():
    same = welch_test([0.2, 0.4, 0.3], [0.3, 0.2, 0.4])
    assert same["t"] == pytest.approx(0.0, abs=1e-12) and same["p"] == pytest.approx(1.0)
    constant = welch_test([0.7, 0.7, 0.7], [0.7, 0.7, 0.7])
    assert constant["p"] is None and "no variance" in constant["note"]
    one_seed = welch_test([0.5], [0.4, 0.6])
    assert one_seed["p"] is None and "two or more" in one_seed["note"] and one_seed["difference"] == pytest.approx(0.0)
    assert welch_test([], [0.4, 0.6])["difference"] is None
    # One group constant, the other not: defined, with the varying group's degrees of freedom.
    assert welch_test([0.7, 0.7, 0.7], [0.4, 0.6, 0.5])["df"] == pytest.approx(2.0)


def test_paired_test_is_a_one_sample_t_test_of_the_seedwise_differences():
    a, b = [0.81, 0.86, 0.84, 0.90], [0.78, 0.80, 0.83, 0.85]
    differences = np.subtract(a, b)
    t = differences.mean() / (np.std(differences, ddof=1) / 2)
    test = paired_test(a, b)
    assert (test["difference"], test["t"], test["df"]) == pytest.approx((differences.mean(), t, 3.0))
    assert test["p"] == pytest.approx(_student_t_two_sided_p(t, 3.0), abs=1e-6)
    # The same numbers unpaired: the seeds' shared spread hides the difference from Welch's test.
    assert test["p"] < 0.05 < welch_test(a, b)["p"]
    assert paired_test([0.7, 0.8, 0.9], [0.7, 0.8, 0.9])["note"] == "equal in every pair"
    assert paired_test([0.8, 0.9, 1.0], [0.7, 0.8, 0.9])["p"] is None
    assert paired_test([0.8], [0.7])["note"] == "needs two or more pairs, has 1"
    with pytest.raises(ValueError, match="equal lengths"):
        paired_test([0.8, 0.9], [0.7])


def test_holm_adjustment_steps_down_and_keeps_undefined_tests_out_of_the_family():
    # Sorted 0.01, 0.03, 0.04 of m = 3: 3 * 0.01, max(0.03, 2 * 0.03), max(0.06, 1 * 0.04).
    assert holm_adjusted([0.04, None, 0.01, 0.03]) == pytest.approx([0.06, None, 0.03, 0.06])
    assert holm_adjusted([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    assert holm_adjusted([]) == []


# -- running, resuming and reporting -----------------------------------------------------------------------------------


def test_runs_go_side_by_side_and_each_finished_one_gets_its_summary(tmp_path, fake_train):
    starter, events = fake_train
    sweep = grid.Sweep("estimator", ("grpo", "rloo", "opo"))
    runs = grid.plan(sweep, [0, 1], tmp_path / "out")
    runner.execute(runs, "estimator", starter([]), parallel=2, log=lambda line: None, poll_s=0.02)
    recorded = json.loads((runs[1].logdir / records.RUN_SUMMARY).read_text())
    assert (recorded["value"], recorded["seed"]) == ("rloo", 0)
    assert recorded["train_summary"] == {"iterations": 6, "eval": {"average_accuracy": 0.6}}
    assert recorded["command"][-3:] == ["--estimator=rloo", "--seed=0", f"--logdir={runs[1].logdir}"]
    # At most two at once, and two did overlap.
    timeline = sorted(read_events(events), key=lambda e: e["time"])
    running = list(itertools.accumulate(1 if e["event"] == "start" else -1 for e in timeline))
    assert max(running) == 2 and len(timeline) == 12


def test_a_killed_comparison_picks_up_where_it_stopped(tmp_path, fake_train, monkeypatch):
    starter, events = fake_train
    sweep = grid.Sweep("estimator", ("grpo", "rloo"))
    runs = grid.plan(sweep, [0, 1, 2], tmp_path / "out")
    # Seed 1 of rloo dies after iteration 5 (checkpoint at 4); grpo seed 1 runs beside it and finishes after it;
    # nothing after them starts.
    monkeypatch.setenv("DIE_AT", "rloo:1:5")
    monkeypatch.setenv("HOLD", "grpo:1")
    with pytest.raises(runner.RunFailed, match=r"estimator=rloo/seed=1: exit status -9.*2 runs not started"):
        runner.execute(runs, "estimator", starter([]), parallel=2, log=lambda line: None, poll_s=0.02)
    assert [records.is_finished(run) for run in runs] == [True, True, True, False, False, False]
    # A reader that knows neither values nor seeds finds the finished runs, and only those of this flag.
    assert records.finished_runs(tmp_path / "out", "estimator") == sorted(runs[:3], key=lambda run: str(run.logdir))
    assert records.finished_runs(tmp_path / "out", "step_penalty") == []
    # A run killed before its first checkpoint, with metrics logged: the next attempt must not append to them.
    (runs[4].logdir).mkdir(parents=True)
    (runs[4].logdir / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.1}\n')
    monkeypatch.delenv("DIE_AT")
    monkeypatch.delenv("HOLD")
    log: list[str] = []
    runner.execute(runs, "estimator", starter([]), parallel=2, log=log.append, poll_s=0.02)
    assert all(records.is_finished(run) for run in runs)
    starts = [e["run"] for e in read_events(events) if e["event"] == "start"]
    assert sorted(starts) == sorted(["grpo:0", "rloo:0", "grpo:1", "rloo:1", "rloo:1", "grpo:2", "rloo:2"])
    assert f"{runs[3].logdir}: resumes from its checkpoint" in log
    assert f"{runs[4].logdir}: starts over (killed before its first checkpoint)" in log
    assert f"{runs[0].logdir}: finished earlier, kept" in log
    resumed = stats.read_curve(runs[3].logdir, "reward/mean")
    np.testing.assert_allclose(resumed, [0.6 + 0.01 + 0.02 * step for step in range(1, 7)])
    # And a third call has nothing to do.
    runner.execute(runs, "estimator", starter([]), parallel=2, log=lambda line: None, poll_s=0.02)
    assert len([e for e in read_events(events) if e["event"] == "start"]) == 7


def test_a_terminated_comparison_stops_its_runs(tmp_path, fake_train):
    starter, events = fake_train
    program = tmp_path / "fake_train.py"
    script = tmp_path / "comparison.py"
    script.write_text(textwrap.dedent(f"""
        import pathlib, subprocess, sys
        from sweeps import grid, runner
        def start(run, slot, stdout_path, stderr_path):
            command = grid.train_command(["--iterations=2000"], "estimator", run)
            with open(stdout_path, "a") as stdout:
                return subprocess.Popen([sys.executable, {str(program)!r}, *command[3:]], stdout=stdout)
        runner.stop_runs_on_sigterm()
        runs = grid.plan(grid.Sweep("estimator", ("grpo", "rloo")), [0], pathlib.Path({str(tmp_path)!r}))
        runner.execute(runs, "estimator", start, parallel=2, poll_s=0.02)
    """))
    comparison = subprocess.Popen([sys.executable, str(script)], cwd=REPO, env=os.environ)
    deadline = time.time() + 120
    while len(read_events(events)) < 2 and time.time() < deadline:
        time.sleep(0.1)
    comparison.terminate()
    assert comparison.wait(timeout=60) == 128 + signal.SIGTERM
    for event in read_events(events):
        with pytest.raises(ProcessLookupError):
            os.kill(event["pid"], 0)


def test_a_run_that_exits_zero_without_a_summary_is_not_finished(tmp_path):
    run = grid.Run("grpo", 0, tmp_path / "estimator=grpo" / "seed=0")

    def start(run, slot, stdout_path, stderr_path):
        with open(stdout_path, "a") as stdout:
            return subprocess.Popen([sys.executable, "-c", "print('no summary')"], stdout=stdout)

    with pytest.raises(runner.RunFailed, match="exited 0 without a summary"):
        runner.execute([run], "estimator", start, parallel=1, log=lambda line: None, poll_s=0.02)
    assert not records.is_finished(run)


def test_a_comparison_refuses_other_training_flags_and_a_second_comparison_in_the_same_out(tmp_path):
    records.check_same_training(tmp_path, ["--iterations=5"])
    records.check_same_training(tmp_path, ["--iterations=5"])
    with pytest.raises(ValueError, match=r"added \['--iterations=6'\], dropped \['--iterations=5'\]"):
        records.check_same_training(tmp_path, ["--iterations=6"])
    fd = runner.hold_lock(tmp_path)
    try:
        held = subprocess.run([sys.executable, "-c", f"from sweeps import runner; import pathlib; "
                               f"runner.hold_lock(pathlib.Path({str(tmp_path)!r}))"],
                              cwd=REPO, capture_output=True, text=True, timeout=60)
        assert held.returncode != 0 and "in use by another comparison" in held.stderr
    finally:
        os.close(fd)


def finished_sweep(out: pathlib.Path, fake_train, seeds=(0, 1, 2)) -> tuple[grid.Sweep, list[grid.Run]]:
    starter, _ = fake_train
    sweep = grid.Sweep("estimator", ("grpo", "rloo", "opo"))
    runs = grid.plan(sweep, list(seeds), out)
    runner.execute(runs, "estimator", starter([]), parallel=2, log=lambda line: None, poll_s=0.02)
    return sweep, runs


def test_summary_gives_each_value_its_seeds_mean_interval_and_every_pair_a_test(tmp_path, fake_train):
    sweep, runs = finished_sweep(tmp_path, fake_train)
    summary = stats.summarize(sweep, runs, "eval.average_accuracy", "reward/mean", alpha=0.05)
    grpo = summary["values"]["grpo"]
    # The fake's score is base + 0.05 * seed; its reward base + 0.01 * seed + 0.02 * step over 6 steps, whose last
    # fifth is step 6.
    assert grpo["seeds"][2]["score"] == pytest.approx(0.6)
    assert grpo["score"] == pytest.approx(mean_interval([0.5, 0.55, 0.6]))
    assert grpo["last_fifth"] == pytest.approx(mean_interval([0.62, 0.63, 0.64]))
    assert grpo["seeds"][1]["first_fifth"] == pytest.approx(0.53) and grpo["unfinished_seeds"] == []
    assert grpo["seeds"][2]["area"] == pytest.approx(0.5 + 0.02 + 0.02 * 3.5)  # the mean of steps 1-6
    pairs = summary["pairs"]["last_fifth"]
    assert [(p["a"], p["b"]) for p in pairs] == [("grpo", "rloo"), ("grpo", "opo"), ("rloo", "opo")]
    # Equal spreads, means 0.1 and 0.4 apart: all differ, and significantly after Holm's adjustment.
    raw = [welch_test([b + 0.02 * 6 + 0.01 * s for s in range(3)], [c + 0.02 * 6 + 0.01 * s for s in range(3)])["p"]
           for b, c in ((0.5, 0.6), (0.5, 0.9), (0.6, 0.9))]
    assert [p["welch"]["p"] for p in pairs] == pytest.approx(raw)
    assert [p["welch"]["p_holm"] for p in pairs] == pytest.approx(holm_adjusted(raw))
    assert all(p["welch"]["significant"] for p in pairs)
    assert pairs[0]["welch"]["difference"] == pytest.approx(-0.1)
    assert pairs[0]["effect_size"] == pytest.approx(-0.1 / 0.01)  # both spreads 0.01
    assert pairs[0]["seeds_for_power"] == seeds_for_power(-10.0, 0.05 / 3, 0.8) == 2
    # Seed for seed the fake's values differ by a constant: no paired test, and the table says why.
    assert pairs[0]["paired"]["seeds"] == [0, 1, 2] and pairs[0]["paired"]["note"] == "the same difference in every pair"


def test_seeds_for_power_match_cohens_table_and_a_simulated_t_test():
    # Cohen (1988), Table 2.4.1, two-sided alpha 0.05, power 0.8: n = 64, 26, 17 per group for d = 0.5, 0.8, 1.0.
    assert [seeds_for_power(d, 0.05, 0.8) for d in (0.5, 0.8, 1.0)] == [64, 26, 17]
    assert seeds_for_power(-0.5, 0.05, 0.8) == 64 and seeds_for_power(0.5, 0.005, 0.8) > 64
    from scipy import stats as scipy_stats

    rng = np.random.default_rng(0)
    simulated = {}
    for n in (16, 17):  # d = 1: the smallest n whose power reaches 0.8 is 17
        a, b = rng.normal(1.0, 1.0, (40_000, n)), rng.normal(0.0, 1.0, (40_000, n))
        simulated[n] = float(np.mean(scipy_stats.ttest_ind(a, b, axis=1).pvalue < 0.05))
    assert simulated[16] < 0.8 <= simulated[17], simulated
    assert seeds_for_power(0.0, 0.05) is None and seeds_for_power(1e-4, 0.05, limit=1000) is None
    for alpha, power in ((0.0, 0.8), (0.05, 1.0), (1.5, 0.8)):
        with pytest.raises(ValueError, match="alpha and power"):
            seeds_for_power(1.0, alpha, power)
    assert pooled_effect_size([1.0, 2.0, 3.0], [0.0, 1.0, 2.0]) == pytest.approx(1.0)
    assert pooled_effect_size([1.0], [0.0, 1.0]) is None and pooled_effect_size([1.0, 1.0], [2.0, 2.0]) is None


def test_report_writes_the_table_the_png_and_names_missing_and_single_seed_values(tmp_path, fake_train):
    sweep, runs = finished_sweep(tmp_path, fake_train, seeds=(0,))
    runs = runs + grid.plan(sweep, [1], tmp_path)  # seed 1 never ran
    summary = compare.report(sweep, runs, tmp_path, "eval.average_accuracy", "reward/mean", window=2, alpha=0.05)
    assert summary["values"]["rloo"]["unfinished_seeds"] == [1]
    assert json.loads((tmp_path / "summary.json").read_text())["values"]["opo"]["score"]["mean"] == pytest.approx(0.9)
    table = (tmp_path / "summary.md").read_text()
    assert "| grpo | 0 (unfinished: 1) | 0.500 (one seed: no interval) |" in table
    assert ("| grpo − rloo | -0.100 | – (needs two or more values per group, has 1 and 1) | "
            "– (needs two or more pairs, has 1) |") in table
    png = tmp_path / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_curve_band_is_the_per_iteration_interval_of_the_smoothed_seed_curves():
    curves = [np.array([0.0, 1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0, 4.0, 9.0]), np.array([2.0, 3.0, 4.0, 5.0])]
    mean, half_width = plots.curve_band(curves, window=2)
    smoothed = np.array([plots.moving_average(curve[:4], 2) for curve in curves])
    np.testing.assert_allclose(mean, smoothed.mean(axis=0))
    np.testing.assert_allclose(half_width, [mean_interval(column)["half_width"] for column in smoothed.T])
    mean, half_width = plots.curve_band(curves[:1], window=1)
    assert half_width is None and list(mean) == [0.0, 1.0, 2.0, 3.0]


def test_score_key_reads_nested_summaries_and_rejects_a_group():
    summary = {"eval": {"average_accuracy": 0.75, "tasks": {"math": {}}}, "greedy_valid_format": 1.0}
    assert stats.summary_value(summary, "eval.average_accuracy") == 0.75
    assert stats.summary_value(summary, "greedy_valid_format") == 1.0
    assert stats.summary_value(summary, "eval.missing") is None
    with pytest.raises(ValueError, match="names a group"):
        stats.summary_value(summary, "eval.tasks")


def test_moving_average_matches_a_trailing_window_mean():
    values = np.array([1.0, 3.0, 2.0, 6.0, 4.0])
    expected = [np.mean(values[max(0, i - 2):i + 1]) for i in range(len(values))]
    np.testing.assert_allclose(plots.moving_average(values, 3), expected)
    with pytest.raises(ValueError, match="window"):
        plots.moving_average(values, 0)


# -- the entry point ---------------------------------------------------------------------------------------------------


@pytest.fixture
def required_global_flag():
    """A required flag in the global FLAGS, as launch.serve registers one when a test imports it first; removed
    afterwards so it cannot fail a later test that parses FLAGS."""
    flags.DEFINE_string("compare_test_required", None, "required elsewhere")
    flags.mark_flag_as_required("compare_test_required")
    yield
    delattr(flags.FLAGS, "compare_test_required")


def test_own_flags_are_parsed_and_everything_else_goes_to_training(tmp_path, required_global_flag):
    flagfile = tmp_path / "run.cfg"
    flagfile.write_text("--world=synthetic\n--learning_rate=2e-4\n--estimator=grpo\n")
    rest = compare.parse_own_flags(
        ["compare", f"--flagfile={flagfile}", "--sweep=estimator=grpo,rloo", "--seeds=3,4", "--iterations=7"]
    )
    assert compare.COMPARE_FLAGS.sweep == "estimator=grpo,rloo" and compare.COMPARE_FLAGS.seeds == ["3", "4"]
    assert rest[1:] == ["--world=synthetic", "--learning_rate=2e-4", "--estimator=grpo", "--iterations=7"]


@pytest.fixture
def default_compare_flags():
    """compare's flags at their defaults before and after: a parse keeps the values an earlier one set."""
    compare.COMPARE_FLAGS.unparse_flags()
    yield compare.COMPARE_FLAGS
    compare.COMPARE_FLAGS.unparse_flags()


def test_a_flagfiles_logdir_goes_to_the_runs_and_the_sweeps_logdir_is_the_command_lines(
    tmp_path, required_global_flag, default_compare_flags
):
    flagfile = tmp_path / "run.cfg"
    flagfile.write_text("--iterations=3\n--logdir=runs/quickstart\n--seeds=9\n")
    rest = compare.parse_own_flags(
        ["compare", "--iterations=7", f"--flagfile={flagfile}", "--sweep=estimator=grpo,rloo",
         f"--logdir={tmp_path / 'sweep'}", "--group_size=4"]
    )
    assert default_compare_flags.logdir == str(tmp_path / "sweep")
    assert default_compare_flags.seeds is None, "a flagfile's flags are launch.train's, never compare's own"
    # In their order: absl keeps the last of a repeated flag, and each run's own --logdir comes after them all.
    assert rest[1:] == ["--iterations=7", "--iterations=3", "--logdir=runs/quickstart", "--seeds=9", "--group_size=4"]
    run = grid.plan(grid.Sweep("estimator", ("rloo",)), [0], tmp_path / "sweep")[0]
    assert grid.train_command(rest[1:], "estimator", run)[-1] == f"--logdir={run.logdir}"
    assert run.logdir == tmp_path / "sweep" / "estimator=rloo" / "seed=0"


def test_the_old_out_is_refused_with_its_new_name(default_compare_flags):
    with pytest.raises(flags.IllegalFlagValueError, match="--out is renamed to --logdir"):
        compare.parse_own_flags(["compare", "--sweep=estimator=grpo,rloo", "--out=runs/compare"])


def test_a_shared_checkpoint_dir_is_refused_before_any_run(train_like_flags):
    with pytest.raises(ValueError, match="--checkpoint_dir=runs/ckpt: every run would write its checkpoints there"):
        grid.check_train_args(["--group_size=4", "--checkpoint_dir=runs/ckpt"], train_like_flags)


def test_report_only_summarizes_finished_runs_from_the_command_line(tmp_path, fake_train):
    finished_sweep(tmp_path, fake_train, seeds=(0, 1))
    result = subprocess.run(
        [sys.executable, "-m", "launch.compare", "--report_only", "--sweep=estimator=grpo,rloo,opo", "--num_seeds=2",
         f"--logdir={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| opo | 0,1 | 0.925 ± 0.318 |" in result.stdout  # mean 0.925, 12.706 * 0.0354 / sqrt(2)
    assert (tmp_path / "curves.png").exists()


def test_the_issues_sweeps_are_valid_for_launch_train_and_a_typo_is_not():
    train_flags = compare.train_flag_values()
    grid.check_sweep(grid.parse_sweep("estimator=grpo,dr_grpo,rloo,reinforce_pp,opo"), train_flags)
    grid.check_sweep(grid.parse_sweep("workflow_step_penalty=0,0.05,0.1"), train_flags)
    grid.check_train_args(["--world=synthetic", "--iterations=2", "--noexpected_grades"], train_flags)
    with pytest.raises(ValueError, match="--estimator=ppo is not a valid value"):
        grid.check_sweep(grid.parse_sweep("estimator=grpo,ppo"), train_flags)


def test_a_bad_sweep_is_a_usage_error_before_any_run(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "launch.compare", "--sweep=estimator=grpo,ppo_magic", "--iterations=2",
         f"--logdir={tmp_path / 'out'}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0 and "--estimator=ppo_magic is not a valid value" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_real_two_by_two_sweep_trains_reports_and_skips_finished_runs_when_rerun(tmp_path):
    command = [
        sys.executable, "-m", "launch.compare", "--flagfile=launch/configs/quickstart.cfg", "--iterations=2",
        "--warm_start_steps=2", "--questions_per_iteration=2", "--group_size=4", "--mini_batch_size=8",
        "--synthetic_tasks=16", "--format_check_questions=0", "--eval_tasks=synthetic", "--checkpoint_every=0",
        "--sweep=estimator=grpo,rloo", "--seeds=0,1", "--parallel=2", f"--logdir={tmp_path}",
    ]
    first = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:] + first.stdout[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    for value in ("grpo", "rloo"):
        entry = summary["values"][value]
        assert sorted(entry["seeds"]) == ["0", "1"] and entry["score"]["n"] == 2
        assert 0.0 <= entry["score"]["mean"] <= 1.0 and entry["last_fifth"]["half_width"] is not None
    assert summary["pairs"]["score"][0]["a"] == "grpo"
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    # Every seed of grpo warms up first (the two at once) and stores it; rloo's runs load their seed's.
    assert len([entry for entry in (tmp_path / "warm_starts").iterdir() if entry.is_dir()]) == 2
    for seed in (0, 1):
        assert "warm-start stored in" in (tmp_path / "estimator=grpo" / f"seed={seed}" / "train.stderr").read_text()
        assert "warm-start loaded from" in (tmp_path / "estimator=rloo" / f"seed={seed}" / "train.stderr").read_text()
    second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0 and second.stdout.count("finished earlier, kept") == 4
