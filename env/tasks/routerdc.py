"""Questions of the replay world: RouterDC's recorded outcomes of seven open 7B models (docs/design.md section 5).

The files hold no gold answers, only `{"question", "scores": {model: score}}` per record. So a task's gold is an
opaque token `routerdc:<stem>:<index>`: the replay worker writes it inside <answer> tags when its recorded outcome
says the model was right, and `grade_exact` scores that as correct.

A score means one of two things, by task (RouterDC's `convert_dataset_7_model.ipynb`, which wrote the files):
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
from env.tasks.data_files import DATA_DIR_ENV, RemoteDataset, RemoteFile, locate
from env.tasks.graders import grade_exact

__all__ = ["DATA_DIR_ENV", "ROUTERDC_FILES", "data_dir", "file_task_label", "load_routerdc", "probability_right"]

ROUTERDC_COMMIT = "0e63989c5bf4363330b8a4616386e3f7f116d9f8"
# The 16 files of datasets/split2_model7/ at ROUTERDC_COMMIT, with the sha256 and size of their blobs there.
ROUTERDC_FILES = RemoteDataset(
    name="routerdc",
    base_url=f"https://raw.githubusercontent.com/shuhao02/RouterDC/{ROUTERDC_COMMIT}/datasets/split2_model7",
    files=(
        RemoteFile("MATH_prealgebra.json", "3cb750eaa93bd9989babca64b22e92ad51b0b5c30f6ee11dc539fb949c9cf5be", 441513),
        RemoteFile(
            "arc_challenge_test.json", "7588fd22f8d7e9adb9ec6ff435a0d3612a56b3192dc3f9ace358c2468a10b1f3", 180874
        ),
        RemoteFile(
            "arc_challenge_train.json", "5ec50e9cd61caf0e3f116b48d00996a3d88ee52b3a0f04797cdfde8e21f8b610", 439134
        ),
        RemoteFile("arc_easy_test.json", "f8ba3041a394d865aeca8a5554c63f302649563f9cac9bbee8512b2d686269c7", 380217),
        RemoteFile("arc_easy_train.json", "25bc2be5a33afbdf950466ad34f388b6ede63e59d7139a916c0dd7be649ccfae", 888903),
        RemoteFile("ceval.json", "b2f8105774193d869fa78c53894aa4118391eaed6bb0810f03f5fec76fd82323", 1181875),
        RemoteFile("cmmlu_test.json", "10f175ac68f5163a9572d1d0e203415846264dceb9f56b444a654fff79e19843", 2764779),
        RemoteFile("cmmlu_train.json", "6cc4cdba7f5bf9ca6cbb303bac87efded70d3807c17ecbe54424a74d9410b11e", 1611405),
        RemoteFile("gsm8k-test.json", "237ccfe4a613a523e48ac92709ddc1a541674c332f9064899cce2cb1dafac3c9", 741554),
        RemoteFile("gsm8k-train.json", "63528cfd7b1860f03bae35e16d4964fe61d4abd3133386c92b22f433a4d4cd75", 557478),
        RemoteFile("humaneval_test.json", "3744fba4a7953206858f601e61b05c1551ca2fbcfac6b14b46fd19e8735f5f68", 42909),
        RemoteFile("humaneval_train.json", "c98f4160c135bfb2e6ee21bed16e23a8e5700148c3ea6f49092ce64c5a8d8de0", 87643),
        RemoteFile("javascript.json", "bfaad2257e7b0de6d4bd6c204e05e791998f8875bb157dde1aea39817c60376b", 124626),
        RemoteFile("mbpp.json", "17f2c23297234421e3e683ed5fc18d696cacb80a2d1e7a931ca12fcf52a2f9e7", 242373),
        RemoteFile("mmlu_test.json", "e560163c00f717a23da5781cf7b76a4050abed0cd75b2244df3fc23d46ea379b", 3578099),
        RemoteFile("mmlu_train.json", "f07315933421304572fde4a2751c131757a7a3913ad5dad302390d4ee00e5d7d", 1705188),
    ),
    source=f"GitHub shuhao02/RouterDC at commit {ROUTERDC_COMMIT}, datasets/split2_model7/",
)
CODE_FAMILIES = ("humaneval", "javascript", "mbpp")
MULTIPLE_CHOICE_FAMILIES = ("arc_challenge", "arc_easy", "ceval", "cmmlu", "mmlu")
_SPLIT_SUFFIX_RE = re.compile(r"[-_](?:test|train)$")


def data_dir(configured: str | os.PathLike | None = None) -> Path:
    """The data root holding `routerdc/`, by `env.tasks.data_files`' lookup order (`configured`, then
    `$CONDUCTOR_DATA_DIR`, the user cache, the team copy); where none holds it, the files are fetched into the cache
    first, with a progress bar on stderr."""
    return locate(ROUTERDC_FILES, configured).parent


def file_task_label(stem: str) -> str:
    """The task of a file: its stem, lower case, without a train/test suffix (`gsm8k-test` -> `gsm8k`)."""
    return _SPLIT_SUFFIX_RE.sub("", stem.lower())


def probability_right(task_label: str, score: float) -> float:
    """The probability that a model's answer is right, from its recorded score on a question of this task."""
    return float(score > 0) if task_label in MULTIPLE_CHOICE_FAMILIES else float(score)


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
    task_label = file_task_label(stem)
    instruction = CODE_INSTRUCTION if task_label in CODE_FAMILIES else ANSWER_INSTRUCTION
    tasks = []
    for index, record in enumerate(records):
        if not isinstance(record, dict) or "question" not in record or not isinstance(record.get("scores"), dict):
            raise ValueError(f"{file} record {index} lacks a question or a scores mapping")
        tasks.append(
            Task(
                id=f"routerdc/{stem}/{index}",
                task_label=task_label,
                question=f"{record['question'].strip()}\n\n{instruction}",
                gold=f"routerdc:{stem}:{index}",
                grader=grade_exact,
                metadata={
                    "scores": {name: probability_right(task_label, score) for name, score in record["scores"].items()}
                },
            )
        )
    return tasks
