"""Accuracy against cost per question: the Conductors of a `--usd_penalty` sweep beside the fixed policies.

    python -m launch.eval --world=synthetic --synthetic_tasks=400 --max_workflow_steps=1 --reward_wrong=0 --expected_grades \
        --synthetic_skills='0.9,0.9,0.9,0.9;0.85,0.3,0.3,0.3;0.3,0.8,0.3,0.3;0.3,0.3,0.7,0.3;0.3,0.3,0.3,0.6' \
        --synthetic_prices='15,75;0.15,0.6;0.15,0.6;0.15,0.6;0.15,0.6' --methods=single,random,oracle \
        --logdir=runs/cost_aware_fixed     # cost_aware.cfg's world flags (launch.eval has no training flags)
    python scripts/plot_cost_frontier.py runs/cost_aware runs/cost_aware_fixed/results.json docs/log/cost_frontier.png

Reads a `launch.compare --sweep=usd_penalty=...` directory (`<out>/usd_penalty=<v>/seed=<s>/`; a run counts once
compare has written its run_summary.json, whose greedy evaluation gives the point) and a `launch.eval` results.json
of the same world. Draws each fixed policy (each worker alone, random routing, the oracle), the trained Conductors
(each seed a dot, the mean over seeds a labelled point per penalty; a run whose greedy Conductor writes no valid
workflow is named instead), and the best routing per task for every
penalty: each task sent to the worker with the highest accuracy less penalty times cost, computed from the
single-worker rows (exact under --expected_grades). Prints the table as markdown, and per seed the accuracy its trained
Conductors reach at random routing's cost (sending each question to one of two of them at random reaches any point on
the line between them).
"""

from __future__ import annotations

import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from sweeps import records  # noqa: E402

FLAG = "usd_penalty"
SINGLE, RANDOM, ORACLE = "single ", "random routing", "oracle routing"


def trained_points(out: pathlib.Path, collapsed: list[str]) -> dict[float, dict[str, tuple[float, float]]]:
    """Per penalty, each finished seed's greedy (accuracy, USD per question); runs whose greedy Conductor writes no
    valid workflow are named in `collapsed` instead."""
    points: dict[float, dict[str, tuple[float, float]]] = {}
    for run in records.finished_runs(out, FLAG):
        average = records.run_record(run)["train_summary"]["eval"]["average"]
        penalty, seed = float(run.value), f"seed={run.seed}"
        if average["valid_format"] == 0:  # no workflow parsed: no routing, no cost to place it at
            collapsed.append(f"{FLAG}={penalty:g} {seed}")
            continue
        points.setdefault(penalty, {})[seed] = (average["correct"], average["cost_usd"])
    if not points:
        raise SystemExit(f"no finished run ({FLAG}=<value>/seed=<s>/{records.RUN_SUMMARY}) under {out}")
    return dict(sorted(points.items()))

def accuracy_at_cost(points: list[tuple[float, float]], cost: float) -> float | None:
    """The accuracy that sending each question to one of two of these (accuracy, cost) policies at random reaches at
    `cost`: the upper hull of the points there (None outside their cost range)."""
    best = None
    for low_accuracy, low_cost in points:
        for high_accuracy, high_cost in points:
            if low_cost <= cost <= high_cost:
                share = 0.0 if high_cost == low_cost else (cost - low_cost) / (high_cost - low_cost)
                mixed = low_accuracy + share * (high_accuracy - low_accuracy)
                best = mixed if best is None else max(best, mixed)
    return best


def best_routing_curve(singles: dict[str, dict], penalties: np.ndarray) -> list[tuple[float, float, float]]:
    """(penalty, accuracy, cost) of sending each task to its best worker at that penalty, where it changes."""
    task_labels = sorted(next(iter(singles.values()))["tasks"])
    questions = np.asarray([next(iter(singles.values()))["tasks"][d]["questions"] for d in task_labels], dtype=float)
    weights = questions / questions.sum()
    accuracy = np.asarray([[row["tasks"][d]["correct"] for d in task_labels] for row in singles.values()])
    cost = np.asarray([[row["tasks"][d]["cost_usd"] for d in task_labels] for row in singles.values()])
    curve: list[tuple[float, float, float]] = []
    for penalty in penalties:
        choice = np.argmax(accuracy - penalty * cost, axis=0)
        columns = np.arange(len(task_labels))
        point = (float(penalty), float(weights @ accuracy[choice, columns]), float(weights @ cost[choice, columns]))
        if not curve or point[1:] != curve[-1][1:]:
            curve.append(point)
    return curve


def main(argv: list[str]) -> None:
    if len(argv) != 4:
        raise SystemExit(__doc__)
    collapsed: list[str] = []
    trained = trained_points(pathlib.Path(argv[1]), collapsed)
    methods = json.loads(pathlib.Path(argv[2]).read_text())["methods"]
    singles = {name: row for name, row in methods.items() if name.startswith(SINGLE)}
    fixed = {name: (row["average"]["correct"], row["average"]["cost_usd"]) for name, row in methods.items()
             if name.startswith(SINGLE) or name in (RANDOM, ORACLE)}
    curve = best_routing_curve(singles, np.linspace(0.0, 2 * max(trained) + 1.0, 2001))
    random_accuracy, random_cost = fixed[RANDOM]

    figure, axis = plt.subplots(figsize=(7.5, 4.6))
    axis.plot([c for _, _, c in curve], [a for _, a, _ in curve], "--.", color="black",
              label="best routing per task at each penalty (exact)")
    names_at: dict[tuple[float, float], list[str]] = {}
    for name, point in fixed.items():
        names_at.setdefault((round(point[0], 4), round(point[1], 6)), []).append(name)
    for (accuracy, cost), names in names_at.items():
        axis.plot(cost, accuracy, "s", color="grey")
        axis.annotate(", ".join(names), (cost, accuracy), fontsize=7, xytext=(4, -9), textcoords="offset points")
    for penalty, seeds in trained.items():
        accuracies, costs = zip(*seeds.values())
        axis.plot(costs, accuracies, ".", color="tab:blue", alpha=0.4)
        axis.plot(np.mean(costs), np.mean(accuracies), "o", color="tab:blue")
        axis.annotate(f"{FLAG}={penalty:g}", (np.mean(costs), np.mean(accuracies)), fontsize=7, color="tab:blue",
                      xytext=(4, 4), textcoords="offset points")
    axis.plot([], [], "o", color="tab:blue", label="trained Conductor, greedy (mean; dots: seeds)")
    if collapsed:
        figure.text(0.01, 0.01, "no valid greedy workflow, not drawn: " + "; ".join(collapsed), fontsize=7)
    axis.set(xscale="log", xlabel="US dollars per question (log)", ylabel="accuracy",
             title="Cost-aware routing: launch/configs/cost_aware.cfg")
    axis.set_xlim(right=4 * max(cost for _, cost in fixed.values()))  # room for the labels
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(argv[3], dpi=90)

    print("| point | accuracy | USD per question |")
    print("|---|---|---|")
    for name, (accuracy, cost) in fixed.items():
        print(f"| {name} | {accuracy:.3f} | {cost:.5f} |")
    for penalty, seeds in trained.items():
        accuracy, cost = np.mean(list(seeds.values()), axis=0)
        each = ", ".join(f"{seed} {a:.3f} at {c:.5f}" for seed, (a, c) in seeds.items())
        print(f"| {FLAG}={penalty:g}, mean of {len(seeds)} ({each}) | {accuracy:.3f} | {cost:.5f} |")
    for penalty, accuracy, cost in curve:
        print(f"| best routing from {FLAG}={penalty:.2f} (exact) | {accuracy:.3f} | {cost:.5f} |")
    if collapsed:
        print("\nNo valid greedy workflow (not in the table): " + "; ".join(collapsed))
    print(f"\nAt random routing's cost (${random_cost:.5f} per question; accuracy {random_accuracy:.3f}), mixing "
          "each seed's trained Conductors question by question reaches:")
    for seed in sorted({seed for seeds in trained.values() for seed in seeds}):
        reached = accuracy_at_cost([seeds[seed] for seeds in trained.values() if seed in seeds], random_cost)
        print(f"- {seed}: " + ("outside its points' costs" if reached is None else f"{reached:.3f}"))

if __name__ == "__main__":
    main(sys.argv)
