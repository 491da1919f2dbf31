"""Worker responses with a known grade, for the simulated and replay workers (docs/design.md section 5).

`reference_response(task)` grades 1 and `wrong_response(task, rng)` grades 0 under the task's own grader, so
world-model workers are scored by the same graders as real ones.
"""

from __future__ import annotations

import random

from env.tasks.base import Task
from env.tasks.code import CodeTests, grade_code
from env.tasks.graders import grade_choice, grade_exact, grade_math, grade_short_answer

_LETTERS = "ABCDEFGHIJ"
_MAX_TRIES = 50


def reference_response(task: Task) -> str:
    """A response that grades 1.0: the gold answer in <answer> tags, or for code tasks the reference solution
    (`task.metadata["reference_solution"]`) as a ```python block."""
    if task.grader is grade_code:
        solution = task.metadata.get("reference_solution")
        if not solution:
            raise ValueError(f"task {task.id} has no reference solution (LiveCodeBench ships none)")
        return _code_answer(solution)
    return f"Final answer below.\n<answer>{task.gold}</answer>"


def wrong_response(task: Task, rng: random.Random) -> str:
    """A plausible response that grades 0.0: another option letter, a nearby or unrelated number, another
    candidate from `task.metadata["distractors"]`, or code whose function returns None."""
    if task.grader is grade_code:
        return _code_answer(_wrong_code(task.gold))
    if task.grader is grade_exact:
        return f"Final answer below.\n<answer>{task.gold}:wrong:{rng.randrange(10**6)}</answer>"
    if task.grader is grade_choice:
        options = _LETTERS[: int(task.metadata.get("num_choices", 4))]
        letter = rng.choice([option for option in options if option != task.gold])
        return f"Final answer below.\n<answer>{letter}</answer>"
    if task.grader not in (grade_math, grade_short_answer):
        raise ValueError(f"task {task.id} has a grader wrong_response does not know: {task.grader!r}")
    for candidate in _candidates(task, rng):
        response = f"Final answer below.\n<answer>{candidate}</answer>"
        if task.grade(response) == 0.0:
            return response
    raise ValueError(f"found no wrong answer for task {task.id} (gold {task.gold!r})")


def _candidates(task: Task, rng: random.Random):
    distractors = list(task.metadata.get("distractors", ()))
    rng.shuffle(distractors)
    yield from distractors
    gold = str(task.gold).strip()
    number = _as_number(gold)
    for _ in range(_MAX_TRIES):
        if number is not None:
            offset = rng.choice([-1, 1]) * rng.randint(1, max(3, abs(int(number)) // 4 + 1))
            yield str(int(number) + offset) if float(number).is_integer() else f"{number * (1 + offset / 10):g}"
        else:
            yield str(rng.randint(-100, 1000))


def _as_number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _wrong_code(gold: CodeTests) -> str:
    if gold.kind == "humaneval":
        return f"{gold.prompt}    return None\n"
    if gold.kind == "functional":
        return f"class Solution:\n    def {gold.entry_point}(self, *args):\n        return None\n"
    return "print()\n"


def _code_answer(code: str) -> str:
    return f"Here is the solution.\n<answer>\n```python\n{code.rstrip()}\n```\n</answer>"
