"""How far the world teacher's weighted optimum puts each family's best worker ahead of the second, per weighting, on
the RouterDC train files; and family routing chosen on the train files, scored on the test files.

Grades: a multiple-choice score is right (1) when positive, else wrong (0); a generated-answer score is already the
fraction of sampled answers that passed (docs/decisions/007-routerdc-score-reading.md). "grade" weights a route by its
grade (reward-weighted regression); "advantage" by how far its grade exceeds the question's mean grade (0 below it).
The lead is log(optimum[best] / optimum[second]).
    python scripts/routerdc_warm_start_margins.py
Reads the RouterDC files from the data lookup (`python -m launch.data fetch routerdc`). Used by
docs/log/2026-11-26-routerdc-score-reading.md (then named margins.py).
"""

import json

import numpy as np

from env.tasks.routerdc import data_dir

MULTIPLE_CHOICE = {"mmlu", "cmmlu", "arc_challenge"}
FAMILIES = [("mmlu_train", "mmlu_test", "mmlu"), ("gsm8k-train", "gsm8k-test", "gsm8k"),
            ("cmmlu_train", "cmmlu_test", "cmmlu"), ("arc_challenge_train", "arc_challenge_test", "arc_challenge"),
            ("humaneval_train", "humaneval_test", "humaneval")]
DATA = data_dir() / "routerdc"


def grades(stem: str, family: str) -> np.ndarray:
    records = json.loads((DATA / f"{stem}.json").read_text(encoding="utf-8"))
    scores = np.array([list(r["scores"].values()) for r in records])
    return (scores > 0).astype(float) if family in MULTIPLE_CHOICE else scores


chosen_on_train = []
for train, test, family in FAMILIES:
    train_grades, test_grades = grades(train, family), grades(test, family)
    advantage = np.maximum(train_grades - train_grades.mean(1, keepdims=True), 0)
    for name, weights in [("grade", train_grades), ("advantage", advantage)]:
        optimum = np.sort(weights.mean(0))[::-1]
        print(family, name, "lead", round(float(np.log(optimum[0] / optimum[1])), 3))
    chosen_on_train.append(test_grades[:, train_grades.mean(0).argmax()].mean())
print("family routing chosen on the train files", round(100 * float(np.mean(chosen_on_train)), 2))
