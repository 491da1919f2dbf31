"""The asynchronous pipeline (`--max_staleness`): K = 0, 1, 2 side by side on the synthetic world with API-like
worker latencies.

The world, the Conductor and the learner are launch/configs/synthetic.cfg's (four specialist workers, a tiny
Conductor warm-started with the task probe, GRPO with the sampler's log-probs as the old ones), except that every
worker call takes a lognormal time, median LATENCY_MEDIAN_S and log-std LATENCY_SIGMA (the shape of API latencies,
a heavy right tail: `env.workers.simulated.SimulatedWorker`), and each run is ITERATIONS iterations. The Conductor
is warm-started once; then, for each seed, it trains at K = 0, 1 and 2, one run after the other in this process,
each from the same warm-started weights.

Per run, over the iterations after the first (the first compiles): questions per second (questions trained over the
main thread's wall time), the learner's idle share (1 - (learn + sync) / wall) and the generator's (1 - generate /
wall). The reward of a run is its mean `reward/mean` over the last fifth of its iterations; K = 1's mean over the
seeds is compared with K = 0's 95% interval (Student's t over the seeds). Goals: `async_speedup_k1` >= 1.8 (K = 1's
questions per second over K = 0's, the mean of the seeds' ratios) where generation and execution take at least as
long as learning (the figures say whether they did), and `reward_k1` within K = 0's interval.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import statistics
import tempfile

from absl import flags

from conductor.conductor_env import build_env
from conductor.generators import build_generator
from conductor.loop_environment import TokenizedConductorEnv
from conductor.model import load_conductor
from conductor.teachers import task_label_indices
from conductor.warm_start import warm_start
from launch.benchmark_suites.common import Report
from launch.flag_groups import conductor as conductor_flags
from launch.flag_groups import environment as environment_flags
from launch.flag_groups import generator as generator_flags
from launch.flag_groups import learner as learner_flags
from launch.flag_groups import loop as loop_flags
from launch.flag_groups import sampling as sampling_flags
from launch.flag_groups import supervised as supervised_flags
from launch.flag_groups import teacher as teacher_flags
from models import hf_io
from rl.learner import Learner
from rl.loop import TrainingLoop
from rl.metrics import first_and_last_fifth
from sweeps.stats import mean_interval

log = logging.getLogger(__name__)

RECIPE = "launch/configs/synthetic.cfg"
ITERATIONS = 12
SEEDS = (100, 101, 102)
STALENESS = (0, 1, 2)
LATENCY_MEDIAN_S = 0.5
LATENCY_SIGMA = 1.0
GOAL_SPEEDUP_K1 = 1.8


def _recipe_flags() -> None:
    """Sets the flags to the recipe's, with the latencies and the run length of this suite."""
    argv = flags.FLAGS.read_flags_from_files([f"--flagfile={RECIPE}"], force_gnu=True)
    overrides = [f"--iterations={ITERATIONS}", f"--worker_latency_s={LATENCY_MEDIAN_S}",
                 f"--worker_latency_sigma={LATENCY_SIGMA}", "--checkpoint_every=0"]
    flags.FLAGS(["launch.benchmark", *argv, *overrides], known_only=True)


def _run(model_dir: pathlib.Path, tokenizer, route_token_ids, seed: int, max_staleness: int, workdir: pathlib.Path):
    """One run from the warm-started Conductor in `model_dir`; returns its per-iteration scalars."""
    env = build_env(environment_flags.from_flags())
    environment = TokenizedConductorEnv(env, tokenizer)
    model = hf_io.load(model_dir)
    generator, weight_sync = build_generator(generator_flags.from_flags(), model_dir, workdir)
    sampling = sampling_flags.from_flags()
    loop_config = dataclasses.replace(loop_flags.from_flags(env.config.recursion_rounds), seed=seed,
                                      max_staleness=max_staleness)
    learner = Learner(model, learner_flags.from_flags(loop_config, sampling, route_token_ids))
    loop = TrainingLoop(loop_config, learner=learner, sampler=generator, sampling_params=sampling,
                        weight_sync=weight_sync, environment=environment,
                        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    try:
        return loop.run()
    finally:
        generator.close()
        env.close()


def _figures(history: list[dict[str, float]], questions_per_iteration: int) -> dict[str, float]:
    timed = history[1:]
    wall = sum(h["time/iteration"] for h in timed)
    learner_busy = sum(h["time/learn"] + h["time/sync"] for h in timed)
    _, last_fifth = first_and_last_fifth([h["reward/mean"] for h in history])
    return {
        "questions_per_s": questions_per_iteration * len(timed) / wall,
        "learner_idle_share": 1.0 - learner_busy / wall,
        "generator_idle_share": 1.0 - sum(h["time/generate"] for h in timed) / wall,
        "generate_execute_s": statistics.mean(h["time/generate"] + h["time/score"] for h in timed),
        "learn_s": statistics.mean(h["time/learn"] for h in timed),
        "reward": last_fifth,
        "rows_dropped": sum(h.get("async/rows_dropped", 0.0) for h in history),
    }


def run() -> Report:
    _recipe_flags()
    with tempfile.TemporaryDirectory() as workdir:
        workdir = pathlib.Path(workdir)
        model, tokenizer, model_dir = load_conductor(conductor_flags.from_flags(), workdir / "conductor_init")
        env = build_env(environment_flags.from_flags())
        environment = TokenizedConductorEnv(env, tokenizer)
        steps = supervised_flags.steps(default=0)
        warm_start(model, environment, steps, supervised_flags.from_flags(steps, len(task_label_indices(environment))),
                   teacher_flags.from_flags())
        warm_dir = hf_io.save(model, workdir / "warm_started")
        tokenizer.save_pretrained(warm_dir)
        route_token_ids = environment.route_token_ids
        questions = loop_flags.from_flags(0).questions_per_iteration
        runs = {}
        for seed in SEEDS:
            for k in STALENESS:
                runs[seed, k] = _figures(_run(warm_dir, tokenizer, route_token_ids, seed, k, workdir), questions)
                log.info("seed %d max_staleness %d: %s", seed, k, json.dumps(runs[seed, k]))
    return _report(runs)


def _report(runs: dict[tuple[int, int], dict[str, float]]) -> Report:
    rows, figures = [], {}
    for k in STALENESS:
        per_seed = [runs[seed, k] for seed in SEEDS]
        mean = {name: statistics.mean(r[name] for r in per_seed) for name in per_seed[0]}
        speedups = [runs[seed, k]["questions_per_s"] / runs[seed, 0]["questions_per_s"] for seed in SEEDS]
        rows.append([k, mean["questions_per_s"], statistics.mean(speedups), mean["learner_idle_share"],
                     mean["generator_idle_share"], mean["generate_execute_s"], mean["learn_s"], mean["reward"],
                     mean["rows_dropped"]])
        figures[f"questions_per_s_k{k}"] = mean["questions_per_s"]
        figures[f"learner_idle_share_k{k}"] = mean["learner_idle_share"]
        figures[f"reward_k{k}"] = mean["reward"]
        figures[f"rewards_k{k}"] = [r["reward"] for r in per_seed]
        figures[f"rows_dropped_k{k}"] = mean["rows_dropped"]
        if k:
            figures[f"async_speedup_k{k}"] = statistics.mean(speedups)
    interval = mean_interval(figures["rewards_k0"])
    low, high = interval["low"], interval["high"]
    k0 = [runs[seed, 0] for seed in SEEDS]
    balanced = statistics.mean(r["generate_execute_s"] for r in k0) >= statistics.mean(r["learn_s"] for r in k0)
    figures.update(
        reward_k0_interval=[low, high],
        reward_k1_within_k0_interval=low <= figures["reward_k1"] <= high,
        generation_and_execution_at_least_learning=balanced,
        goal_speedup_k1=GOAL_SPEEDUP_K1,
        goal_met=figures["async_speedup_k1"] >= GOAL_SPEEDUP_K1 and low <= figures["reward_k1"] <= high,
        seeds=list(SEEDS), iterations=ITERATIONS, latency_median_s=LATENCY_MEDIAN_S, latency_sigma=LATENCY_SIGMA,
        recipe=RECIPE,
    )
    return Report(
        suite="pipeline",
        columns=["max_staleness", "questions_per_s", "speedup", "learner_idle", "generator_idle",
                 "generate+score_s", "learn_s", "reward (last fifth)", "rows_dropped"],
        rows=rows,
        figures=figures,
        notes=[
            f"{len(SEEDS)} seeds x {ITERATIONS} iterations per K, from one warm-start; worker calls lognormal, median "
            f"{LATENCY_MEDIAN_S} s, sigma {LATENCY_SIGMA}",
            f"K=0 reward 95% interval [{low:.3f}, {high:.3f}]; K=1 {figures['reward_k1']:.3f}",
        ],
    )
