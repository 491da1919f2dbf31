"""The RouterDC train/test file pairs and their recorded scores, shared by the scripts that probe routing signal.

Scores are returned as recorded (one column per worker, in the file's order); how a multiple-choice score is read as
a grade is docs/decisions/007-routerdc-score-reading.md's business, not these probes'.
"""

import json

import numpy as np

from env.tasks.routerdc import data_dir

FAMILIES = [("mmlu_train", "mmlu_test"), ("gsm8k-train", "gsm8k-test"), ("cmmlu_train", "cmmlu_test"),
            ("arc_challenge_train", "arc_challenge_test"), ("humaneval_train", "humaneval_test")]  # fmt: skip


def records(name: str) -> list[dict]:
    """The records of one RouterDC file, found through the data lookup."""
    return json.loads((data_dir() / "routerdc" / f"{name}.json").read_text(encoding="utf-8"))


def scores(file_records: list[dict]) -> np.ndarray:
    """`[questions, workers]` recorded scores, workers in the order of the first record."""
    workers = list(file_records[0]["scores"])
    return np.array([[record["scores"][worker] for worker in workers] for record in file_records])
