"""How much bandit feedback it takes to find each family's best worker on the RouterDC train files.

    python scripts/routerdc_family_margins.py

Per family of the replay recipe's five: the best and second-best worker by mean grade on the train file, the margin
between them, the standard deviation of their per-question grade difference (a GRPO group compares routes on one
question, so the comparison is paired), and the number n of questions on which both must be tried for a one-sided
paired z-test at 5% to find the better one with 80% power: n = ((1.645 + 0.842) sd / margin)^2. Beside it, what
the two score on the test file and what the gap costs the five-file average (a family is a fifth of it).
"""

from __future__ import annotations

import numpy as np

from env.workers.replay import ROUTERDC_MODELS
from env.worlds import ReplayWorldConfig, build_world, replay_grades_by_family

TRAIN_FILES = ("mmlu_train", "gsm8k-train", "cmmlu_train", "arc_challenge_train", "humaneval_train")
TEST_FILES = ("mmlu_test", "gsm8k-test", "cmmlu_test", "arc_challenge_test", "humaneval_test")
Z_ALPHA, Z_POWER = 1.645, 0.842


def family_grades(files: tuple[str, ...]) -> dict[str, np.ndarray]:
    """{family: grades[question, worker]}, each grade the worker's recorded chance of being right."""
    return replay_grades_by_family(build_world(ReplayWorldConfig(files=files)).tasks)


def main() -> None:
    train, test = family_grades(TRAIN_FILES), family_grades(TEST_FILES)
    names = [model.split("/")[1] for model in ROUTERDC_MODELS]
    print("family         questions  best (train mean)                   second (train mean)                 margin  "
          "paired sd  n needed  test best/second  cost of second")
    for family in sorted(train):
        means = train[family].mean(axis=0)
        best, second = np.argsort(-means)[:2]
        difference = train[family][:, best] - train[family][:, second]
        needed = ((Z_ALPHA + Z_POWER) * difference.std(ddof=1) / difference.mean()) ** 2
        test_best, test_second = 100 * test[family][:, best].mean(), 100 * test[family][:, second].mean()
        print(f"{family:14} {len(train[family]):9d}  {names[best][:28]:28} {means[best]:.3f}  "
              f"{names[second][:28]:28} {means[second]:.3f}  {means[best] - means[second]:6.3f}  "
              f"{difference.std(ddof=1):9.3f}  {needed:8.0f}  {test_best:6.2f}/{test_second:6.2f}  "
              f"{(test_best - test_second) / len(train):14.2f}")


if __name__ == "__main__":
    main()
