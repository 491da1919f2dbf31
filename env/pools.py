"""Offered pools: each question offers some of a world's workers, as the paper's randomized-pool training does.

A question offered the pool (3, 7, 12) lets the Conductor name those model ids alone: its prompt lists them
(`env.prompts`), and a workflow naming another id is malformed (`env.gym_env`). An id keeps its meaning in every
pool (model id 7 is the world's worker 7 wherever it is offered), as the paper's Conductor names models rather than
seats: a pool changes which ids are allowed, never what an id means, so what a Conductor learns of a worker in the
training pools holds in pools it never saw. Workers answer as themselves (the world's pool is every worker); the
Conductor sees ids, not model names (docs/design.md).

`offered_ids(task, n)` is what a question allows; the orchestration world (`env.orchestration`) offers its own pools
and reads them the same way.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Sequence

from env.tasks.base import Task
from env.workflow import Workflow, model_ids


def offered_pool(task: Task) -> tuple[int, ...]:
    """The workers `task` offers (indices into the world's pool), in increasing order."""
    return tuple(task.metadata["pool"])


def offered_ids(task: Task, world_pool_size: int) -> tuple[int, ...]:
    """The model ids the Conductor may name on `task`: its offered pool's workers, else the world's whole pool."""
    return offered_pool(task) if "pool" in task.metadata else tuple(range(world_pool_size))


def offer(task: Task, pool: Sequence[int], name: str = "") -> Task:
    """`task` offering `pool` (called `name`, for reports)."""
    return dataclasses.replace(task, metadata={**task.metadata, "pool": model_ids(tuple(pool)), "pool_name": name})


def random_pools(
    num_workers: int, sizes: tuple[int, int], count: int, seed: str, exclude: Sequence[Sequence[int]] = ()
) -> list[tuple[int, ...]]:
    """`count` distinct pools drawn as `draw_pool` draws them, none equal to a pool of `exclude`, from `seed` (a
    string, so the draw is the same on every machine and process)."""
    rng, pools = random.Random(seed), []
    for _ in range(count):
        pools.append(draw_pool(num_workers, sizes, rng, exclude=[*exclude, *pools]))
    return pools


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


def named(workflow: Workflow, pool: Sequence[int]) -> Workflow:
    """`workflow`, written over positions in `pool` (0 for its first worker), naming each step's model id instead."""
    return dataclasses.replace(
        workflow, steps=tuple(dataclasses.replace(step, worker=pool[step.worker]) for step in workflow.steps)
    )


def positions(workflow: Workflow, pool: Sequence[int]) -> Workflow:
    """`workflow`, naming model ids of `pool`, written over positions in `pool` instead (`named`'s inverse)."""
    missing = [step.worker for step in workflow.steps if step.worker not in pool]
    if missing:
        raise ValueError(f"model ids {missing} are not in the pool {tuple(pool)}")
    return dataclasses.replace(
        workflow, steps=tuple(dataclasses.replace(step, worker=list(pool).index(step.worker)) for step in workflow.steps)
    )
