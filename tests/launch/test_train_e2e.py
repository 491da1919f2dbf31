"""End to end: `python -m launch.train` with a tiny Conductor on the synthetic world, as a user runs it.

The world has one always-right worker and three always-wrong ones (reward 1 for routing to worker 0, 0.5 otherwise).
The warm-start must teach the action format and leave routing uniform (reward near 0.625); GRPO must then raise the
reward by learning to route to worker 0. The run must log every iteration's scalars to TensorBoard and metrics.jsonl,
write checkpoints and the final Conductor, and continue from its checkpoint when killed -9 and rerun, for as many
iterations as the rerun asks (one run does all of it, so the suite pays for one warm-start). With
`--eval_warm_start`, the greedy evaluation after the warm-start must show the warm-start's routing and the final one
GRPO's, and a resumed run must report the first without evaluating again.
As the recipes do, the run keeps its learner at steady shapes (`--steady_shapes`): one compile of the step at the
largest shapes, not one per new length (measured: 4 compiling iterations of 12 without it).
Sampling at temperature 0.7 keeps the tiny Conductor's format noise low enough for the routing signal to show within
ten iterations (at 1.0 a fifth of its samples broke the format and the rise was not reliable).
Single iterations can still lose the format: once nearly every completion routes right, a group's one wrong route gets
a large negative advantage (rewards are normalised by the group's small deviation), which pushes down the format
tokens it shares with the right ones. So the format is asserted where the warm-start alone decides it (iteration 1)
and on average, and learning is asserted on the routing of the well-formed completions, which a format dip leaves
alone (measured 0.28 -> 0.97-1.00 on 2 and 8 devices, where one run lost 19 of 32 formats at iteration 9).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator

from tests.conftest import with_default_codegen

pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[2]
FLAGS = (
    "--world=synthetic",
    "--synthetic_skills=1,1,1,1;0,0,0,0;0,0,0,0;0,0,0,0",
    "--synthetic_tasks=64",
    "--conductor=tiny",
    "--tiny_layers=2",
    "--tiny_width=128",
    "--warm_start_steps=80",
    "--warm_start_learning_rate=3e-3",
    "--warm_start_templates=single",
    "--questions_per_iteration=4",
    "--group_size=8",
    "--learning_rate=3e-4",
    "--learning_rate_schedule=constant",
    "--warmup_ratio=0",
    "--max_tokens=64",
    "--temperature=0.7",
    "--mini_batch_size=8",
    "--checkpoint_every=2",
    "--steady_shapes",
)


def train_command(logdir: pathlib.Path, iterations: int, *extra_flags: str) -> list[str]:
    return [
        sys.executable, "-m", "launch.train", *FLAGS, f"--logdir={logdir}", f"--iterations={iterations}", *extra_flags
    ]


def train(logdir: pathlib.Path, iterations: int, *extra_flags: str, env=None) -> subprocess.CompletedProcess:
    result = subprocess.run(
        train_command(logdir, iterations, *extra_flags), cwd=REPO, capture_output=True, text=True, timeout=1200,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def metric_records(logdir: pathlib.Path) -> list[dict]:
    path = logdir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def share_routed_to_worker_0(logdir: pathlib.Path) -> dict[int, float]:
    """Per iteration, the share of its well-formed completions (those that called a worker) that call worker 0 only."""
    routes: dict[int, list[bool]] = {}
    for line in (logdir / "rollouts.jsonl").read_text().splitlines():
        rollout = json.loads(line)
        if rollout["workers"]:
            routes.setdefault(rollout["step"], []).append(rollout["workers"] == [0])
    return {step: sum(right) / len(right) for step, right in routes.items()}


def tensorboard_steps(logdir: pathlib.Path, tag: str) -> list[int]:
    accumulator = EventAccumulator(str(logdir), size_guidance={"tensors": 0}, purge_orphaned_data=True)
    accumulator.Reload()
    return [event.step for event in accumulator.Tensors(tag)]  # TensorBoard's own reader; scalars are tensors


EVALUATE_WARM_START_AND_FINAL = ("--eval_tasks=synthetic", "--eval_warm_start")


def start_and_kill_after(logdir: pathlib.Path, iteration: int, *extra_flags: str, env=None) -> None:
    """Starts a run of 10 iterations and kills it (SIGKILL, the whole process group) once `iteration` is logged."""
    process = subprocess.Popen(
        train_command(logdir, 10, *extra_flags), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, env=env,
    )
    deadline = time.monotonic() + 900
    while not any(r["step"] == iteration for r in metric_records(logdir)):
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.fixture(scope="module")
def warm_start_cache(tmp_path_factory) -> str:
    """One warm-start for the file's runs of FLAGS: the first computes and stores it, the others load it (the tests
    of a file run in order on one worker, `--dist loadfile`; alone, a test computes its own)."""
    return f"--warm_start_cache_dir={tmp_path_factory.mktemp('warm_starts')}"


def test_training_raises_reward_logs_checkpoints_and_resumes_after_a_kill(tmp_path, warm_start_cache):
    """One run of 10 iterations, killed -9 after iteration 3 (past checkpoint 2, before checkpoint 4), then rerun
    with `--iterations=12`: a user's run as it learns, dies and is continued further, in one warm-start's time. As a
    user's runs do, both use their own persistent compilation cache (`--compilation_cache_dir`), not the one the test
    session gives its subprocesses, and XLA's default codegen; the rerun loads the programs the killed run wrote to
    it."""
    logdir, cache = tmp_path / "run", tmp_path / "jax_cache"
    session_cache = ("JAX_ENABLE_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR")
    with_cache = with_default_codegen({k: v for k, v in os.environ.items() if k not in session_cache})
    with_cache["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # every program, however fast it compiles here
    flags = (*EVALUATE_WARM_START_AND_FINAL, f"--compilation_cache_dir={cache}", warm_start_cache)
    start_and_kill_after(logdir, 3, *flags, env=with_cache)
    first = train(logdir, 12, *flags, env=with_cache)
    assert "resumed from checkpoint 2" in first.stderr
    assert "warm-start greedy average" not in first.stderr, "the killed run already evaluated its warm-start"

    records = metric_records(logdir)
    assert [r["step"] for r in records] == list(range(1, 13)), "iteration 3, logged before the kill, is not repeated"
    assert [r["data_position"] for r in records] == [4.0 * step for step in range(1, 13)]
    assert records[-1]["policy_version"] == 12.0
    rollout_steps = [json.loads(line)["step"] for line in (logdir / "rollouts.jsonl").read_text().splitlines()]
    assert rollout_steps == [step for step in range(1, 13) for _ in range(4 * 8)]
    assert records[0]["rollout/valid_format"] >= 0.9, "the warm-start should teach the format"
    assert sum(r["rollout/valid_format"] for r in records) / len(records) >= 0.8
    assert all(0.5 <= r["reward/mean"] <= 1.0 for r in records if r["rollout/valid_format"] == 1.0)
    for name in ("learner/loss", "learner/grad_norm", "time/generate", "time/learn", "rollout/correct"):
        assert name in records[-1]
    assert tensorboard_steps(logdir, "reward/mean") == list(range(1, 13))
    # The rerun's first iteration (3, resumed from checkpoint 2) compiles the learner's step at the steady shapes the
    # killed run compiled it at, and loads it (7 of its 10 programs when measured). Within one process, a program
    # that a different jitted function compiled before comes from the cache too, so the killed run's own iterations
    # can have hits as well.
    resumed = records[2]
    assert any(cache.iterdir()) and 1 <= resumed["compile/cache_hits"] <= resumed["compile/programs"], resumed
    checkpoints = sorted(int(p.name) for p in (logdir / "checkpoints").iterdir() if p.name.isdigit())
    assert checkpoints[-1] == 12
    summary = json.loads(first.stdout.strip().splitlines()[-1])
    assert summary["iterations"] == 12
    # From metrics.jsonl, not from the iterations the rerun process itself ran.
    rewards = [r["reward/mean"] for r in records]
    assert summary["reward_first_fifth"] == pytest.approx(sum(rewards[:2]) / 2)
    assert summary["reward_last_fifth"] == pytest.approx(sum(rewards[-2:]) / 2)
    assert (pathlib.Path(summary["conductor_final"]) / "model.safetensors").exists()
    trained_sampling = json.loads((pathlib.Path(summary["conductor_final"]) / "trained_sampling.json").read_text())
    assert trained_sampling == {"max_new_tokens": 64, "temperature": 0.7, "conductor_prompt": "full"}
    # Iteration 1 samples the warm-started policy before any update, so its routing is the warm-start's: uniform
    # routing earns 0.625 and sends a quarter of the completions to worker 0, always worker 0 earns 1.
    assert records[0]["reward/mean"] < 0.7, records[0]
    to_worker_0 = share_routed_to_worker_0(logdir)
    assert to_worker_0[1] < 0.45 and (to_worker_0[11] + to_worker_0[12]) / 2 >= 0.9, to_worker_0
    # Only worker 0 is right, so a greedy accuracy is the share of questions routed to worker 0: the warm-start's
    # evaluation (made by the killed run, kept in its logdir) sees the warm-start's routing, the final one GRPO's.
    warm_start, final = summary["warm_start_eval"], summary["eval"]
    # The Conductor before the warm-start writes no valid workflow; the warm-start teaches the format.
    assert warm_start["average"]["valid_format"] >= 0.9, warm_start["average"]
    for report in (warm_start, final):
        assert report["average_accuracy"] == pytest.approx(report["workers_chosen"].get("synthetic-0", 0.0)), report
    assert warm_start["average_accuracy"] < 0.6, warm_start
    assert final["average_accuracy"] >= 0.9, final


def test_selection_ends_the_run_on_its_best_scoring_weights_not_its_last(tmp_path, warm_start_cache):
    """`--selection_tasks`: the run scores the warm-start and every checkpoint greedily on those questions and ends on
    the best. One update at a learning rate of 1 wrecks the warm-started policy (its greedy workflows stop parsing),
    so the warm-start (iteration 0) is kept: the format check and the summary's greedy evaluation, made after the
    selection, see its weights; last_eval sees the last ones. (The synthetic world draws the same questions whatever
    the task name, so the two names here stand for two splits.)"""
    logdir = tmp_path / "run"
    result = train(logdir, 1, "--learning_rate=1", "--learning_rate_schedule=constant", "--checkpoint_every=1",
                   "--selection_tasks=synthetic-selection", "--eval_tasks=synthetic", "--format_check_questions=16",
                   warm_start_cache)
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    selection = summary["selection"]
    scores = selection["scores"]
    assert (selection["tasks"], selection["score"]) == (["synthetic-selection"], "average.reward")
    assert list(scores) == ["0", "1"] and selection["selected_iteration"] == 0, selection
    assert scores["0"] > scores["1"], "the update should wreck the policy"
    # The evaluation draws no outcome the selection did not (same questions, greedy, exact grades of a 0/1 world).
    assert summary["eval"]["average"]["reward"] == pytest.approx(scores["0"])
    assert summary["greedy_valid_format"] >= 0.9 and summary["eval"]["average"]["valid_format"] >= 0.9
    assert summary["last_eval"]["average"]["valid_format"] < 0.5, "the last weights no longer write workflows"
    assert summary["last_eval"]["average"]["reward"] == pytest.approx(scores["1"])
    assert json.loads((logdir / "selection" / "scores.json").read_text()) == scores
    assert "selected the weights of iteration 0 of 1" in result.stderr

