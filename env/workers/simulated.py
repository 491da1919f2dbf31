"""A simulated worker: right with a per-task skill probability, with latency, token counts and a price.

It answers with `env.tasks.reference_response(task)` (grades 1.0) or `env.tasks.wrong_response(task, rng)`
(grades 0.0), so the normal graders score it. What it does inside a multi-step workflow is a modelling choice,
not data; `AnswerModel` states it in one place and the replay worker uses the same one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import math
import random
import statistics
from typing import TYPE_CHECKING, Literal, Mapping, Sequence

from env import tasks as task_library
from env.workers.api import FREE, Price
from env.workers.base import Message, WorkerError, WorkerReply

if TYPE_CHECKING:
    from env.tasks.base import Task

MultiStepRule = Literal["independent", "adopt"]
CHARS_PER_TOKEN = 4  # the usual English-text ratio; a simulated worker has no tokenizer


@dataclasses.dataclass(frozen=True)
class AnswerModel:
    """How a world-model worker decides to be right, given its skill on the question.

    - "independent": every call is right with probability `skill`, whatever earlier responses it reads. A
      workflow is then worth what its last step's worker is worth, and the best policy is one step with the
      most skilled worker.
    - "adopt": a call that reads a correct earlier response (its messages contain the task's reference
      response) also recognises and adopts it with probability `adopt_rate`:
      P(right) = 1 - (1 - skill) * (1 - adopt_rate). Reading earlier work then has value, so multi-step
      workflows can beat the best single worker.
    """

    rule: MultiStepRule = "independent"
    adopt_rate: float = 0.5

    def __post_init__(self) -> None:
        if self.rule not in ("independent", "adopt"):
            raise ValueError(f"rule must be 'independent' or 'adopt', got {self.rule!r}")
        if not 0.0 <= self.adopt_rate <= 1.0:
            raise ValueError(f"adopt_rate must be in [0, 1], got {self.adopt_rate}")

    def p_correct(self, skill: float, reads_correct_response: bool) -> float:
        if self.rule == "adopt" and reads_correct_response:
            return 1.0 - (1.0 - skill) * (1.0 - self.adopt_rate)
        return skill


def call_draw(seed: int | None, *parts: str) -> tuple[float, int | None]:
    """A uniform draw in [0, 1) and a seed for anything else the call samples, both fixed by `seed` and the call's
    content (so a repeated call repeats); fresh randomness without a seed."""
    if seed is None:
        return random.random(), None
    digest = hashlib.blake2b("\x1f".join((str(seed), *parts)).encode(), digest_size=16).digest()
    return int.from_bytes(digest[:7], "little") / 2**56, int.from_bytes(digest[8:], "little")


class SimulatedWorker:
    """A worker with a skill per task label (probability of a correct answer), a latency and a price.

    A call takes `latency_s` seconds, or with `latency_sigma` > 0 a lognormal draw with median `latency_s`:
    latency_s * exp(latency_sigma * z), z standard normal, drawn like the answer (fixed by the call's seed and
    content). API latencies have that shape, a heavy right tail: with sigma 1, one call in ten takes 3.6 times the
    median and one in a hundred 10 times. Prompt tokens are the messages' characters / 4; completion tokens are `completion_tokens` (a stand-in for
    the reasoning a real worker writes). The temperature changes nothing; with a seed, the answer is a function
    of (seed, worker, task, messages).
    """

    backend = "simulated"

    def __init__(
        self,
        name: str,
        skills: Mapping[str, float],
        *,
        default_skill: float | None = None,
        latency_s: float = 0.0,
        latency_sigma: float = 0.0,
        completion_tokens: int = 200,
        price: Price = FREE,
        answer_model: AnswerModel = AnswerModel(),
    ) -> None:
        for task_label, skill in {**skills, "default": default_skill if default_skill is not None else 0.0}.items():
            if not 0.0 <= skill <= 1.0:
                raise ValueError(f"{name}: skill for {task_label!r} must be in [0, 1], got {skill}")
        if latency_s < 0:
            raise ValueError(f"{name}: latency_s must be >= 0, got {latency_s}")
        if latency_sigma < 0:
            raise ValueError(f"{name}: latency_sigma must be >= 0, got {latency_sigma}")
        if completion_tokens < 0:
            raise ValueError(f"{name}: completion_tokens must be >= 0, got {completion_tokens}")
        self.name = name
        self.model = name
        self.skills = dict(skills)
        self.default_skill = default_skill
        self.latency_s = latency_s
        self.latency_sigma = latency_sigma
        self.completion_tokens = completion_tokens
        self.price = price
        self.answer_model = answer_model

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, skills={self.skills!r}, latency_s={self.latency_s})"

    @property
    def cache_model(self) -> str:
        """Everything that changes this worker's answers, for the response cache."""
        return f"{self.name} [skills={sorted(self.skills.items())}, default={self.default_skill}, {self.answer_model}]"

    def skill(self, task: "Task") -> float:
        if task.task_label in self.skills:
            return self.skills[task.task_label]
        if self.default_skill is None:
            raise WorkerError(f"{self.name}: no skill for task {task.task_label!r} and no default_skill")
        return self.default_skill

    def p_right(self, messages: Sequence[Message], task: "Task") -> float:
        """The probability that a reply to `messages` is right: the skill, through the answer model (a call reads a
        correct earlier response when the task's reference response is in its messages). The expected grade of
        the reply, which `complete` draws."""
        content = "\n".join(message["content"] for message in messages)
        return self.answer_model.p_correct(self.skill(task), task_library.reference_response(task) in content)

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float,
        seed: int | None,
        task: "Task | None" = None,
    ) -> WorkerReply:
        if task is None:
            raise WorkerError(f"{self.name}: a world-model worker needs the task to answer")
        content = "\n".join(message["content"] for message in messages)
        latency_s = self.latency_s
        if latency_s and self.latency_sigma:
            draw, _ = call_draw(seed, "latency", self.name, task.id, content)
            latency_s *= math.exp(self.latency_sigma * statistics.NormalDist().inv_cdf(max(draw, 1e-12)))
        if latency_s:
            await asyncio.sleep(latency_s)
        draw, wrong_seed = call_draw(seed, self.name, task.id, content)
        if draw < self.p_right(messages, task):
            text = task_library.reference_response(task)
        else:
            text = task_library.wrong_response(task, random.Random(wrong_seed))
        prompt_tokens = math.ceil(len(content) / CHARS_PER_TOKEN)
        completion_tokens = min(self.completion_tokens, max_tokens)
        return WorkerReply(
            text=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_usd=self.price.cost(prompt_tokens, completion_tokens),
            latency_s=latency_s,
        )
