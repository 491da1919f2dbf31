"""Whether a trained Conductor's greedy workflows parse, on questions it was not trained on where the world can make
them: the format rate a user of `launch.eval` and `launch.serve` meets."""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Sequence

from env import prompts
from env.tasks.base import Task
from env.tasks.synthetic import load_synthetic
from env.workflow import AccessMode, WorkflowFormatError, parse_workflow
from models.tokenizer import render_chat
from rollout.types import SamplingParams


@dataclasses.dataclass(frozen=True)
class FormatValidity:
    """How many of `questions` got a workflow that parses; `failures` pairs each other question with its parse
    error."""

    valid: int
    questions: int
    failures: tuple[tuple[str, str], ...]

    @property
    def rate(self) -> float:
        return self.valid / self.questions


def greedy_valid_format(
    generator: Any,
    tokenizer: Any,
    questions: Sequence[str],
    *,
    pool_size: int,
    max_steps: int,
    access_mode: AccessMode,
    max_new_tokens: int,
    conductor_prompt: prompts.ConductorPrompt = "full",
    batch_questions: int = 64,
) -> FormatValidity:
    """Whether the Conductor's greedy completion for each question, prompted as `launch.serve` prompts it, parses as
    a workflow for a pool of `pool_size`. Greedy is how a trained Conductor is evaluated and served first, so this
    is the format rate a user meets, without the sampling noise of the training-time rate."""
    if not questions:
        raise ValueError("no questions to check")
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    failures = []
    for start in range(0, len(questions), batch_questions):
        batch = questions[start : start + batch_questions]
        prompt_ids = [
            render_chat(tokenizer, prompts.conductor_messages(q, pool_size, max_steps, access_mode, conductor_prompt),
                        prompts.CONDUCTOR_PREFIX)
            for q in batch
        ]  # fmt: skip
        for question, group in zip(batch, generator.generate(prompt_ids, params, 1)):
            text = tokenizer.decode(list(group[0].completion_ids), skip_special_tokens=True)
            try:
                parse_workflow(prompts.CONDUCTOR_PREFIX + text, pool_size, max_steps, access_mode)
            except WorkflowFormatError as error:
                failures.append((question, str(error)))
    return FormatValidity(len(questions) - len(failures), len(questions), tuple(failures))


def held_out_questions(tasks: Sequence[Task], count: int, seed: int) -> list[str]:
    """`count` questions to check a trained Conductor's format on. Where the world's questions are generated
    synthetic ones, fresh questions from the same generator that none of `tasks` asks (the Conductor never saw
    them); otherwise a seeded sample of `tasks`' own questions."""
    seen = {task.question for task in tasks}
    if tasks and all(task.id.startswith("synthetic/") for task in tasks):
        fresh: list[str] = []
        for task in load_synthetic(len(tasks) + 2 * count, seed)[len(tasks) :]:
            if task.question not in seen and task.question not in fresh:
                fresh.append(task.question)
        return fresh[:count]
    ordered = sorted(seen)
    return random.Random(seed).sample(ordered, min(count, len(ordered)))
