"""Task loaders (HF schemas, HumanEval, RouterDC, synthetic), reference/wrong responses and parallel grading."""

from __future__ import annotations

import base64
import json
import pickle
import random
import re
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pyarrow
import pyarrow.parquet
import pytest

from env import tasks as task_sets
from env.tasks import extract_answer, grade_many, load, reference_response, wrong_response
from env.tasks.base import Task
from env.tasks.code import CodeTests
from env.tasks.routerdc import DATA_DIR_ENV, data_dir, file_task_label
from env.tasks.synthetic import TASK_LABELS


def routerdc_dir() -> Path:
    """The RouterDC files, looked up (and fetched where no copy is found) by the tests that read them, not when this
    module is collected."""
    return data_dir() / "routerdc"


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def write_parquet(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(records), path)
    return path


def assert_reference_and_wrong_responses_grade_one_and_zero(tasks: list[Task], seed: int = 0) -> None:
    rng = random.Random(seed)
    references = [reference_response(task) for task in tasks]
    wrongs = [wrong_response(task, rng) for task in tasks]
    assert grade_many(tasks, references, max_workers=4) == [1.0] * len(tasks)
    assert grade_many(tasks, wrongs, max_workers=4) == [0.0] * len(tasks)


MATH500 = [
    {"problem": "What is $1+1$?", "solution": "It is $\\boxed{2}$.", "answer": "2", "subject": "Prealgebra",
     "level": 1, "unique_id": "test/prealgebra/1.json"},
    {"problem": "Convert $(0,3)$ to polar coordinates.", "solution": "...",
     "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2,
     "unique_id": "test/precalculus/807.json"},
    {"problem": "Simplify $\\frac{14}{6}$.", "solution": "...", "answer": "\\frac{7}{3}", "subject": "Algebra",
     "level": 1, "unique_id": "test/algebra/5.json"},
]
MMLU = [
    {"question": "What is the capital of France?", "subject": "geography",
     "choices": ["Berlin", "Paris", "Rome", "Madrid"], "answer": 1},
    {"question": "2 + 2 = ?", "subject": "elementary_mathematics", "choices": ["3", "4", "5", "22"], "answer": 1},
    {"question": "Which is a prime?", "subject": "elementary_mathematics", "choices": ["4", "6", "8", "7"],
     "answer": 3},
]
GPQA = [
    {"Question": f"Question {k}?", "Correct Answer": f"right {k}", "Incorrect Answer 1": f"wrong a{k}",
     "Incorrect Answer 2": f"wrong b{k}", "Incorrect Answer 3": f"wrong c{k}", "Record ID": f"rec{k}",
     "Subdomain": "Physics"}
    for k in range(12)
]
RLPR = [
    {"data_source": "WebInstruct-verified", "ability": "physics",
     "prompt": [{"role": "system", "content": "Think, then answer."},
                {"role": "user", "content": "A car travels 100 m in 8 s. Average speed in m/s?"}],
     "reward_model": {"ground_truth": "12.5", "style": "rule"}, "extra_info": {"index": 0}},
    {"data_source": "WebInstruct-verified", "ability": "economics",
     "prompt": [{"role": "user", "content": "Price rose from 80 to 100. By what percent?"}],
     "reward_model": {"ground_truth": "25%", "style": "rule"}, "extra_info": {"index": 1}},
    {"data_source": "WebInstruct-verified", "ability": "biology",
     "prompt": [{"role": "user", "content": "Which organelle makes ATP?"}],
     "reward_model": {"ground_truth": "Mitochondria", "style": "rule"}, "extra_info": {"index": 2}},
]
AIME = [
    {"id": 60, "problem": "Find the remainder when $2^{10}$ is divided by $1000$.", "solution": "...",
     "answer": "24", "url": "https://example.org", "year": "2024"},
    {"id": 61, "problem": "Find $7 \\times 11 \\times 13$.", "solution": "...", "answer": "1001",
     "url": "https://example.org", "year": "2024"},
]


def encode_private(cases: list[dict]) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode("ascii")


LIVECODEBENCH = [
    {
        "question_title": "Sum", "question_content": "Read n and n integers; print their sum.",
        "platform": "atcoder", "question_id": "abc001_a", "contest_id": "abc001", "contest_date": "2024-01-01",
        "starter_code": "", "difficulty": "easy",
        "public_test_cases": json.dumps([{"input": "3\n1 2 3\n", "output": "6\n", "testtype": "stdin"}]),
        "private_test_cases": encode_private([{"input": "2\n5 5\n", "output": "10\n", "testtype": "stdin"}]),
        "metadata": "{}",
    },
    {
        "question_title": "Max", "question_content": "Return the maximum of nums.",
        "platform": "leetcode", "question_id": "3000", "contest_id": "weekly-1", "contest_date": "2024-01-02",
        "starter_code": "class Solution:\n    def maxOf(self, nums: List[int]) -> int:\n        ",
        "difficulty": "easy",
        "public_test_cases": json.dumps([{"input": "[1, 5, 2]", "output": "5", "testtype": "functional"}]),
        "private_test_cases": encode_private([{"input": "[-3, -1]", "output": "-1", "testtype": "functional"}]),
        "metadata": json.dumps({"func_name": "maxOf"}),
    },
]
LCB_SOLUTIONS = {
    "livecodebench/abc001_a": "input()\nprint(sum(map(int, input().split())))",
    "livecodebench/3000": "class Solution:\n    def maxOf(self, nums):\n        return max(nums)",
}


# ------------------------------------------------------------------------------------------ file-based loaders


def test_math500_from_jsonl_in_hf_schema(tmp_path):
    tasks = load("math500", path=write_jsonl(tmp_path / "test.jsonl", MATH500))
    assert [task.id for task in tasks] == [f"math500/{record['unique_id']}" for record in MATH500]
    assert tasks[1].gold == MATH500[1]["answer"] and tasks[1].metadata["subject"] == "Precalculus"
    assert tasks[0].question.startswith("What is $1+1$?") and "<answer>" in tasks[0].question
    assert tasks[1].grade("<answer>(3, \\frac{\\pi}{2})</answer>") == 1.0
    assert_reference_and_wrong_responses_grade_one_and_zero(tasks)


def test_directory_path_picks_the_split_files_in_order(tmp_path):
    write_parquet(tmp_path / "math500" / "test-00000-of-00002.parquet", MATH500[:2])
    write_parquet(tmp_path / "math500" / "test-00001-of-00002.parquet", MATH500[2:])
    write_jsonl(tmp_path / "math500" / "train.jsonl", MATH500[:1])
    assert [task.gold for task in load("math500", path=tmp_path / "math500")] == [r["answer"] for r in MATH500]
    assert len(load("math500", path=tmp_path / "math500", split="train")) == 1
    with pytest.raises(FileNotFoundError, match="'validation'"):
        load("math500", path=tmp_path / "math500", split="validation")


def test_default_path_is_the_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    write_jsonl(tmp_path / "aime" / "test.jsonl", AIME)
    tasks = load("aime")
    assert [task.gold for task in tasks] == ["24", "1001"] and tasks[0].id == "aime/60"
    assert_reference_and_wrong_responses_grade_one_and_zero(tasks)
    with pytest.raises(FileNotFoundError, match="no data file or directory"):
        load("mmlu")


def test_mmlu_from_parquet_uses_letters(tmp_path):
    tasks = load("mmlu", path=write_parquet(tmp_path / "test.parquet", MMLU))
    assert [task.gold for task in tasks] == ["B", "B", "D"]
    assert "A. Berlin\nB. Paris\nC. Rome\nD. Madrid" in tasks[0].question
    assert tasks[0].task_label == "mmlu" and tasks[0].metadata["subject"] == "geography"
    assert_reference_and_wrong_responses_grade_one_and_zero(tasks)


def test_gpqa_places_the_correct_answer_at_its_gold_letter_reproducibly(tmp_path):
    path = write_jsonl(tmp_path / "gpqa_diamond.jsonl", GPQA)
    tasks = load("gpqa", path=path)
    for k, task in enumerate(tasks):
        assert f"{task.gold}. right {k}\n" in task.question
    assert len({task.gold for task in tasks}) > 1
    assert [task.gold for task in load("gpqa", path=path)] == [task.gold for task in tasks]
    assert [task.gold for task in load("gpqa", path=path, seed=1)] != [task.gold for task in tasks]
    assert_reference_and_wrong_responses_grade_one_and_zero(tasks)


def test_rlpr_reads_the_user_message_and_ground_truth(tmp_path):
    tasks = load("rlpr", path=write_parquet(tmp_path / "test.parquet", RLPR))
    assert tasks[0].question.startswith("A car travels 100 m") and "Think, then answer" not in tasks[0].question
    assert [task.gold for task in tasks] == ["12.5", "25%", "Mitochondria"]
    assert tasks[1].grade("<answer>0.25</answer>") == 1.0
    assert tasks[2].grade("<answer>the mitochondria</answer>") == 1.0
    assert_reference_and_wrong_responses_grade_one_and_zero(tasks)


def test_livecodebench_decodes_private_tests_and_detects_functional_problems(tmp_path):
    tasks = load("livecodebench", path=write_jsonl(tmp_path / "test.jsonl", LIVECODEBENCH))
    stdin_task, functional_task = tasks
    assert stdin_task.gold.kind == "stdin" and stdin_task.gold.cases == (("3\n1 2 3\n", "6\n"), ("2\n5 5\n", "10\n"))
    assert functional_task.gold.kind == "functional" and functional_task.gold.entry_point == "maxOf"
    assert functional_task.gold.cases == (("[1, 5, 2]", "5"), ("[-3, -1]", "-1"))
    assert "def maxOf" in functional_task.question
    for task in tasks:
        assert task.grade(f"<answer>\n```python\n{LCB_SOLUTIONS[task.id]}\n```\n</answer>") == 1.0
        assert task.grade(wrong_response(task, random.Random(0))) == 0.0
        with pytest.raises(ValueError, match="no reference solution"):
            reference_response(task)


def test_livecodebench_refuses_pickles_that_would_run_code(tmp_path):
    record = dict(LIVECODEBENCH[0])
    record["private_test_cases"] = base64.b64encode(zlib.compress(pickle.dumps(Path("/etc")))).decode("ascii")
    with pytest.raises(pickle.UnpicklingError, match="refusing to load"):
        load("livecodebench", path=write_jsonl(tmp_path / "test.jsonl", [record]))


# --------------------------------------------------------------------------------------------------- HumanEval


def test_humaneval_ships_164_problems_with_reference_solutions():
    tasks = load("humaneval")
    assert len(tasks) == 164 and tasks[0].id == "HumanEval/0" and tasks[0].task_label == "humaneval"
    assert all(isinstance(task.gold, CodeTests) and task.gold.kind == "humaneval" for task in tasks)
    assert tasks[0].gold.prompt in tasks[0].question


def test_humaneval_sample_reference_passes_and_wrong_fails():
    assert_reference_and_wrong_responses_grade_one_and_zero(load("humaneval", limit=6, seed=3))


@pytest.mark.slow
def test_all_164_humaneval_canonical_solutions_pass_and_none_bodies_fail():
    tasks = load("humaneval")
    rng = random.Random(0)
    canonical = grade_many(tasks, [reference_response(task) for task in tasks], max_workers=8)
    broken = grade_many(tasks, [wrong_response(task, rng) for task in tasks], max_workers=8)
    assert [task.id for task, score in zip(tasks, canonical) if score != 1.0] == []
    assert [task.id for task, score in zip(tasks, broken) if score != 0.0] == []
    for task in tasks[:3]:
        assert wrong_response(task, rng).count("return None") == 1


# ------------------------------------------------------------------------------------------------------ RouterDC


def test_routerdc_tasks_carry_opaque_gold_and_the_recorded_outcomes():
    records = json.loads((routerdc_dir() / "gsm8k-test.json").read_text())
    tasks = load("routerdc/gsm8k-test")
    assert len(tasks) == len(records) == 1319
    for index in (0, 654, 1318):
        task = tasks[index]
        assert task.id == f"routerdc/gsm8k-test/{index}" and task.gold == f"routerdc:gsm8k-test:{index}"
        assert task.task_label == "gsm8k"
        assert task.metadata["scores"] == records[index]["scores"]
        assert task.question.startswith(records[index]["question"].strip())
    assert_reference_and_wrong_responses_grade_one_and_zero(tasks[:50])


def test_a_multiple_choice_score_is_read_as_right_or_wrong_not_as_a_probability():
    records = json.loads((routerdc_dir() / "mmlu_test.json").read_text())
    tasks = load("routerdc/mmlu_test")
    assert len(tasks) == len(records) == 4213
    for task, record in zip(tasks, records):
        assert task.metadata["scores"] == {model: float(score > 0) for model, score in record["scores"].items()}
    low_confidence = [(t, r) for t, r in zip(tasks, records) if 0 < r["scores"]["mistralai/Mistral-7B-v0.1"] < 0.4]
    assert low_confidence and all(t.metadata["scores"]["mistralai/Mistral-7B-v0.1"] == 1.0 for t, _ in low_confidence)
    accuracy = np.mean([t.metadata["scores"]["meta-llama/Meta-Llama-3-8B"] for t in tasks])
    assert accuracy == pytest.approx(2721 / 4213)  # 64.59%; the mean recorded score is 49.45%


@pytest.mark.parametrize("stem", ["mmlu_test", "cmmlu_train", "ceval"])
def test_four_option_files_record_a_positive_score_only_for_an_option_ranked_first(stem):
    """Why the reading above holds: a recorded score is the right option's probability among 4 when the model's
    answer was right, so it is never under 1/4; a fraction of sampled answers would be."""
    records = json.loads((routerdc_dir() / f"{stem}.json").read_text())
    scores = np.array([s for r in records for s in r["scores"].values()])
    assert scores[scores > 0].min() >= 0.25 - 1e-9
    assert 0.3 < np.mean(scores > 0) < 0.7


@pytest.mark.parametrize("stem", ["gsm8k-train", "humaneval_test", "mbpp"])
def test_generated_answer_files_record_the_fraction_of_ten_sampled_answers_that_were_right(stem):
    records = json.loads((routerdc_dir() / f"{stem}.json").read_text())
    scores = np.array([s for r in records for s in r["scores"].values()])
    assert np.allclose(scores * 10, np.round(scores * 10))
    assert np.mean((scores > 0) & (scores < 1)) > 0.2


def test_routerdc_families_drop_the_split_suffix():
    assert {file_task_label(path.stem) for path in routerdc_dir().glob("*.json")} == {
        "arc_challenge", "arc_easy", "ceval", "cmmlu", "gsm8k", "humaneval", "javascript", "math_prealgebra",
        "mbpp", "mmlu",
    }
    assert load("routerdc/gsm8k-test", limit=1)[0].task_label == "gsm8k"


def test_routerdc_path_and_errors(tmp_path, monkeypatch):
    records = [{"question": "Q0", "scores": {"m1": 1.0, "m2": 0}}, {"question": "Q1", "scores": {"m1": 0.5}}]
    (tmp_path / "routerdc").mkdir()
    (tmp_path / "routerdc" / "tiny_test.json").write_text(json.dumps(records))
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    tasks = load("routerdc/tiny_test")
    assert [task.metadata["scores"] for task in tasks] == [{"m1": 1.0, "m2": 0.0}, {"m1": 0.5}]
    assert tasks[0].task_label == "tiny"
    with pytest.raises(FileNotFoundError, match="available stems: tiny_test"):
        load("routerdc/missing")
    with pytest.raises(ValueError, match="one split each"):
        load("routerdc/tiny_test", split="test")
    (tmp_path / "routerdc" / "bad.json").write_text(json.dumps([{"question": "Q"}]))
    with pytest.raises(ValueError, match="record 0 lacks"):
        load("routerdc/bad")
    multiple_choice = [{"question": "Q", "scores": {"m1": 0.3, "m2": 0}}]
    (tmp_path / "routerdc" / "mmlu_test.json").write_text(json.dumps(multiple_choice))
    assert load("routerdc/mmlu_test")[0].metadata["scores"] == {"m1": 1.0, "m2": 0.0}


# ----------------------------------------------------------------------------------------------------- synthetic


def test_synthetic_is_deterministic_balanced_and_seeded():
    tasks = load("synthetic", limit=200, seed=7)
    assert [(t.question, t.gold) for t in tasks] == [(t.question, t.gold) for t in load("synthetic", limit=200, seed=7)]
    assert [t.gold for t in tasks] != [t.gold for t in load("synthetic", limit=200, seed=8)]
    assert {task_label: sum(t.task_label == task_label for t in tasks) for task_label in TASK_LABELS} == {d: 50 for d in TASK_LABELS}
    assert len(load("synthetic")) == 1000
    assert len({t.id for t in tasks}) == 200


def _solve_synthetic(task: Task) -> str:
    """An independent solver for each synthetic task, from the question text alone."""
    question = task.question.split("\n")[0]
    if task.task_label == "arithmetic":
        a, first, b, second, c = re.fullmatch(r"Compute \((-?\d+) ([-+]) (\d+)\) ([-+*]) (\d+)\.", question).groups()
        inner = int(a) + int(b) if first == "+" else int(a) - int(b)
        return str({"+": inner + int(c), "-": inner - int(c), "*": inner * int(c)}[second])
    if task.task_label == "algebra":
        a, sign, b, rhs = re.fullmatch(r"Solve for x: (-?\d+)x ([-+]) (\d+) = (-?\d+)\.", question).groups()
        offset = int(b) if sign == "+" else -int(b)
        return str(next(x for x in range(-100, 101) if int(a) * x + offset == int(rhs)))
    if task.task_label == "logic":
        pairs = re.findall(r"(\w+) is \w+er than (\w+)\.", question)
        above = {winner for winner, _ in pairs}
        below = {loser for _, loser in pairs}
        most = question.split("Who is the ")[1].split("?")[0]
        return (above - below).pop() if most in ("tallest", "oldest", "fastest") else (below - above).pop()
    days = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
    months = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
              "November", "December"]
    if question.startswith("If today is"):
        pattern = r"If today is (\w+), what day of the week will it be in (\d+) days\?"
        start, offset = re.fullmatch(pattern, question).groups()
        return days[(days.index(start) + int(offset)) % 7]
    offset, start = re.fullmatch(r"Which month is (\d+) months after (\w+)\?", question).groups()
    return months[(months.index(start) + int(offset)) % 12]


def test_synthetic_gold_answers_are_correct_and_graded_by_the_normal_graders():
    tasks = load("synthetic", limit=400, seed=3)
    for task in tasks:
        assert _solve_synthetic(task) == task.gold, task.question
        assert task.grade(f"<answer>{_solve_synthetic(task)}</answer>") == 1.0
    assert tasks[2].grade(f"<answer>{tasks[2].gold.upper()}</answer>") == 1.0
    assert_reference_and_wrong_responses_grade_one_and_zero(tasks, seed=3)


# -------------------------------------------------------------------------------------- load(), subsets, pool


def test_limit_draws_a_seeded_subset_in_file_order():
    full = load("routerdc/gsm8k-test")
    subset = load("routerdc/gsm8k-test", limit=25, seed=4)
    positions = [full.index(task) for task in subset]
    assert len(subset) == 25 and positions == sorted(positions)
    assert subset == load("routerdc/gsm8k-test", limit=25, seed=4)
    assert subset != load("routerdc/gsm8k-test", limit=25, seed=5)
    assert load("routerdc/gsm8k-test", limit=10**6) == full
    with pytest.raises(ValueError, match="limit must be >= 0"):
        load("synthetic", limit=-1)


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match="unknown task set 'squad'; known: humaneval, math500"):
        load("squad")
    assert "routerdc/<file stem>" in task_sets.TASK_NAMES


def test_extract_answer_is_exported():
    assert extract_answer("x <answer> 7 </answer>") == "7"


def test_grade_many_matches_sequential_grading_with_bounded_concurrency():
    running, peak, lock = 0, 0, threading.Lock()

    def slow_grader(response: str, gold: str) -> float:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.02)
        with lock:
            running -= 1
        return float(response == gold)

    tasks = [Task(id=str(k), task_label="d", question="q", gold=str(k % 3), grader=slow_grader) for k in range(40)]
    responses = [str(k % 2) for k in range(40)]
    assert grade_many(tasks, responses, max_workers=3) == [task.grade(r) for task, r in zip(tasks, responses)]
    assert peak == 3
    with pytest.raises(ValueError, match="40 tasks but 39 responses"):
        grade_many(tasks, responses[:-1])
    with pytest.raises(ValueError, match="max_workers"):
        grade_many(tasks, responses, max_workers=0)
