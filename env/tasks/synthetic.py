"""Generated questions with known answers, for the synthetic world (docs/design.md section 5).

Four tasks, graded by the normal graders: `arithmetic` and `algebra` (math grader), `logic` (ordering puzzles)
and `trivia` (calendar facts), both short-answer graded. Everything is a function of the seed.
"""

from __future__ import annotations

import operator
import random

from env.tasks.answers import ANSWER_INSTRUCTION
from env.tasks.base import Task
from env.tasks.graders import grade_math, grade_short_answer

TASK_LABELS = ("arithmetic", "algebra", "logic", "trivia")
DEFAULT_COUNT = 1000

_NAMES = ("Ava", "Ben", "Cleo", "Dev", "Emil", "Farah", "Gus", "Hana", "Ivan", "Jun", "Kira", "Leo")
_COMPARISONS = (("taller", "tallest", "shortest"), ("older", "oldest", "youngest"), ("faster", "fastest", "slowest"))
_OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)


def load_synthetic(count: int = DEFAULT_COUNT, seed: int = 0) -> list[Task]:
    """`count` questions cycling through the tasks, so every task gets a near-equal share."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        task_label = TASK_LABELS[index % len(TASK_LABELS)]
        question, gold, distractors = _GENERATORS[task_label](rng)
        tasks.append(
            Task(
                id=f"synthetic/{task_label}/{seed}/{index}",
                task_label=task_label,
                question=f"{question}\n\n{ANSWER_INSTRUCTION}",
                gold=gold,
                grader=grade_math if task_label in ("arithmetic", "algebra") else grade_short_answer,
                metadata={"distractors": distractors},
            )
        )
    return tasks


def _arithmetic(rng: random.Random) -> tuple[str, str, tuple[str, ...]]:
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 30)
    first, second = rng.choice("+-"), rng.choice("+-*")
    value = _OPERATORS[second](_OPERATORS[first](a, b), c)
    return f"Compute ({a} {first} {b}) {second} {c}.", str(value), ()


def _algebra(rng: random.Random) -> tuple[str, str, tuple[str, ...]]:
    x = rng.randint(-20, 20)
    a = rng.choice([k for k in range(-9, 10) if k not in (0, 1)])
    b = rng.randint(-50, 50)
    sign = "+" if b >= 0 else "-"
    return f"Solve for x: {a}x {sign} {abs(b)} = {a * x + b}.", str(x), ()


def _logic(rng: random.Random) -> tuple[str, str, tuple[str, ...]]:
    people = rng.sample(_NAMES, rng.randint(3, 5))  # in order from most to least
    comparative, most, least = rng.choice(_COMPARISONS)
    facts = [f"{people[i]} is {comparative} than {people[i + 1]}." for i in range(len(people) - 1)]
    rng.shuffle(facts)
    ask_most = rng.random() < 0.5
    answer = people[0] if ask_most else people[-1]
    question = f"{' '.join(facts)} Who is the {most if ask_most else least}? Answer with the name only."
    return question, answer, tuple(name for name in people if name != answer)


def _trivia(rng: random.Random) -> tuple[str, str, tuple[str, ...]]:
    if rng.random() < 0.5:
        start, offset = rng.randrange(7), rng.randint(2, 60)
        answer = _WEEKDAYS[(start + offset) % 7]
        question = f"If today is {_WEEKDAYS[start]}, what day of the week will it be in {offset} days?"
        return question, answer, tuple(day for day in _WEEKDAYS if day != answer)
    start, offset = rng.randrange(12), rng.randint(2, 30)
    answer = _MONTHS[(start + offset) % 12]
    question = f"Which month is {offset} months after {_MONTHS[start]}?"
    return question, answer, tuple(month for month in _MONTHS if month != answer)


_GENERATORS = {"arithmetic": _arithmetic, "algebra": _algebra, "logic": _logic, "trivia": _trivia}
