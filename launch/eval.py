"""Evaluates a Conductor against the reference's baselines on one world and task split.

    python -m launch.eval --conductor=runs/replay/conductor_final --world=replay \
        --tasks=mmlu_test,gsm8k-test,cmmlu_test,arc_challenge_test,humaneval_test --task_limit=100 --repeats=3 \
        --logdir=runs/eval/replay

Every method runs through the same env: the Conductor's completions and the baselines' fixed workflows are parsed,
executed over the world's pool (through `--cache` when given, so a rerun makes no provider calls), graded and
summarized (`conductor.outcomes`, `conductor.baselines`, `conductor.report`). Writes results.json, results.md and
accuracy_tokens.png to `--logdir` and prints the markdown.
"""

from __future__ import annotations

from conductor.host_memory import retain_freed_memory

# First, before JAX and torch start their threads; run as a program, restart with glibc tunables
# (conductor/host_memory.py).
retain_freed_memory(restart=__name__ == "__main__")

import logging
from typing import Any

from absl import app, flags

from conductor import console
from conductor.baselines import BASELINES, orchestration_figures, recorded_figures, run_baselines
from conductor.conductor_env import build_env
from conductor.generators import build_generator, share_gpu_with_torch_generator
from conductor.loop_environment import TokenizedConductorEnv
from conductor.model import load_conductor, trained_sampling
from conductor.outcomes import conductor_outcomes
from conductor.report import summarize, write_report
from env.worlds import build_world
from launch.flag_groups import baselines as baseline_flags
from launch.flag_groups import conductor as conductor_flags
from launch.flag_groups import console as console_flags
from launch.flag_groups import environment as environment_flags
from launch.flag_groups import generator as generator_flags
from launch.flag_groups import output as output_flags
from launch.flag_groups import sampling as sampling_flags

_METHODS = flags.DEFINE_list(
    "methods", ["conductor", *BASELINES],
    f"What to evaluate: 'conductor' (--conductor) and any of {', '.join(BASELINES)}.",
)
_REPEATS = flags.DEFINE_integer("repeats", 1, "Passes over the questions; accuracy standard errors are over these.")


def orchestration_table(figures: dict[str, dict[str, Any]]) -> str:
    """Markdown of each method's exact figures on the orchestration world (`baselines.orchestration_figures`)."""
    first = next(iter(figures.values()))
    lines = [
        "", f"Exact expected reward of each method's workflows on these questions (orchestration world; pools held out "
        f"of training: {first['heldout_pools']}): best fixed workflow per pool {first['best_fixed_reward']:.4f}, best "
        f"per (task, pool) {first['per_task_reward']:.4f}, per-question optimum {first['optimum_reward']:.4f}. Gap "
        "closed: the fraction of the gap from the first to the last; shapes: share of workflows per access pattern.",
        "", "| method | expected reward | gap closed | shapes |", "|---|---|---|---|",
    ]
    for method, row in figures.items():
        shapes = ", ".join(f"{name} {100 * share:.1f}" for name, share in row["shapes"].items())
        lines.append(f"| {method} | {row['reward']:.4f} | {row['gap_closed']:.3f} | {shapes} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    del argv
    console.configure(console_flags.LIBRARY_LOGS.value)
    unknown = sorted(set(_METHODS.value) - {"conductor", *BASELINES})
    if unknown:
        raise app.UsageError(f"unknown --methods {unknown}; choose from conductor, {', '.join(BASELINES)}")
    out_dir = output_flags.logdir("runs/eval")  # results.json, results.md and the plot
    model_dir = None
    if "conductor" in _METHODS.value:
        generation = generator_flags.from_flags()
        share_gpu_with_torch_generator(generation)  # before JAX's first computation
        _, tokenizer, model_dir = load_conductor(conductor_flags.from_flags(), out_dir / "conductor")
    # A trained Conductor is prompted as it was trained.
    env = build_env(environment_flags.from_flags(trained=trained_sampling(model_dir) if model_dir else None))
    names = [worker.name for worker in env.world.pool]
    results = {}
    if model_dir is not None:
        generator, _ = build_generator(generation, model_dir, out_dir)
        # Greedy unless --temperature is given: how a trained Conductor is evaluated, and what launch.serve tries first.
        params = sampling_flags.from_flags(trained_conductor=model_dir, default_temperature=0.0)
        try:
            environment = TokenizedConductorEnv(env, tokenizer, sampling_flags.token_masks(), params.max_new_tokens)
            outcomes = conductor_outcomes(generator, environment, params, _REPEATS.value)
        finally:
            generator.close()
        results[f"Conductor ({flags.FLAGS.conductor})"] = summarize(outcomes, names)
        if env.world.orchestration is not None:
            results[f"Conductor ({flags.FLAGS.conductor})"]["orchestration"] = orchestration_figures(
                env.world.orchestration, env.world.tasks, outcomes
            )
        if env.world.name == "zeroeval" and _REPEATS.value == 1:
            results[f"Conductor ({flags.FLAGS.conductor})"]["recorded"] = recorded_figures(env.world, outcomes)
    config = baseline_flags.from_flags([method for method in _METHODS.value if method in BASELINES])
    if config.baselines:
        bandit_training = None
        if baseline_flags.BANDIT_TASKS.value and "bandit" in config.baselines:
            bandit_training = build_world(environment_flags.from_flags(baseline_flags.BANDIT_TASKS.value).world).tasks
        results.update(run_baselines(env, config, _REPEATS.value, bandit_training))
    env.close()
    if env.cache is not None:
        logging.info("cache %s: %d hits, %d misses", env.cache.path, env.cache.hits, env.cache.misses)
        env.cache.close()
    title = f"{env.world.name} world: {len(env.world.tasks)} questions, {_REPEATS.value} repeat(s)"
    paths = write_report(results, out_dir, title)
    exact = {method: report["orchestration"] for method, report in results.items() if "orchestration" in report}
    if exact:
        with open(out_dir / "results.md", "a") as markdown:
            markdown.write(orchestration_table(exact))
    print((out_dir / "results.md").read_text())
    print(paths)


if __name__ == "__main__":
    app.run(main)
