"""How often an idealised learner meets the replay goal from as much bandit feedback as a training run draws.

    python -m scripts.replay_bandit_ceiling [--questions=300,600,1200] [--trials=2000] [--goal=57.56]
        [--group_size=8] [--families=humaneval]

The learner: for each family, `questions` train questions drawn at random (a GRPO run with 20 stratified questions
per iteration draws 4 per family per iteration: 150 iterations are 600), each answered by a group of `group_size`
routes drawn uniformly from the 7 workers (the format-only warm-start's routing), each route graded as the replay
world grades it (`--expected_grades`). It routes each family to the worker with the highest mean group-relative
advantage (grade minus its group's mean), the estimate GRPO's update follows, never seen twice. Its score is that
routing's average on the five test files. Printed per budget: how often each family lands on its train-file best
worker, the mean and 5th-95th percentiles of the score, and the share of trials at or over the goal, with the chance
of 3 of 3. A learner that explores adaptively does better than uniform routing; one that shares parameters across
families does worse.

`--families` names the families the learner must find from bandit feedback; every other family is routed to its
train-file best from the start, as a warm-start that has already found it routes it (the world teacher of
`replay_routerdc.cfg` routes four families so, all but HumanEval).
"""

from __future__ import annotations

import argparse

import numpy as np

from env.workers.replay import ROUTERDC_MODELS
from scripts.routerdc_family_margins import TEST_FILES, TRAIN_FILES, family_grades

def bandit_choice(grades: np.ndarray, questions: int, group_size: int, rng: np.random.Generator) -> int:
    """The worker with the highest mean advantage over `questions` groups of `group_size` uniformly drawn routes."""
    workers = grades.shape[1]
    asked = rng.integers(0, len(grades), size=questions)
    routes = rng.integers(0, workers, size=(questions, group_size))
    rewards = grades[asked[:, None], routes]
    advantages = rewards - rewards.mean(axis=1, keepdims=True)
    totals = np.bincount(routes.ravel(), weights=advantages.ravel(), minlength=workers)
    counts = np.bincount(routes.ravel(), minlength=workers)
    return int(np.argmax(np.where(counts > 0, totals / np.maximum(counts, 1), -np.inf)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--questions", default="300,600,1200")
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--goal", type=float, default=57.56)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--group_size", type=int, default=8)
    parser.add_argument("--families", default="", help="comma-separated; empty: all five")
    args = parser.parse_args()
    train, test = family_grades(TRAIN_FILES), family_grades(TEST_FILES)
    families = sorted(train)
    learned = args.families.split(",") if args.families else families
    if unknown := set(learned) - set(families):
        parser.error(f"--families: unknown {sorted(unknown)}; the families are {families}")
    if args.group_size < 2:
        parser.error(f"--group_size must be >= 2 (a group-relative advantage needs two routes), got {args.group_size}")
    test_means = {family: 100 * test[family].mean(axis=0) for family in families}
    best = {family: int(np.argmax(train[family].mean(axis=0))) for family in families}
    rng = np.random.default_rng(args.seed)
    print(f"train-file best: " + ", ".join(f"{f} {ROUTERDC_MODELS[best[f]].split('/')[1]}" for f in families))
    print(f"score routing each family to it: {np.mean([test_means[f][best[f]] for f in families]):.2f}")
    for questions in map(int, args.questions.split(",")):
        scores, right = [], {family: 0 for family in families}
        for _ in range(args.trials):
            choice = {
                family: bandit_choice(train[family], questions, args.group_size, rng) if family in learned
                else best[family]
                for family in families
            }
            for family in families:
                right[family] += choice[family] == best[family]
            scores.append(np.mean([test_means[family][choice[family]] for family in families]))
        scores = np.asarray(scores)
        met = float(np.mean(scores >= args.goal))
        print(f"{questions:5d} questions per family: train-best chosen "
              + ", ".join(f"{family} {right[family] / args.trials:.2f}" for family in learned)
              + f"; score {scores.mean():.2f} (5-95%: {np.percentile(scores, 5):.2f}-{np.percentile(scores, 95):.2f});"
              f" >= {args.goal}: {met:.2f} of trials, 3 of 3: {met**3:.3f}")


if __name__ == "__main__":
    main()
