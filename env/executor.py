"""Runs a workflow over the worker pool (docs/design.md sections 3 and 8).

A step starts as soon as every step it may read has finished, so independent steps run concurrently; the worker
sees exactly the earlier steps its access allows; the final answer is the last step's response. A worker failure
(after the worker's own retries) or a step timeout is recorded as a failed step and never raised. A failed step
has no response, so later steps that may read it are shown only the steps that succeeded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Sequence

from env import prompts
from env.tasks.base import Task
from env.workers.base import Worker, WorkerError, WorkerReply
from env.workers.cache import ResponseCache, cache_key
from env.workflow import Workflow


@dataclasses.dataclass(frozen=True)
class ExecutorConfig:
    """Sampling settings sent to every worker (the paper: <= 4096 tokens, temperature 0.2) and a step timeout.

    With a `seed`, each step gets its own seed derived from (seed, sample index, step index), so a run repeats
    exactly and identical steps within one workflow are still separate samples.
    """

    max_tokens: int = 4096
    temperature: float = 0.2
    seed: int | None = None
    step_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.step_timeout_s <= 0:
            raise ValueError(f"step_timeout_s must be > 0, got {self.step_timeout_s}")


@dataclasses.dataclass(frozen=True, slots=True)
class StepRecord:
    """One executed step. `error` is None for a success; times are seconds since the execution started.

    The measured times take no part in equality: a replay of the same execution equals it.
    """

    index: int
    worker: int
    worker_name: str
    instruction: str
    visible: tuple[int, ...]
    response: str
    error: str | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    latency_s: float = dataclasses.field(compare=False)
    cached: bool
    started_s: float = dataclasses.field(compare=False)
    finished_s: float = dataclasses.field(compare=False)

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclasses.dataclass(frozen=True)
class Execution:
    """The record of one round. `calls` counts steps that called their worker (cache hits excluded, failed calls
    included); `tokens` and `cost_usd`
    count every step's reply, cached or not, so rewards do not depend on the cache. `previous` is the earlier
    recursion round, if any; `kept_previous` says this round's workflow was empty and kept its answer. `wall_s`, like
    the steps' times, takes no part in equality."""

    final_answer: str
    steps: tuple[StepRecord, ...]
    calls: int
    tokens: int
    cost_usd: float
    wall_s: float = dataclasses.field(compare=False)
    previous: "Execution | None" = None
    kept_previous: bool = False

    @property
    def failed_steps(self) -> int:
        return sum(not step.ok for step in self.steps)


_NO_REPLY = WorkerReply(text="", prompt_tokens=0, completion_tokens=0, cost_usd=0.0, latency_s=0.0)


def step_seed(seed: int | None, sample_index: int, step_index: int) -> int | None:
    """A per-step seed mixed from the three integers (a tuple of ints hashes the same in every process)."""
    if seed is None:
        return None
    return hash((seed, sample_index, step_index)) & 0x7FFFFFFF


async def _call(
    worker: Worker,
    messages: list[dict[str, str]],
    task: Task,
    cache: ResponseCache | None,
    config: ExecutorConfig,
    seed: int | None,
    sample: list[int],
) -> tuple[WorkerReply, bool]:
    """The worker's reply and whether it came from the cache."""
    if cache is None:
        reply = await worker.complete(
            messages, max_tokens=config.max_tokens, temperature=config.temperature, seed=seed, task=task
        )
        return reply, False
    backend = getattr(worker, "backend", type(worker).__name__)
    model = getattr(worker, "cache_model", worker.name)
    key = cache_key(
        backend, model, messages, max_tokens=config.max_tokens, temperature=config.temperature, seed=seed, sample=sample
    )
    cached = await cache.get(key)
    if cached is not None:
        return cached, True
    reply = await worker.complete(
        messages, max_tokens=config.max_tokens, temperature=config.temperature, seed=seed, task=task
    )
    await cache.put(key, backend, model, reply)
    return reply, False


def step_messages(
    task: Task, records: Sequence[StepRecord], shown: Sequence[int], instruction: str
) -> list[dict[str, str]]:
    """What a step's worker is sent: the question, the earlier steps `shown` to it (instruction and response),
    and its own instruction."""
    visible = [(records[j].instruction, records[j].response) for j in shown]
    return prompts.worker_messages(task.question, visible, instruction)


def expected_grade(execution: Execution, task: Task, pool: Sequence[Worker]) -> float | None:
    """The final answer's grade in expectation over the last call's own draw, given what that call read.

    A world-model worker (simulated, replay) draws a right or wrong reply with a probability it can state
    (`p_right`); its expected grade has the drawn grade's mean without its variance. None when the last step's
    worker states no probability (a real model), when that step failed, or when the round ran no step.
    """
    if not execution.steps:
        return None
    last = execution.steps[-1]
    if not last.ok:
        return None
    p_right = getattr(pool[last.worker], "p_right", None)
    if p_right is None:
        return None
    return float(p_right(step_messages(task, execution.steps, last.visible, last.instruction), task))


async def execute_async(
    workflow: Workflow,
    task: Task,
    pool: Sequence[Worker],
    cache: ResponseCache | None = None,
    *,
    config: ExecutorConfig = ExecutorConfig(),
    sample_index: int = 0,
    previous: Execution | None = None,
) -> Execution:
    """Execute one round. An empty workflow (the recursion round's "keep it") needs `previous` and returns its
    answer without calling anyone."""
    if not workflow.steps:
        if previous is None:
            raise ValueError("an empty workflow keeps the previous answer, but there is no previous round")
        return Execution(previous.final_answer, (), 0, 0, 0.0, 0.0, previous=previous, kept_previous=True)
    for step in workflow.steps:
        if not 0 <= step.worker < len(pool):
            raise ValueError(f"step worker {step.worker} is outside the pool of {len(pool)} workers")

    start = time.perf_counter()
    steps = workflow.steps
    records: list[StepRecord | None] = [None] * len(steps)
    running: list[asyncio.Task[None]] = []

    async def run_step(index: int) -> None:
        step = steps[index]
        readable = step.visible_steps(index)
        for earlier in readable:
            await running[earlier]
        shown = tuple(j for j in readable if records[j].error is None)  # type: ignore[union-attr]
        messages = step_messages(task, records, shown, step.instruction)  # type: ignore[arg-type]
        worker = pool[step.worker]
        started = time.perf_counter() - start
        error: str | None = None
        try:
            async with asyncio.timeout(config.step_timeout_s):
                reply, cached = await _call(
                    worker,
                    messages,
                    task,
                    cache,
                    config,
                    step_seed(config.seed, sample_index, index),
                    [sample_index, index],
                )
        except WorkerError as failure:
            reply, cached, error = _NO_REPLY, False, str(failure)
        except TimeoutError:
            reply, cached, error = _NO_REPLY, False, f"step timed out after {config.step_timeout_s}s"
        finished = time.perf_counter() - start
        records[index] = StepRecord(
            index=index,
            worker=step.worker,
            worker_name=worker.name,
            instruction=step.instruction,
            visible=shown,
            response=reply.text,
            error=error,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            cost_usd=reply.cost_usd,
            latency_s=reply.latency_s if error is None else finished - started,
            cached=cached,
            started_s=started,
            finished_s=finished,
        )

    try:
        # Every step but the last runs as its own task; the last (which nothing reads) runs here.
        for index in range(len(steps) - 1):
            running.append(asyncio.ensure_future(run_step(index)))
        await run_step(len(steps) - 1)
        for pending in running:
            await pending
    finally:
        for pending in running:
            pending.cancel()

    done: tuple[StepRecord, ...] = tuple(records)  # type: ignore[arg-type]
    return Execution(
        final_answer=done[-1].response,
        steps=done,
        calls=sum(not step.cached for step in done),
        tokens=sum(step.prompt_tokens + step.completion_tokens for step in done),
        cost_usd=sum(step.cost_usd for step in done),
        wall_s=time.perf_counter() - start,
        previous=previous,
    )


async def aclose_workers(pool: Sequence[Worker]) -> None:
    """Close the SDK clients the pool's provider workers opened on the running event loop."""
    for worker in pool:
        close = getattr(worker, "aclose", None)
        if close is not None:
            await close()


def execute(
    workflow: Workflow,
    task: Task,
    pool: Sequence[Worker],
    cache: ResponseCache | None = None,
    *,
    config: ExecutorConfig = ExecutorConfig(),
    sample_index: int = 0,
    previous: Execution | None = None,
) -> Execution:
    """Synchronous `execute_async` on a fresh event loop (closing the clients it opened); not for use inside a
    running loop."""

    async def run() -> Execution:
        try:
            return await execute_async(
                workflow, task, pool, cache, config=config, sample_index=sample_index, previous=previous
            )
        finally:
            await aclose_workers(pool)

    return asyncio.run(run())
