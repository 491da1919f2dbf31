"""Conductor, worker and recursion prompts: structure, anonymised pool, examples that parse."""

from __future__ import annotations

import re

import pytest

from env.prompts import CONDUCTOR_PREFIX, conductor_messages, recursion_messages, worker_messages
from env.workflow import parse_workflow

QUESTION = "What is 17 * 23?\n\nGive your final answer inside <answer>...</answer>."


def _example_texts(user_message: str) -> list[str]:
    """The rendered example workflows: text from each "Example N" header to the end of its access_list line."""
    return re.findall(r"Example \d+\nQuestion: [^\n]*\n(.*?access_list = [^\n]*)", user_message, re.DOTALL)


def test_conductor_prompt_is_system_then_user_with_question_pool_and_limit():
    messages = conductor_messages(QUESTION, pool=4, max_steps=3)
    assert [message["role"] for message in messages] == ["system", "user"]
    user = messages[1]["content"]
    assert user.startswith(f"Question:\n{QUESTION}")
    assert [f"Model id {k}" for k in range(4)] == re.findall(r"Model id \d+", user)
    assert "at most 3 steps" in user
    assert "an integer from 0 to 3" in user


@pytest.mark.parametrize("access_mode", ["binary", "fine"])
@pytest.mark.parametrize("pool_size, max_steps", [(1, 1), (2, 2), (7, 5)])
def test_examples_are_valid_workflows_for_the_pool_and_step_limit(access_mode, pool_size, max_steps):
    user = conductor_messages(QUESTION, pool_size, max_steps, access_mode)[1]["content"]
    examples = _example_texts(user)
    assert 1 <= len(examples) <= 3
    for text in examples:
        workflow = parse_workflow(text, pool=pool_size, max_steps=max_steps, access_mode=access_mode)
        assert workflow.reasoning
    assert any('"all"' in text for text in examples) == (access_mode == "binary" and max_steps > 1)


def test_examples_come_from_other_task_families_than_the_benchmarks():
    user = conductor_messages(QUESTION, pool=3)[1]["content"]
    questions = re.findall(r"Example \d+\nQuestion: ([^\n]*)", user)
    assert len(questions) == 3
    assert not any("<answer>" in question for question in questions)


def test_workers_appear_only_as_numbered_ids():
    text = " ".join(message["content"] for message in conductor_messages(QUESTION, pool=7))
    for name in ("GPT", "Claude", "Gemini", "Qwen", "Llama", "DeepSeek", "Gemma", "SmolLM"):
        assert name.lower() not in text.lower()


def test_prefix_is_the_start_of_planning_and_has_no_lists():
    assert CONDUCTOR_PREFIX.endswith("\n")
    assert "model_id" not in CONDUCTOR_PREFIX and "[" not in CONDUCTOR_PREFIX


def test_worker_message_orders_preamble_task_visible_steps_then_own_subtask():
    visible = [("Solve the equation.", "x = 4"), ("Check the solution.", "Correct: x = 4")]
    [message] = worker_messages(QUESTION, visible, "Give the final answer.")
    assert message["role"] == "user"
    text = message["content"]
    positions = [
        text.index("one of several AI agents"),
        text.index(f"<overall_task>\n{QUESTION}\n</overall_task>"),
        text.index("<agent_1_subtask>\nSolve the equation.\n</agent_1_subtask>"),
        text.index("<agent_1_response>\nx = 4\n</agent_1_response>"),
        text.index("<agent_2_subtask>\nCheck the solution.\n</agent_2_subtask>"),
        text.index("<agent_2_response>\nCorrect: x = 4\n</agent_2_response>"),
        text.index("<your_subtask>\nGive the final answer.\n</your_subtask>"),
    ]
    assert positions == sorted(positions)


def test_worker_without_access_sees_no_other_agent():
    [message] = worker_messages(QUESTION, [], "Solve it.")
    assert "<agent_" not in message["content"]


def test_recursion_prompt_shows_previous_workflow_and_answer_and_how_to_keep_it():
    previous = "model_id = [0]\nsubtasks = ['Solve it.']\naccess_list = [[]]"
    messages = recursion_messages(QUESTION, 3, 5, previous, "<answer>391</answer>")
    assert [message["role"] for message in messages] == ["system", "user"]
    user = messages[1]["content"]
    assert previous in user and "<answer>391</answer>" in user
    keep = user[user.index("three empty lists") :]
    assert parse_workflow(keep, pool=3, allow_empty=True).keeps_previous_answer


def test_compact_prompt_holds_the_question_and_the_offered_ids_and_nothing_else():
    messages = conductor_messages(QUESTION, (1, 3, 5), 3, prompt="compact")
    assert messages[0] == conductor_messages(QUESTION, (1, 3, 5), 3)[0]  # the same system message
    assert messages[1] == {"role": "user", "content": f"Question:\n{QUESTION}\n\nModels: 1, 3, 5"}
    full = conductor_messages(QUESTION, (1, 3, 5), 3)[1]["content"]
    assert len(messages[1]["content"]) < len(full) / 10


def test_compact_recursion_prompt_shows_the_previous_workflow_its_answer_and_the_ids():
    previous = "model_id = [0]\nsubtasks = ['Solve it.']\naccess_list = [[]]"
    user = recursion_messages(QUESTION, 2, 5, previous + "\n", " <answer>391</answer>", prompt="compact")[1]["content"]
    assert user == (f"Question:\n{QUESTION}\n\nPrevious workflow:\n{previous}\n\nIts final answer:\n"
                    "<answer>391</answer>\n\nModels: 0, 1")


def test_bad_settings_raise_value_error():
    with pytest.raises(ValueError, match="pool_size"):
        conductor_messages(QUESTION, pool=0)
    with pytest.raises(ValueError, match="pool_size"):
        conductor_messages(QUESTION, pool=0, prompt="compact")
    with pytest.raises(ValueError, match="access_mode"):
        recursion_messages(QUESTION, 3, 5, "", "", access_mode="coarse")
    with pytest.raises(ValueError, match="conductor_prompt"):
        conductor_messages(QUESTION, pool=3, prompt="short")
