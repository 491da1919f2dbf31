"""The orchestration world's exact figures and the contextual UCB1 bandit's, per split (docs/orchestration-world.md).

    python scripts/orchestration_world.py [--budget=1920] [--seeds=0,1,2,3,4,5,6,7,8,9] [--drawn_outcomes]

With launch/configs/orchestration.cfg's world and reward, prints per split (train, validation, test): its pools, the
mean exact expected reward of the best fixed workflow per pool, the best per (task, pool) and the per-question
optimum, the optimum's share of questions per access pattern, the optimum per (difficulty) in steps; then the bandit
trained on the training split with `--budget` pulls, once per seed, scored exactly on each split (mean and 95% t
interval over seeds, and the gap it closes). Each pull sees the arm's exact expected reward, as the recipe's
`--expected_grades` run sees each sample's; `--drawn_outcomes`: a drawn right/wrong outcome instead. `launch.eval --methods=best_fixed,task_optimum,optimum,bandit` gives
the same figures through the env, one seed at a time.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses

import numpy as np
from scipy import stats

from conductor import bandit
from env.orchestration import SPLITS, OrchestrationWorldConfig, context, gap_closed, load_tasks, pool_split
from env.rewards import RewardConfig
from env.workers.simulated import AnswerModel
from env.worlds import build_world

# launch/configs/orchestration.cfg's reward, answer model and step limit
REWARD = RewardConfig(format_error=-1.0, wrong=0.0, correct=1.0, step_penalty=0.08, usd_penalty=10.0)
ANSWER_MODEL = AnswerModel(rule="adopt", adopt_rate=0.9)
MAX_STEPS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=1920)
    parser.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
    parser.add_argument("--drawn_outcomes", action="store_true",
                        help="each pull sees a drawn right/wrong outcome, as a run without --expected_grades would")
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    config = OrchestrationWorldConfig(answer_model=ANSWER_MODEL)
    worlds = {split: build_world(dataclasses.replace(config, split=split), REWARD, MAX_STEPS) for split in SPLITS}
    reference = worlds["train"].orchestration
    print("| split | pools | questions | best fixed per pool | best per (task, pool) | per-question optimum | gap | "
          "optimum's shapes |")
    print("|---|---|---|---|---|---|---|---|")
    for split, world in worlds.items():
        figures = world.orchestration.figures(world.tasks)
        shapes = ", ".join(f"{name} {share:.3f}" for name, share in figures["optimum_shapes"].items())
        pools = " ".join("".join(str(w) for w in pool) for pool in pool_split(config)[split])
        print(f"| {split} | {pools} | {len(world.tasks)} | {figures['best_fixed_reward']:.4f} | "
              f"{figures['per_task_reward']:.4f} | {figures['optimum_reward']:.4f} | "
              f"{figures['optimum_reward'] - figures['best_fixed_reward']:.4f} | {shapes} |")  # fmt: skip
    steps: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for world in worlds.values():
        for task in world.tasks:
            steps[task.metadata["difficulty"]][len(world.orchestration.per_question(task).workflow.steps)] += 1
    print("\nper-question optimum's steps by difficulty (questions of all splits):",
          {difficulty: dict(sorted(counts.items())) for difficulty, counts in steps.items()})
    problem = bandit.orchestration_problem(
        reference, load_tasks(dataclasses.replace(config, split="train")), expected_grades=not args.drawn_outcomes
    )
    feedback = "a drawn outcome" if args.drawn_outcomes else "the exact expected reward (the recipe's)"
    print(f"\ncontextual UCB1, {args.budget} pulls on the training split, each seeing {feedback}, seeds {args.seeds}")
    print("| split | mean exact reward | 95% interval | gap closed | contexts seen / in split |")
    print("|---|---|---|---|---|")
    rewards: dict[str, list[float]] = collections.defaultdict(list)
    seen: dict[str, list[int]] = collections.defaultdict(list)
    for seed in seeds:
        statistics = bandit.ucb1(problem, args.budget, seed)
        for split, world in worlds.items():
            seen[split].append(len({context(task) for task in world.tasks} & set(statistics)))
            choices = {}
            total = 0.0
            for task in world.tasks:
                key = context(task)
                if key not in choices:
                    choices[key] = bandit.orchestration_workflow(reference, problem, statistics, task)
                total += world.orchestration.expected_reward(task, choices[key])
            rewards[split].append(total / len(world.tasks))
    for split, world in worlds.items():
        values = np.asarray(rewards[split])
        half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else 0
        figures = world.orchestration.figures(world.tasks)
        closed = gap_closed(values.mean(), figures["best_fixed_reward"], figures["optimum_reward"])
        contexts = len({context(task) for task in world.tasks})
        print(f"| {split} | {values.mean():.4f} | ± {half:.4f} | {closed:.3f} | {np.mean(seen[split]):.1f} / "
              f"{contexts} |")


if __name__ == "__main__":
    main()
