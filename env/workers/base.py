"""The worker contract: one chat completion from one member of the pool (docs/design.md section 3)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:
    from env.tasks.base import Task

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}


@dataclasses.dataclass(frozen=True)
class WorkerReply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    latency_s: float


class WorkerError(RuntimeError):
    """A call that failed after its retries; the executor records it as a failed step."""


class Worker(Protocol):
    """A member of the pool.

    `task` is passed by the executor so that world-model workers (simulated, replay) can answer from what is
    known about the question; workers backed by a real model ignore it.
    """

    name: str

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float,
        seed: int | None,
        task: "Task | None" = None,
    ) -> WorkerReply: ...
