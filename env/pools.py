"""Offered pools: each question offers some of a world's workers, as the paper's randomized-pool training does.

A question offered the pool (3, 7, 12) opens with who sits in each slot

    Models offered: id 0 = M3, id 1 = M7, id 2 = M12.

the Conductor's prompt lists those ids alone (`env.gym_env`: a workflow naming another id is malformed), and slot i
answers as the pool's i-th worker (`OfferedSlot`). Workers are named `M<index>` by their place in the world's pool,
never by their model names (docs/design.md: the Conductor sees ids, not names), so a Conductor can learn what each
worker is good at from training pools and use it in pools it never saw.

`offered_pool(task)` is the pool a question offers; the orchestration world (`env.orchestration`) offers its own
pools with its own question text and reads them the same way.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Sequence

from env.tasks.base import Task
from env.workers.base import Message, Worker, WorkerError, WorkerReply


def offered_pool(task: Task) -> tuple[int, ...]:
    """The workers `task` offers, in slot order (indices into the world's pool)."""
    return tuple(task.metadata["pool"])


def offered_pool_size(task: Task, world_pool_size: int) -> int:
    """How many workers the Conductor may name on `task`: its offered pool's, else the world's whole pool."""
    return len(task.metadata["pool"]) if "pool" in task.metadata else world_pool_size


def offer(task: Task, pool: Sequence[int], name: str = "") -> Task:
    """`task` offering `pool` (called `name`, for reports): its question text opens with the slots' workers."""
    if not pool or len(set(pool)) != len(pool) or min(pool) < 0:
        raise ValueError(f"a pool is distinct worker indices >= 0, got {tuple(pool)}")
    listed = ", ".join(f"id {slot} = M{worker}" for slot, worker in enumerate(pool))
    return dataclasses.replace(
        task,
        question=f"Models offered: {listed}.\n\n{task.question}",
        metadata={**task.metadata, "pool": tuple(pool), "pool_name": name},
    )


def random_pools(
    num_workers: int, sizes: tuple[int, int], count: int, seed: str, exclude: Sequence[Sequence[int]] = ()
) -> list[tuple[int, ...]]:
    """`count` distinct pools drawn as `draw_pool` draws them, none equal to a pool of `exclude`, from `seed` (a
    string, so the draw is the same on every machine and process)."""
    rng, pools = random.Random(seed), []
    for _ in range(count):
        pools.append(draw_pool(num_workers, sizes, rng, exclude=[*exclude, *pools]))
    return pools


def shuffled(pool: Sequence[int], rng: random.Random) -> tuple[int, ...]:
    """`pool` in a random slot order: slot ids then say nothing of which worker sits there (a sorted pool would seat
    the world's first workers at id 0, and a Conductor could learn "id 0" instead of reading the question)."""
    order = list(pool)
    rng.shuffle(order)
    return tuple(order)


def draw_pool(
    num_workers: int, sizes: tuple[int, int], rng: random.Random, exclude: Sequence[Sequence[int]] = ()
) -> tuple[int, ...]:
    """A pool of a size drawn uniformly from [sizes[0], sizes[1]], then its workers uniformly (sorted), from `rng`;
    drawn again while it equals a pool of `exclude`."""
    low, high = sizes
    if not 1 <= low <= high <= num_workers:
        raise ValueError(f"pool sizes must satisfy 1 <= {low} <= {high} <= {num_workers} workers")
    excluded = {tuple(sorted(pool)) for pool in exclude}
    for _ in range(10_000):
        pool = tuple(sorted(rng.sample(range(num_workers), rng.randint(low, high))))
        if pool not in excluded:
            return pool
    raise ValueError(f"every pool of sizes {sizes} over {num_workers} workers is excluded")


class OfferedSlot:
    """Slot `slot` of the Conductor's pool: on each question, the worker its offered pool seats there."""

    backend = "offered"

    def __init__(self, slot: int, workers: Sequence[Worker]) -> None:
        if not 0 <= slot < len(workers):
            raise ValueError(f"slot {slot} outside a pool of {len(workers)} workers")
        self.slot = slot
        self.name = f"slot-{slot}"
        self.model = self.name
        self.workers = tuple(workers)  # the world's whole pool, which `offered_pool` indexes

    @property
    def cache_model(self) -> str:
        """Everything that changes this slot's answers, for the response cache: the question picks the worker, and
        the cache keys on the question too."""
        workers = ", ".join(getattr(worker, "cache_model", worker.model) for worker in self.workers)
        return f"{self.name} of [{workers}]"

    def worker(self, task: Task) -> Worker:
        """The worker this slot is on `task`."""
        pool = offered_pool(task)
        if self.slot >= len(pool):
            raise WorkerError(f"{self.name}: task {task.id} offers {len(pool)} workers")
        return self.workers[pool[self.slot]]

    def reply(self, task: Task) -> WorkerReply:
        """The seated worker's recorded reply (`env.workers.recorded.RecordedWorker.reply`)."""
        return self.worker(task).reply(task)

    async def complete(
        self, messages: Sequence[Message], *, max_tokens: int, temperature: float, seed: int | None,
        task: Task | None = None,
    ) -> WorkerReply:  # fmt: skip
        if task is None:
            raise WorkerError(f"{self.name}: an offered slot needs the task to know which worker it is")
        return await self.worker(task).complete(
            messages, max_tokens=max_tokens, temperature=temperature, seed=seed, task=task
        )
