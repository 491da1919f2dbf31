"""launch.compare: the flags each training run receives, the curves it reads, and the plot and summary it writes."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from absl import flags

from launch import compare

REPO = pathlib.Path(__file__).resolve().parents[2]


def write_run(logdir: pathlib.Path, rewards: list[float]) -> None:
    logdir.mkdir(parents=True)
    records = [{"step": step + 1, "reward/mean": reward} for step, reward in enumerate(rewards)]
    records.reverse()  # out of order on purpose: the reader sorts by step
    (logdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_moving_average_matches_a_trailing_window_mean():
    values = np.array([1.0, 3.0, 2.0, 6.0, 4.0])
    expected = [np.mean(values[max(0, i - 2):i + 1]) for i in range(len(values))]
    np.testing.assert_allclose(compare.moving_average(values, 3), expected)
    np.testing.assert_allclose(compare.moving_average(values, 1), values)
    with pytest.raises(ValueError, match="window"):
        compare.moving_average(values, 0)


def test_read_curve_orders_by_step_and_names_what_is_missing(tmp_path):
    write_run(tmp_path / "run", [0.1, 0.2, 0.4])
    np.testing.assert_allclose(compare.read_curve(tmp_path / "run", "reward/mean"), [0.1, 0.2, 0.4])
    with pytest.raises(KeyError, match="accuracy"):
        compare.read_curve(tmp_path / "run", "accuracy")
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        compare.read_curve(tmp_path / "absent", "reward/mean")


def test_summary_averages_seeds_over_the_first_and_last_fifth_of_the_shortest_run():
    curves = {"grpo": [np.arange(10.0), np.arange(10.0) + 1.0, np.arange(12.0)]}
    summary = compare.summarize(curves)["grpo"]
    # 10 iterations (the shortest seed), fifths of 2: seeds' first two are (0, 1), (1, 2), (0, 1); last two
    # (8, 9), (9, 10), (8, 9).
    assert summary["iterations"] == 10 and summary["seeds"] == 3
    assert summary["first_fifth"] == pytest.approx(np.mean([0, 1, 1, 2, 0, 1]))
    assert summary["last_fifth"] == pytest.approx(np.mean([8, 9, 9, 10, 8, 9]))


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
    flagfile.write_text("--world=synthetic\n--lr=2e-4\n--estimator=grpo\n")
    rest = compare.parse_own_flags(
        ["compare", f"--flagfile={flagfile}", "--estimators=grpo,rloo", "--seeds=3,4", "--iterations=7"]
    )
    assert compare.COMPARE_FLAGS.estimators == ["grpo", "rloo"] and compare.COMPARE_FLAGS.seeds == ["3", "4"]
    assert rest[1:] == ["--world=synthetic", "--lr=2e-4", "--estimator=grpo", "--iterations=7"]
    command = compare.train_command(rest[1:], "rloo", 4, tmp_path / "rloo-seed4")
    assert command[1:3] == ["-m", "launch.train"]
    # absl keeps the last value of a repeated flag, so the comparison's estimator overrides the flagfile's.
    assert command[-3:] == ["--estimator=rloo", "--seed=4", f"--logdir={tmp_path / 'rloo-seed4'}"]
    assert command.index("--estimator=grpo") < command.index("--estimator=rloo")


def test_plot_only_writes_the_png_and_summary_of_existing_runs(tmp_path):
    for seed, offset in ((0, 0.0), (1, 0.1)):
        write_run(tmp_path / f"grpo-seed{seed}", [0.2 + offset + 0.05 * i for i in range(10)])
        write_run(tmp_path / f"rloo-seed{seed}", [0.3 + offset] * 10)
    result = subprocess.run(
        [sys.executable, "-m", "launch.compare", "--plot_only", "--estimators=grpo,rloo", "--seeds=0,1",
         f"--out_dir={tmp_path}", "--smooth=3"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["estimators"]["grpo"]["first_fifth"] == pytest.approx(np.mean([0.2, 0.25, 0.3, 0.35]))
    assert summary["estimators"]["rloo"]["last_fifth"] == pytest.approx(0.35)
    png = tmp_path / "estimators.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_unknown_estimator_is_a_usage_error(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "launch.compare", "--estimators=grpo,ppo_magic", f"--out_dir={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0 and "ppo_magic" in result.stderr
