"""Where a replay run's sampled routes go, family by family, over its GRPO iterations.

    python scripts/replay_routing_by_family.py RUN_DIR [RUN_DIR ...] [--windows=5]

Reads each run's rollouts.jsonl (one-step workflows); question indices are those of the train files in the
`--tasks` order replay_routerdc.cfg and replay_rl.cfg use. With `--sft_reasoning=domain` runs, also the share of
completions whose reasoning line names the question's own domain (decoded with the run's conductor_init tokenizer). Prints, per window of iterations and
family, the share of routes each worker got and the mean reward; and per family the train files' best worker and
its mean grade, to read the shares against.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib

import numpy as np
from transformers import AutoTokenizer

from env.worlds import ReplayWorldConfig, build_world
from env.tasks.routerdc import probability_right
from env.workers.replay import ROUTERDC_MODELS

TRAIN_FILES = ("mmlu_train", "gsm8k-train", "cmmlu_train", "arc_challenge_train", "humaneval_train")
SHORT = [model.split("/")[1][:12] for model in ROUTERDC_MODELS]


def family_table(tasks) -> None:
    by_family = collections.defaultdict(list)
    for task in tasks:
        by_family[task.domain].append([probability_right(task.domain, task.metadata["scores"][m]) for m in ROUTERDC_MODELS])
    print("family        " + " ".join(f"{s:>12}" for s in SHORT))
    for family, rows in sorted(by_family.items()):
        means = np.mean(np.asarray(rows, dtype=float), axis=0)
        print(f"{family:13} " + " ".join(f"{m:12.3f}" for m in means))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--windows", type=int, default=5)
    args = parser.parse_args()
    tasks = build_world(ReplayWorldConfig(files=TRAIN_FILES)).tasks
    family_table(tasks)
    for run in args.runs:
        records = [json.loads(line) for line in (pathlib.Path(run) / "rollouts.jsonl").read_text().splitlines()]
        last = max(r["step"] for r in records)
        edges = np.linspace(0, last, args.windows + 1)
        print(f"\n{run}: {len(records)} rollouts, iterations 1-{last}")
        tokenizer = AutoTokenizer.from_pretrained(pathlib.Path(run) / "conductor_init")
        for w in range(args.windows):
            window = [r for r in records if edges[w] < r["step"] <= edges[w + 1]]
            named = np.mean([f"This is a {tasks[r['question']].domain} question." in tokenizer.decode(r["completion_ids"])
                             for r in window])
            print(f"  iterations {int(edges[w]) + 1}-{int(edges[w + 1])}: reward "
                  f"{np.mean([r['reward'] for r in window]):.3f}, own domain named {named:.2f}")
            counts = collections.defaultdict(lambda: np.zeros(len(ROUTERDC_MODELS) + 1))
            for r in window:
                family = tasks[r["question"]].domain
                workers = r.get("workers") or []
                counts[family][workers[0] if len(workers) == 1 else -1] += 1
            for family, row in sorted(counts.items()):
                share = row / row.sum()
                print(f"    {family:11} " + " ".join(f"{s:12.2f}" for s in share[:-1]) + f"  invalid {share[-1]:.2f}")


if __name__ == "__main__":
    main()
