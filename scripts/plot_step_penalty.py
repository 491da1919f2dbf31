"""The step-penalty ablation's figure: mean workflow steps, reward and accuracy per --workflow_step_penalty value.

    python scripts/plot_step_penalty.py runs/compare_step_penalty docs/log/step_penalty.png

Reads a `launch.compare --sweep=workflow_step_penalty=...` output directory (`<out>/step_penalty=<v>/seed=<s>/`, each a
launch.train logdir with metrics.jsonl; a run counts once compare has written its run_summary.json). Per value and
seed: the last fifth of iterations' mean
sampled steps (`rollout/steps`), reward (`reward/mean`) and accuracy (`rollout/correct`), and, where the run evaluated
greedily (`--eval_tasks`), the greedy steps, reward and accuracy; and the exact best fixed workflow's steps and expected
reward in the world the run's own flags build (`env.optimum.best_fixed_workflow`). Plots the mean over seeds with
each seed as a dot, prints the table as JSON, and writes the PNG.
"""

from __future__ import annotations

import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from absl import flags  # noqa: E402

from env.optimum import best_fixed_workflow  # noqa: E402
from env.worlds import build_world, synthetic_skills_and_weights  # noqa: E402
import launch.train  # noqa: E402,F401  (defines the flags a run's command sets)
from launch.flag_groups import environment as environment_flags  # noqa: E402
from rl.metrics import first_and_last_fifth, read_metrics  # noqa: E402
from sweeps import records  # noqa: E402
from sweeps.grid import Run  # noqa: E402

FLAG = "workflow_step_penalty"
SAMPLED = {"steps": "rollout/steps", "reward": "reward/mean", "accuracy": "rollout/correct"}


def exact_optimum(command: list[str]) -> dict[str, float]:
    """The best fixed workflow's steps and expected reward in the synthetic world a launch.train command builds."""
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["launch.train", *command[command.index("launch.train") + 1 :]])
    spec = environment_flags.from_flags()
    world = build_world(spec.world, spec.config.reward, spec.config.max_steps)
    skills, weights = synthetic_skills_and_weights(spec.world, world.tasks)
    best = best_fixed_workflow(
        skills, weights, spec.world.answer_model, spec.config.reward, spec.config.max_steps, spec.config.access_mode
    )
    return {"optimum_steps": float(len(best.workflow.steps)), "optimum_reward": best.expected_reward}


def seed_figures(run: Run) -> dict[str, float]:
    metrics = read_metrics(run.logdir)
    figures = {name: first_and_last_fifth([r[key] for r in metrics])[1] for name, key in SAMPLED.items()}
    finished = records.run_record(run)
    figures |= exact_optimum(finished["command"])
    evaluation = finished["train_summary"].get("eval")
    if evaluation:
        figures["greedy_steps"] = evaluation["average"]["steps"]
        figures["greedy_reward"] = evaluation["average"]["reward"]
        figures["greedy_accuracy"] = evaluation["average_accuracy"]
    return figures


def table(out: pathlib.Path) -> dict[float, list[dict[str, float]]]:
    values: dict[float, list[dict[str, float]]] = {}
    for run in records.finished_runs(out, FLAG):
        values.setdefault(float(run.value), []).append(seed_figures(run))
    if not values:
        raise SystemExit(f"no finished run ({FLAG}=<value>/seed=<s>/{records.RUN_SUMMARY}) under {out}")
    return dict(sorted(values.items()))


def plot(values: dict[float, list[dict[str, float]]], path: pathlib.Path) -> None:
    penalties = list(values)
    figure, (steps_axis, score_axis) = plt.subplots(1, 2, figsize=(9, 3.6))
    series = [
        (steps_axis, "optimum_steps", "best fixed workflow (exact)", "black", "--"),
        (steps_axis, "steps", "sampled, last fifth", "tab:blue", "-o"),
        (steps_axis, "greedy_steps", "greedy, after training", "tab:orange", "-o"),
        (score_axis, "optimum_reward", "best fixed workflow's reward (exact)", "black", "--"),
        (score_axis, "reward", "reward, sampled, last fifth", "tab:green", "-o"),
        (score_axis, "accuracy", "accuracy, sampled, last fifth", "tab:red", "-o"),
        (score_axis, "greedy_reward", "reward, greedy, after training", "tab:olive", "-s"),
        (score_axis, "greedy_accuracy", "accuracy, greedy, after training", "tab:purple", "-o"),
    ]
    for axis, name, label, colour, style in series:
        if not all(name in run for runs in values.values() for run in runs):
            continue
        means = [np.mean([run[name] for run in values[p]]) for p in penalties]
        axis.plot(penalties, means, style, color=colour, label=label)
        for p in penalties:
            axis.plot([p] * len(values[p]), [run[name] for run in values[p]], ".", color=colour, alpha=0.4)
    steps_axis.set(xlabel="--workflow_step_penalty", ylabel="workflow steps", ylim=(0.8, 3.2))
    steps_axis.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    score_axis.set(xlabel="--workflow_step_penalty", ylabel="reward, accuracy")
    for axis in (steps_axis, score_axis):
        axis.legend(fontsize=8)
        axis.grid(alpha=0.3)
    figure.suptitle("Step-penalty ablation on launch/configs/workflows.cfg", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        raise SystemExit(__doc__)
    values = table(pathlib.Path(argv[1]))
    plot(values, pathlib.Path(argv[2]))
    print(json.dumps({str(p): runs for p, runs in values.items()}, indent=1))


if __name__ == "__main__":
    main(sys.argv)
