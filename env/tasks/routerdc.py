"""Questions of the replay world: RouterDC's recorded outcomes of seven open 7B models (docs/design.md section 5).

The files hold no gold answers, only `{"question", "scores": {model: score}}` per record. So a task's gold is an
opaque token `routerdc:<stem>:<index>`: the replay worker writes it inside <answer> tags when its recorded outcome
says the model was right, and `grade_exact` scores that as correct.

A score means one of two things, by task family (RouterDC's `convert_dataset_7_model.ipynb`, which wrote the files):
- generated answers (GSM8K, HumanEval, MBPP, JavaScript, MATH prealgebra): the fraction of the model's sampled answers
  that were right, which is the probability that one answer is right;
- multiple choice (MMLU, CMMLU, ARC, C-Eval): the model's normalised probability of the right option *when
  lm-evaluation-harness graded its answer right*, and 0 when it graded it wrong. The answer is right exactly when the
  score is positive; the value is the model's confidence, not its chance of being right (a right answer given with
  probability 0.3 on its option is recorded as 0.3). RouterDC's own evaluation counts any positive score as correct.
`metadata["scores"]` holds the probability that the model's answer is right in both cases.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from env.tasks.answers import ANSWER_INSTRUCTION, CODE_INSTRUCTION
from env.tasks.base import Task
from env.tasks.graders import grade_exact

DATA_DIR_ENV = "CONDUCTOR_DATA_DIR"
CODE_FAMILIES = ("humaneval", "javascript", "mbpp")
MULTIPLE_CHOICE_FAMILIES = ("arc_challenge", "arc_easy", "ceval", "cmmlu", "mmlu")
_SPLIT_SUFFIX_RE = re.compile(r"[-_](?:test|train)$")


def data_dir() -> Path:
    """Root of the local data: `$CONDUCTOR_DATA_DIR`, else `../shared/data` next to the repository."""
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def family(stem: str) -> str:
    """The task family of a file: its stem, lower case, without a train/test suffix (`gsm8k-test` -> `gsm8k`)."""
    return _SPLIT_SUFFIX_RE.sub("", stem.lower())


def probability_right(domain: str, score: float) -> float:
    """The probability that a model's answer is right, from its recorded score on a question of this family."""
    return float(score > 0) if domain in MULTIPLE_CHOICE_FAMILIES else float(score)


def load_routerdc(stem: str, path: str | os.PathLike | None = None) -> list[Task]:
    """Tasks of `<path or data_dir()/routerdc>/<stem>.json`; `path` may also name the file itself."""
    location = Path(path) if path is not None else data_dir() / "routerdc"
    file = location if location.is_file() else location / f"{stem}.json"
    if not file.is_file():
        available = sorted(p.stem for p in location.glob("*.json")) if location.is_dir() else []
        raise FileNotFoundError(f"no RouterDC file {file}; available stems: {', '.join(available) or 'none'}")
    records = json.loads(file.read_text(encoding="utf-8"))
    if not isinstance(records, list):
        raise ValueError(f"{file} must hold a JSON list of records, got {type(records).__name__}")
    domain = family(stem)
    instruction = CODE_INSTRUCTION if domain in CODE_FAMILIES else ANSWER_INSTRUCTION
    tasks = []
    for index, record in enumerate(records):
        if not isinstance(record, dict) or "question" not in record or not isinstance(record.get("scores"), dict):
            raise ValueError(f"{file} record {index} lacks a question or a scores mapping")
        tasks.append(
            Task(
                id=f"routerdc/{stem}/{index}",
                domain=domain,
                question=f"{record['question'].strip()}\n\n{instruction}",
                gold=f"routerdc:{stem}:{index}",
                grader=grade_exact,
                metadata={
                    "scores": {name: probability_right(domain, score) for name, score in record["scores"].items()}
                },
            )
        )
    return tasks
