"""What a Conductor that ignores the pool can reach when the ids its question does not offer are masked
(`--mask_unoffered_ids`): per question type, a ranked list over world ids, of which the first entry the question's
pool offers runs.

    python -m scripts.masked_preference_ceiling [--zeroeval]

Orchestration world (launch/configs/orchestration.cfg), exact expected rewards, a list per (task, difficulty): prints,
per split, the best fixed workflow per pool and the per-question optimum (the gap's ends), then the ranked
lists' reward and the gap they close: single workers ranked exactly (every order of the six), and lists of
workflows of up to three steps built greedily (each next entry, put before the best single-worker ranking, the one
that raises the total most; a lower bound on the best list). Each list is chosen on the training split's questions
and pools and scored on every split; "fit on the split" chooses it on the split it is scored on (what no learner
can exceed with a pool-blind list of that kind).

`--zeroeval` (needs ZeroEval's data, `python -m launch.data fetch zeroeval`): the sixteen models of each task ranked by
their accuracy on the task's training half, on the test half's 22 held-out pools (`pools=heldout`): each pool's
accuracy beside its per-task best on the same questions, as `eval.pools` reports a Conductor's.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools

import numpy as np

from env import frontier
from env.optimum import candidate_workflows
from env.orchestration import SPLITS, OrchestrationWorldConfig, context, gap_closed
from env.pools import offered_pool
from env.worlds import ZeroEvalWorldConfig, build_world
from scripts.orchestration_world import ANSWER_MODEL, MAX_STEPS, REWARD


def reward_matrix(world, workflows):
    """[question, workflow] exact expected reward; NaN where the question's pool lacks one of the workflow's workers."""
    reference = world.orchestration
    cache: dict[tuple, np.ndarray] = {}
    rows = []
    for task in world.tasks:
        key = (context(task), offered_pool(task))
        if key not in cache:
            pool = set(offered_pool(task))
            cache[key] = np.array([
                reference.expected_reward(task, w) if {s.worker for s in w.steps} <= pool else np.nan
                for w in workflows
            ])
        rows.append(cache[key])
    return np.array(rows)


def first_offered(matrix: np.ndarray, ranking: list[int]) -> np.ndarray:
    """Each question's reward under the ranked list (the first entry its pool offers; -inf if none does)."""
    chosen = np.full(matrix.shape[0], -np.inf)
    open_rows = np.ones(matrix.shape[0], dtype=bool)
    for column in ranking:
        offered = open_rows & ~np.isnan(matrix[:, column])
        chosen[offered] = matrix[offered, column]
        open_rows &= ~offered
    return chosen


def exact_single_ranking(matrix: np.ndarray, singles: list[int]) -> list[int]:
    best, best_value = None, -np.inf
    for order in itertools.permutations(singles):
        value = first_offered(matrix, list(order)).sum()
        if value > best_value:
            best, best_value = list(order), value
    return best


def greedy_ranking(matrix: np.ndarray, singles: list[int]) -> list[int]:
    """The exact single-worker ranking with workflows put before it one at a time, each the one that raises the total
    most, while one does: a lower bound on the best list."""
    tail = exact_single_ranking(matrix, singles)
    head: list[int] = []
    total = first_offered(matrix, tail).sum()
    while True:
        values = [first_offered(matrix, head + [column] + tail).sum() for column in range(matrix.shape[1])]
        column = int(np.argmax(values))
        if values[column] <= total + 1e-9:
            return head + tail
        head.append(column)
        total = values[column]


def zeroeval_ranking() -> None:
    train = build_world(ZeroEvalWorldConfig(split="train"))
    test = build_world(ZeroEvalWorldConfig(split="test", pools="heldout"))
    known = frontier.outcomes(train.tasks, train.pool)
    accuracy = {label: known.correct[known.task_label_of == index].mean(axis=0)
                for index, label in enumerate(known.task_labels)}
    tested = frontier.outcomes(test.tasks, test.pool)
    chosen = [max(offered_pool(task), key=lambda m: accuracy[task.task_label][m]) for task in test.tasks]
    correct = tested.correct[np.arange(len(chosen)), chosen].astype(float)
    cost = tested.cost_usd[np.arange(len(chosen)), chosen]
    figures = frontier.offered_pool_figures(test.tasks, test.pool, correct, cost)
    print(f"\nZeroEval, each task's models ranked by training accuracy, on the 22 held-out pools: accuracy "
          f"{figures['accuracy']:.4f}, {figures['pools_at_share']} of {len(figures['pools'])} pools at >= 95% of their "
          f"per-task best")
    print("| pool | accuracy | per-task best | ratio |")
    print("|---|---|---|---|")
    for name, pool in figures["pools"].items():
        best = pool["baselines"]["per_task_best"]["accuracy"]
        print(f"| {name} | {pool['accuracy']:.4f} | {best:.4f} | {pool['to_per_task_best']:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zeroeval", action="store_true", help="also the ZeroEval world's per-task ranking")
    args = parser.parse_args()
    config = OrchestrationWorldConfig(answer_model=ANSWER_MODEL)
    worlds = {split: build_world(dataclasses.replace(config, split=split), REWARD, MAX_STEPS) for split in SPLITS}
    workflows = candidate_workflows(len(config.workers), MAX_STEPS)
    singles = [i for i, w in enumerate(workflows) if len(w.steps) == 1]
    matrices = {split: reward_matrix(world, workflows) for split, world in worlds.items()}
    contexts = {split: [context(task)[:2] for task in world.tasks] for split, world in worlds.items()}

    def rankings(split: str, method) -> dict:
        by_context = collections.defaultdict(list)
        for row, key in enumerate(contexts[split]):
            by_context[key].append(row)
        return {key: method(matrices[split][rows], singles) for key, rows in by_context.items()}

    def score(split: str, chosen: dict) -> float:
        rewards = [first_offered(matrices[split][[row]], chosen[key])[0] for row, key in enumerate(contexts[split])]
        return float(np.mean(rewards))

    trained = {"single workers, exact": rankings("train", exact_single_ranking),
               "workflows, greedy": rankings("train", greedy_ranking)}
    print("| split | best fixed | optimum | ranked list | fit on | reward | gap closed |")
    print("|---|---|---|---|---|---|---|")
    for split, world in worlds.items():
        figures = world.orchestration.figures(world.tasks)
        ends = figures["best_fixed_reward"], figures["optimum_reward"]
        for name, method in (("single workers, exact", exact_single_ranking), ("workflows, greedy", greedy_ranking)):
            for fit, chosen in (("train", trained[name]), (split, rankings(split, method))):
                if fit == split == "train" and chosen is not trained[name]:
                    continue
                value = score(split, chosen)
                print(f"| {split} | {ends[0]:.4f} | {ends[1]:.4f} | {name} | {fit} | {value:.4f} | "
                      f"{gap_closed(value, *ends):.3f} |")
    if args.zeroeval:
        zeroeval_ranking()


if __name__ == "__main__":
    main()
