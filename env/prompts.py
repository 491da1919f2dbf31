"""Prompts of the Conductor and of its workers (docs/design.md section 8), written in our own words.

Structure follows the reference: the Conductor gets a system message, a user message with the question, the model
ids it may name (`env.workflow.model_ids`: the whole pool's, or the ids a question offers), the step limit and a few
example workflows from other tasks, and continues an assistant prefix that starts its planning. The compact prompt
(`ConductorPrompt`) keeps only the question and the ids, for a Conductor trained from scratch. A worker gets a
preamble, the overall question, every earlier step it may read as a tagged subtask + response pair, then its own
subtask. Example workflows are rendered by `render_workflow`, so the prompts and the parser share one grammar.
"""

from __future__ import annotations

from typing import Literal, Sequence, get_args

from env.workers.base import Message
from env.workflow import AccessMode, Step, Workflow, check_settings, model_ids, render_workflow

# "full": the reference's prompt, instructions and examples included, for a pretrained Conductor that reads them.
# "compact": the question and the offered ids alone. A Conductor trained from scratch cannot read the instructions,
# and ~480 constant tokens around the few that differ between questions (task, difficulty) drown them in its
# attention: supervised on the orchestration world's optimum, the tiny Conductor read the difficulty only from the
# compact prompt (docs/log/2026-12-07-compact-conductor-prompt.md).
ConductorPrompt = Literal["full", "compact"]

CONDUCTOR_PREFIX = (
    "Let me plan this step by step: which subtasks the question needs, which model should handle each one, "
    "and which earlier steps each model should see.\n"
)

_CONDUCTOR_SYSTEM = (
    "You are the Conductor. You do not answer questions yourself. Instead you design a short workflow in which "
    "other language models solve a question together, and you write it in a fixed format."
)

_ACCESS_RULES = {
    "binary": (
        'access_list: for each step either "all" (the model sees the subtasks and responses of every earlier '
        "step) or [] (it sees only the question and its own subtask)."
    ),
    "fine": (
        "access_list: for each step a list of indices of earlier steps whose subtasks and responses that model "
        "sees, for example [0, 2]; [] means it sees only the question and its own subtask. A step can only "
        "read steps that come before it."
    ),
}

# Each example is a question from a task that differs from the usual benchmarks, with a workflow over
# generic model ids; the i-th id of an example names the pool's (i mod its size)-th id, so it is valid for any pool.
_EXAMPLES: tuple[tuple[str, Workflow], ...] = (
    (
        "Which planet in our solar system has the shortest day?",
        Workflow(
            steps=(Step(worker=1, instruction="Answer the question directly and briefly.", access=()),),
            reasoning="This is a single factual lookup, so one strong model answering directly is enough.",
        ),
    ),
    (
        "A tank holds 240 litres and drains at 3.5 litres per minute. How long until it holds 100 litres?",
        Workflow(
            steps=(
                Step(worker=0, instruction="Set up the equation for the volume over time and solve it.", access=()),
                Step(
                    worker=2,
                    instruction="Check the arithmetic of the previous solution and state the final answer.",
                    access="all",
                ),
            ),
            reasoning="One model solves, a second verifies the arithmetic and gives the final answer.",
        ),
    ),
    (
        "Write a function that returns the k most frequent words in a text, ties broken alphabetically.",
        Workflow(
            steps=(
                Step(worker=2, instruction="List the edge cases a correct solution must handle.", access=()),
                Step(worker=0, instruction="Write the function, handling every listed edge case.", access="all"),
                Step(
                    worker=1,
                    instruction="Review the code for bugs against the edge cases and output the corrected "
                    "final version.",
                    access="all",
                ),
            ),
            reasoning="Planning the edge cases first, then writing, then reviewing catches most bugs in code.",
        ),
    ),
)


def conductor_messages(
    question: str,
    pool: int | Sequence[int],
    max_steps: int = 5,
    access_mode: AccessMode = "binary",
    prompt: ConductorPrompt = "full",
) -> list[Message]:
    """System + user message of the first Conductor round over `pool`'s model ids (`env.workflow.model_ids`); the
    assistant continues `CONDUCTOR_PREFIX`."""
    ids = model_ids(pool)
    check_settings(len(ids), max_steps, access_mode)
    if _compact(prompt):
        return _messages(f"Question:\n{question}", _compact_ids(ids))
    return _messages(
        f"Question:\n{question}",
        _pool_and_format(ids, max_steps, access_mode),
        _examples(ids, max_steps, access_mode),
        "Reason briefly about how to split the question, then write the three lists for this question.",
    )


def recursion_messages(
    question: str,
    pool: int | Sequence[int],
    max_steps: int,
    previous_workflow_text: str,
    previous_answer: str,
    access_mode: AccessMode = "binary",
    prompt: ConductorPrompt = "full",
) -> list[Message]:
    """A further Conductor round: it sees its previous workflow and that workflow's final answer and either
    writes a new workflow or three empty lists to keep the previous answer."""
    ids = model_ids(pool)
    check_settings(len(ids), max_steps, access_mode)
    if _compact(prompt):
        return _messages(
            f"Question:\n{question}",
            f"Previous workflow:\n{previous_workflow_text.strip()}",
            f"Its final answer:\n{previous_answer.strip()}",
            _compact_ids(ids),
        )
    return _messages(
        f"Question:\n{question}",
        f"You already ran this workflow:\n{previous_workflow_text.strip()}",
        f"Its final answer was:\n{previous_answer.strip()}",
        _pool_and_format(ids, max_steps, access_mode),
        "If you are confident the final answer is correct, keep it by writing three empty lists:\n"
        "model_id = []\nsubtasks = []\naccess_list = []\n"
        "Otherwise write a new workflow that fixes what went wrong; it may use the previous answer in its "
        "subtasks.",
    )


def check_conductor_prompt(prompt: str) -> None:
    if prompt not in get_args(ConductorPrompt):
        raise ValueError(f"conductor_prompt must be one of {get_args(ConductorPrompt)}, got {prompt!r}")


def _compact(prompt: str) -> bool:
    check_conductor_prompt(prompt)
    return prompt == "compact"


def _compact_ids(ids: tuple[int, ...]) -> str:
    return f"Models: {', '.join(map(str, ids))}"


def _messages(*user_parts: str) -> list[Message]:
    return [{"role": "system", "content": _CONDUCTOR_SYSTEM}, {"role": "user", "content": "\n\n".join(user_parts)}]


_WORKER_PREAMBLE = (
    "You are one of several AI agents working together on a task. You are given the overall task and one "
    "subtask to solve. You may also see the subtasks given to other agents and their responses; use them where "
    "they help, but check them, since they can be wrong. Solve your own subtask. If your subtask asks for the "
    "final answer, give it in the format the overall task requests."
)


def worker_messages(question: str, visible: Sequence[tuple[str, str]], instruction: str) -> list[Message]:
    """One user message for a worker. `visible` holds (subtask, response) of each earlier step it may read,
    in step order."""
    parts = [_WORKER_PREAMBLE, f"<overall_task>\n{question}\n</overall_task>"]
    for number, (subtask, response) in enumerate(visible, start=1):
        parts.append(
            f"<agent_{number}_subtask>\n{subtask}\n</agent_{number}_subtask>\n"
            f"<agent_{number}_response>\n{response}\n</agent_{number}_response>"
        )
    parts.append(f"<your_subtask>\n{instruction}\n</your_subtask>")
    return [{"role": "user", "content": "\n\n".join(parts)}]


def _pool_and_format(ids: tuple[int, ...], max_steps: int, access_mode: AccessMode) -> str:
    pool = "\n".join(f"- Model id {index}" for index in ids)
    allowed = (f"an integer from 0 to {len(ids) - 1}" if ids == tuple(range(len(ids)))
               else f"one of {', '.join(map(str, ids))}")
    return (
        f"Available models:\n{pool}\n\n"
        f"Write a workflow of at most {max_steps} step{'s' if max_steps > 1 else ''}. Steps run in order and "
        "the response of the last step is the final answer, so the last subtask must ask for the final answer "
        "in the format the question requests. End your reply with three Python lists of the same length:\n"
        f"model_id: for each step the id of the model that runs it ({allowed}).\n"
        "subtasks: for each step the instruction given to that model, as a string.\n"
        f"{_ACCESS_RULES[access_mode]}"
    )


def _examples(ids: tuple[int, ...], max_steps: int, access_mode: AccessMode) -> str:
    blocks = []
    for number, (question, workflow) in enumerate(_EXAMPLES, start=1):
        if len(workflow.steps) > max_steps:
            continue
        steps = tuple(
            Step(worker=ids[step.worker % len(ids)], instruction=step.instruction, access=step.access)
            for step in workflow.steps
        )
        rendered = render_workflow(Workflow(steps=steps, reasoning=workflow.reasoning), access_mode)
        blocks.append(f"Example {number}\nQuestion: {question}\n{rendered}")
    return "Examples of workflows for other kinds of questions:\n\n" + "\n\n".join(blocks)
