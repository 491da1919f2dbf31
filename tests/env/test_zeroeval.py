"""The zeroeval world's records: ZeroEval's answer reading and grading rules, the loader and split, the recorded
worker's text, tokens and cost, and, on the team's copy, the published accuracy table reproduced."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from env.tasks import data_files
from env.tasks import zeroeval as z
from env.workers.api import Price
from env.workers.base import WorkerError
from env.workers.recorded import ZEROEVAL_PRICES, RecordedWorker, count_tokens, recorded_text

TEAM = data_files.team_root() / "zeroeval"


def output(answer: str, reasoning: str = "r") -> str:
    return f'```json\n{{\n    "reasoning": "{reasoning}",\n    "answer": {answer}\n}}\n```'


def test_the_answer_is_read_as_zeroeval_reads_it():
    assert z.zeroeval_answer(output('"18"'), "gpt-4o") == "18"
    assert z.zeroeval_answer(output("[1, 2]"), "gpt-4o") == "[1, 2]"  # a JSON value, written back by str
    assert z.zeroeval_answer(output("true"), "gpt-4o") == "True"
    # Not JSON (\s is no JSON escape): the first quoted "answer" by pattern, backslash kept. (\f is one: a form feed.)
    assert z.zeroeval_answer('{"reasoning": "x", "answer": "\\sqrt{2}"}', "gpt-4o") == "\\sqrt{2}"
    assert z.zeroeval_answer('{"reasoning": "x", "answer": "\\frac{1}{2}"}', "gpt-4o") == "\frac{1}{2}"
    assert z.zeroeval_answer('{"reasoning": "x", "answer": 42, }', "gpt-4o") == "42"  # unquoted value
    assert z.zeroeval_answer("so answer: 7, done", "gpt-4o") == "7"  # unquoted key
    # The first balanced object decides even when a later one would parse.
    assert z.zeroeval_answer('{"note": 1} then {"answer": "9"}', "gpt-4o") == "9"
    boxed = "The result is $\\boxed{36}$."
    assert z.zeroeval_answer(boxed, "Meta-Llama-3.1-8B-Instruct") == "36"
    assert z.zeroeval_answer(boxed, "gpt-4o") is None  # the boxed fallback is Llama-3.1's only
    assert z.zeroeval_answer("I cannot decide.", "gpt-4o") is None


def test_zeroeval_rules_compare_first_numbers_for_math_and_strings_for_crux():
    assert z.zeroeval_grade("gsm", "6 miles per hour", "6")
    assert z.zeroeval_grade("gsm", "$1,200", "1200")
    assert z.zeroeval_grade("math-l5", "1/2", "0.5")
    assert z.zeroeval_grade("math-l5", "\\frac{3}{5}", "\\frac{3}{4}")  # ZeroEval's first-number leniency
    assert not z.zeroeval_grade("gsm", "7", "8")
    assert not z.zeroeval_grade("gsm", None, "8")
    assert not z.zeroeval_grade("gsm", "none", "8")
    assert z.zeroeval_grade("crux", "'abc'", "'abc'")
    assert z.zeroeval_grade("crux", "' a b '", "' a b '")
    assert z.zeroeval_grade("crux", "a\nb", "'a\\nb'")  # a newline is compared as \n
    assert not z.zeroeval_grade("crux", "'abc '", "'abc'")


def test_the_recorded_text_carries_the_answer_the_project_graders_read():
    record = z.Record("prompt", output('"  4 2 "'))
    text = recorded_text(record, "gpt-4o", "crux")
    assert text.startswith(record.output) and text.endswith('<answer>"  4 2 "</answer>')
    assert z.grade_crux(text, "'  4 2 '") == 1.0  # the spaces inside the string survive the tag's reader
    assert z.grade_crux(text, "'4 2'") == 0.0
    assert recorded_text(z.Record("p", "no json"), "gpt-4o", "gsm") == "no json"


def write_fake(root, questions=("Q0", "Q1", "Q2", "Q3")):
    """A data root holding zeroeval/gsm with two models; the second lacks question 1."""
    folder = root / "zeroeval" / "gsm"
    folder.mkdir(parents=True)
    for model, skip in (("o1-mini-2024-09-12", None), ("gemma-2-9b-it", 1)):
        rows = [
            {"id": f"gsm8k-main-test-#{i}", "question": q, "answer": f"# {i}", "chat_history": [f"ask {q}"],
             "output": [output(f'"{i if model == "o1-mini-2024-09-12" else 0}"')]}
            for i, q in enumerate(questions) if i != skip
        ]
        (folder / f"{model}.json").write_text(json.dumps(rows))
    return root / "zeroeval"


def test_the_loader_keys_records_by_question_and_grades_with_the_math_grader(tmp_path):
    directory = write_fake(tmp_path)
    models = ("o1-mini-2024-09-12", "gemma-2-9b-it")
    tasks = z.load_zeroeval("gsm", directory, models=models)
    assert [t.id for t in tasks] == [f"zeroeval/gsm/{i}" for i in range(4)]
    assert [t.gold for t in tasks] == ["0", "1", "2", "3"]
    assert tasks[1].question.startswith("Q1\n\n") and "<answer>" in tasks[1].question
    assert set(tasks[1].metadata["records"]) == {"o1-mini-2024-09-12"}
    o1, gemma = (RecordedWorker(m, ZEROEVAL_PRICES[m], tokenizer="chars/4") for m in models)
    assert [t.grade(o1.reply(t).text) for t in tasks] == [1.0] * 4
    assert [t.grade(gemma.reply(t).text) for t in tasks if t.id != "zeroeval/gsm/1"] == [1.0, 0.0, 0.0]
    with pytest.raises(WorkerError, match="no recorded output for zeroeval/gsm/1"):
        gemma.reply(tasks[1])
    with pytest.raises(ValueError, match="unknown zeroeval task"):
        z.load_zeroeval("mmlu", directory)
    with pytest.raises(FileNotFoundError, match="launch.data fetch zeroeval"):
        z.load_zeroeval("crux", directory, models=models)


def test_the_split_is_a_fixed_half_per_task():
    test, train = z.split_indices("gsm", 1319, "test"), z.split_indices("gsm", 1319, "train")
    assert len(test) == 659 and len(train) == 660 and sorted(test + train) == list(range(1319))
    assert z.split_indices("gsm", 1319, "test") == test  # a function of (seed, task, count) only
    assert z.split_indices("gsm", 1319, "test", seed=1) != test
    assert z.split_indices("crux", 1319, "test") != test
    assert z.split_indices("gsm", 5, "all") == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="train, test or all"):
        z.split_indices("gsm", 5, "dev")


def test_tokens_and_cost_of_a_recorded_call(tmp_path):
    tasks = z.load_zeroeval("gsm", write_fake(tmp_path), models=("o1-mini-2024-09-12",))
    record = tasks[0].metadata["records"]["o1-mini-2024-09-12"]
    price = Price(3.0, 12.0)
    plain = RecordedWorker("o1-mini-2024-09-12", price, tokenizer="chars/4").reply(tasks[0])
    assert (plain.prompt_tokens, plain.completion_tokens) == (2, math.ceil(len(record.output) / 4))
    assert plain.cost_usd == pytest.approx((2 * 3.0 + plain.completion_tokens * 12.0) / 1e6)
    hidden = RecordedWorker("o1-mini-2024-09-12", price, tokenizer="chars/4", output_factor=5).reply(tasks[0])
    assert hidden.completion_tokens == 5 * plain.completion_tokens and hidden.prompt_tokens == 2
    reply = asyncio.run(RecordedWorker("o1-mini-2024-09-12", price).complete(
        [{"role": "user", "content": "anything"}], max_tokens=1, temperature=0.0, seed=0, task=tasks[0]))
    assert reply.prompt_tokens == count_tokens("ask Q0", "cl100k_base") == 3  # "ask", " Q", "0"
    with pytest.raises(ValueError, match="output_factor"):
        RecordedWorker("o1-mini-2024-09-12", price, output_factor=0.5)
    with pytest.raises(ValueError, match="unknown tokenizer"):
        RecordedWorker("o1-mini-2024-09-12", price, tokenizer="words")


def test_cl100k_base_counts_known_strings():
    assert count_tokens("hello world", "cl100k_base") == 2
    assert count_tokens("<|endoftext|>", "cl100k_base") > 1  # special tokens in a record are plain text
    assert count_tokens("", "cl100k_base") == 0 and count_tokens("abcde", "chars/4") == 2


def test_the_manifest_names_the_51_files_at_the_pinned_commit():
    files = z.ZEROEVAL_FILES.files
    assert len(files) == 51 and sum(f.name.endswith(".summary.json") for f in files) == 3
    assert {f.name.split("/")[0] for f in files if "/" in f.name} == set(z.ZEROEVAL_TASKS)
    assert {f.name for f in files} >= {f"{t}/{m}.json" for t in z.ZEROEVAL_TASKS for m in z.ZEROEVAL_MODELS}
    llama = next(f for f in files if f.name == "gsm/Meta-Llama-3.1-405B-Instruct@hyperbolic.json")
    assert z.ZEROEVAL_FILES.url(llama) == (
        "https://raw.githubusercontent.com/WildEval/ZeroEval/8c1485edf12c6efb5f69135a562927c5ad484059/result_dirs/"
        "gsm/Meta-Llama-3.1-405B-Instruct%40hyperbolic.json"
    )
    assert set(ZEROEVAL_PRICES) == set(z.ZEROEVAL_MODELS)


@pytest.mark.skipif(not TEAM.is_dir(), reason="no team copy of the zeroeval files on this machine")
def test_the_team_copy_passes_the_pins():
    assert data_files.verify(z.ZEROEVAL_FILES, TEAM) == {f.name: "ok" for f in z.ZEROEVAL_FILES.files}


@pytest.mark.skipif(not TEAM.is_dir(), reason="no team copy of the zeroeval files on this machine")
@pytest.mark.parametrize("task", z.ZEROEVAL_TASKS)
def test_zeroevals_rule_reproduces_every_published_accuracy(task):
    questions, records = z.load_records(task, TEAM)
    published = z.published_accuracy(task, TEAM)
    assert set(published) == set(z.ZEROEVAL_MODELS)
    for model in z.ZEROEVAL_MODELS:
        answered = [(q, records[model][q["id"]]) for q in questions if q["id"] in records[model]]
        right = sum(z.zeroeval_grade(task, z.zeroeval_answer(r.output, model), z.gold_answer(task, q))
                    for q, r in answered)
        # ZeroEval's percentage over the questions its file holds, printed to 2 decimals (59.125 as 59.13)
        assert abs(100 * right / len(answered) - published[model]) <= 0.005 + 1e-9, (task, model)


@pytest.mark.skipif(not TEAM.is_dir(), reason="no team copy of the zeroeval files on this machine")
def test_the_project_graders_give_zeroevals_crux_table_and_its_gsm8k_table_but_unit_answers():
    """CRUXEval: graded by ZeroEval's rule, every model's published figure. GSM8K: the project's math grader refuses
    answers with units ("2:00 pm" for 2, "10 miles per hour" for 10) that ZeroEval's first-number rule accepts."""
    crux = z.load_zeroeval("crux", TEAM)
    published = z.published_accuracy("crux", TEAM)
    for model in z.ZEROEVAL_MODELS:
        worker = RecordedWorker(model, ZEROEVAL_PRICES[model], tokenizer="chars/4")
        right = sum(t.grade(worker.reply(t).text) for t in crux)
        assert abs(100 * right / len(crux) - published[model]) <= 0.005 + 1e-9, model
    gsm = z.load_zeroeval("gsm", TEAM, models=("gpt-4o-2024-08-06",))
    worker = RecordedWorker("gpt-4o-2024-08-06", ZEROEVAL_PRICES["gpt-4o-2024-08-06"], tokenizer="chars/4")
    wrong = [t for t in gsm if t.grade(worker.reply(t).text) == 0.0]
    right_by_rule = [t for t in wrong if z.zeroeval_grade(
        "gsm", z.zeroeval_answer(t.metadata["records"]["gpt-4o-2024-08-06"].output, "gpt-4o"), t.gold)]
    assert len(gsm) - len(wrong) == round(0.9621 * 1319) - 1
    assert [z.zeroeval_answer(t.metadata["records"]["gpt-4o-2024-08-06"].output, "gpt-4o")
            for t in right_by_rule] == ["2:00 pm"]


def test_the_zeroeval_world_replays_each_model_through_the_conductor_env(tmp_path):
    from env.gym_env import ConductorEnv, EnvConfig
    from env.workflow import Step, Workflow, render_workflow
    from env.worlds import ZeroEvalWorldConfig, build_world

    directory = write_fake(tmp_path, questions=tuple(f"Q{i}" for i in range(8)))
    config = ZeroEvalWorldConfig(tasks=("gsm",), split="test", data_dir=str(directory), tokenizer="chars/4",
                                 models=("o1-mini-2024-09-12", "gemma-2-9b-it"), o1_mini_output_factor=2.0)
    world = build_world(config)
    assert [w.name for w in world.pool] == ["o1-mini-2024-09-12", "gemma-2-9b-it"]
    assert [t.id for t in world.tasks] == [f"zeroeval/gsm/{i}" for i in z.split_indices("gsm", 8, "test")]
    env = ConductorEnv(world, EnvConfig())
    scored = env.score_batch_sync(world.tasks, [render_workflow(Workflow(steps=(Step(0, "Solve."),)))] * 4)
    env.close()
    record = world.tasks[0].metadata["records"]["o1-mini-2024-09-12"]
    expected_cost = (math.ceil(len(record.prompt) / 4) * 3.0 + 2 * math.ceil(len(record.output) / 4) * 12.0) / 1e6
    assert [s.grade for s in scored] == [1.0] * 4
    assert scored[0].execution.cost_usd == pytest.approx(expected_cost)
    with pytest.raises(ValueError, match="split must be"):
        ZeroEvalWorldConfig(split="dev")
    with pytest.raises(ValueError, match="zeroeval models"):
        ZeroEvalWorldConfig(models=("gpt-5",))
    with pytest.raises(ValueError, match="o1_mini_output_factor"):
        ZeroEvalWorldConfig(o1_mini_output_factor=0.5)
