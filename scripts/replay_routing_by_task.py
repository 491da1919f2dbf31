"""Where a replay run's sampled routes go, task by task, over its GRPO iterations.

    python scripts/replay_routing_by_task.py RUN_DIR [RUN_DIR ...] [--windows=5]

Prints the train files' mean grade of every worker in every task (what the shares are read against), then for each
run and window of iterations: the mean reward, the share of completions whose reasoning line names the question's own
task (`--warm_start_reasoning=task` runs; decoded with the run's conductor_init tokenizer), and per task the share
of routes each worker got. Then the feedback the run could have had: per task, every worker's mean grade over the
questions the run drew (each drawn question once per iteration that drew it), the best worker on that sample and its
lead over the second: where that lead is small, the task's route is a coin flip for any learner fed those draws.
Last, where the policy gradient's weight went: per task, the share of its rows with a nonzero advantage and the
task's share of the run's summed |advantage| (a task whose groups seldom tie pulls the shared parameters hardest).
Reads the run's rollouts.jsonl (one-step workflows); its question indices are those of the five train files in
replay_routerdc.cfg's `--tasks` order.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib

import numpy as np
from transformers import AutoTokenizer

from env.workers.replay import ROUTERDC_MODELS
from env.worlds import ReplayWorldConfig, build_world, replay_grades_by_task

TRAIN_FILES = ("mmlu_train", "gsm8k-train", "cmmlu_train", "arc_challenge_train", "humaneval_train")
SHORT = [model.split("/")[1][:12] for model in ROUTERDC_MODELS]


def task_means(tasks) -> dict[str, np.ndarray]:
    """Per task, in sorted order, every worker's mean grade over `tasks` (a task listed twice counts twice)."""
    return {task_label: grades.mean(axis=0) for task_label, grades in replay_grades_by_task(tasks).items()}


def task_table(tasks) -> None:
    print("task          " + " ".join(f"{name:>12}" for name in SHORT))
    for task_label, means in task_means(tasks).items():
        print(f"{task_label:13} " + " ".join(f"{mean:12.3f}" for mean in means))


def drawn_questions_report(records, tasks) -> None:
    drawn = [tasks[question] for _, question in {(r["step"], r["question"]) for r in records}]
    questions = collections.Counter(task.task_label for task in drawn)
    print("  the questions it drew, every worker's mean grade:")
    for task_label, means in task_means(drawn).items():
        first, second = np.argsort(-means)[:2]
        print(f"    {task_label:11} " + " ".join(f"{mean:12.3f}" for mean in means)
              + f"  {questions[task_label]} questions; best {SHORT[first]} by {means[first] - means[second]:.3f}")


def advantage_weight_report(records, tasks) -> None:
    rows, nonzero, weight = collections.Counter(), collections.Counter(), collections.Counter()
    for r in records:
        task_label = tasks[r["question"]].task_label
        rows[task_label] += 1
        nonzero[task_label] += r["advantage"] != 0
        weight[task_label] += abs(r["advantage"])
    total = sum(weight.values())
    print("  where the policy gradient's weight went (rows with a nonzero advantage; share of the summed |advantage|):")
    for task_label in sorted(rows):
        print(f"    {task_label:11} {nonzero[task_label] / rows[task_label]:12.2f} {weight[task_label] / total:12.2f}")


def window_report(records, tasks, tokenizer) -> None:
    named = np.mean([
        f"This is a {tasks[r['question']].task_label} question." in tokenizer.decode(r["completion_ids"]) for r in records
    ])
    print(f"reward {np.mean([r['reward'] for r in records]):.3f}, own task named {named:.2f}")
    counts = collections.defaultdict(lambda: np.zeros(len(ROUTERDC_MODELS) + 1))
    for r in records:
        workers = r.get("workers") or []
        counts[tasks[r["question"]].task_label][workers[0] if len(workers) == 1 else -1] += 1
    for task_label, row in sorted(counts.items()):
        share = row / row.sum()
        print(f"    {task_label:11} " + " ".join(f"{s:12.2f}" for s in share[:-1]) + f"  invalid {share[-1]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--windows", type=int, default=5)
    args = parser.parse_args()
    tasks = build_world(ReplayWorldConfig(files=TRAIN_FILES)).tasks
    task_table(tasks)
    for run in map(pathlib.Path, args.runs):
        records = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
        tokenizer = AutoTokenizer.from_pretrained(run / "conductor_init")
        last = max(r["step"] for r in records)
        edges = np.linspace(0, last, args.windows + 1)
        print(f"\n{run}: {len(records)} rollouts, iterations 1-{last}")
        for start, end in zip(edges[:-1], edges[1:]):
            print(f"  iterations {int(start) + 1}-{int(end)}: ", end="")
            window_report([r for r in records if start < r["step"] <= end], tasks, tokenizer)
        drawn_questions_report(records, tasks)
        advantage_weight_report(records, tasks)


if __name__ == "__main__":
    main()
