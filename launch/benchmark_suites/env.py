"""Executor throughput: 4,096 fan-out/fan-in workflows on simulated workers with 20 ms latency.

Each workflow has three steps: two independent steps (run in parallel) and an aggregator that reads both, so
its critical path is 2 x 20 ms = 40 ms. At most 1,024 workflows are in flight, so each of the 1,024 lanes runs
ceil(4096 / 1024) = 4 workflows back to back: the critical-path bound is 4 x 40 ms = 160 ms. The event loop is
one thread, so the wall time is also bounded below by the CPU time the run needs; the table reports both and an
asyncio floor (the same lanes and sleeps with no executor, prompts or workers) measured in the same run.

Tasks are RouterDC MMLU questions (exact-match graded): the simulated worker's wrong answers on the synthetic
math tasks are checked with math-verify (about 1 ms each), which would time the grader, not the executor.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from typing import Awaitable, Callable

from env import tasks as task_library
from env.executor import ExecutorConfig, execute_async
from env.tasks.base import Task
from env.workers.simulated import SimulatedWorker
from env.workflow import Step, Workflow
from launch.benchmark_suites.common import Report

WORKFLOWS = 4096
CONCURRENCY = 1024
LATENCY_S = 0.020
REPEATS = 3
STEPS_PER_WORKFLOW = 3
CRITICAL_PATH_STEPS = 2
WALL_GOAL_RATIO = 1.5
CPU_GOAL_MS_PER_STEP = 1.0

FAN_OUT_FAN_IN = Workflow(
    steps=(
        Step(0, "Solve the question."),
        Step(1, "Solve the question another way."),
        Step(2, "Compare both answers and give the final answer.", "all"),
    )
)


async def run_lanes(count: int, lanes: int, one: Callable[[int], Awaitable[object]]) -> None:
    indices = iter(range(count))

    async def lane() -> None:
        for index in indices:
            await one(index)

    await asyncio.gather(*(lane() for _ in range(lanes)))


def measure(body: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one `asyncio.run(body())`."""
    wall, cpu = time.perf_counter(), time.process_time()
    asyncio.run(body())
    return time.perf_counter() - wall, time.process_time() - cpu


def executor_run(tasks: list[Task]) -> Callable[[], Awaitable[None]]:
    pool = [
        SimulatedWorker(f"sim-{i}", {"mmlu": skill}, latency_s=LATENCY_S) for i, skill in enumerate((0.6, 0.7, 0.8))
    ]
    config = ExecutorConfig(seed=0)

    async def body() -> None:
        await run_lanes(
            len(tasks),
            CONCURRENCY,
            lambda i: execute_async(FAN_OUT_FAN_IN, tasks[i], pool, config=config, sample_index=i),
        )

    return body


async def floor_body() -> None:
    async def workflow(_: int) -> None:
        await asyncio.gather(asyncio.sleep(LATENCY_S), asyncio.sleep(LATENCY_S))
        await asyncio.sleep(LATENCY_S)

    await run_lanes(WORKFLOWS, CONCURRENCY, workflow)


def run() -> Report:
    tasks = task_library.load("routerdc/mmlu_test")[:WORKFLOWS]
    if len(tasks) < WORKFLOWS:
        raise RuntimeError(f"need {WORKFLOWS} MMLU tasks, found {len(tasks)}")
    steps = WORKFLOWS * STEPS_PER_WORKFLOW
    bound_s = math.ceil(WORKFLOWS / CONCURRENCY) * CRITICAL_PATH_STEPS * LATENCY_S

    measure(executor_run(tasks))  # warm-up: imports, first-call costs
    executor = [measure(executor_run(tasks)) for _ in range(REPEATS)]
    floor = [measure(floor_body) for _ in range(REPEATS)]
    wall = statistics.median(w for w, _ in executor)
    cpu = statistics.median(c for _, c in executor)
    floor_wall = statistics.median(w for w, _ in floor)
    floor_cpu = statistics.median(c for _, c in floor)
    cpu_ms_per_step = 1e3 * cpu / steps
    overhead_ms_per_step = 1e3 * (cpu - floor_cpu) / steps

    figures = {
        "workflows": WORKFLOWS,
        "steps": steps,
        "concurrency": CONCURRENCY,
        "latency_ms": 1e3 * LATENCY_S,
        "critical_path_bound_s": bound_s,
        "wall_s": wall,
        "wall_over_bound": wall / bound_s,
        "wall_goal_met": wall <= WALL_GOAL_RATIO * bound_s,
        "cpu_s": cpu,
        "cpu_ms_per_step": cpu_ms_per_step,
        "executor_cpu_ms_per_step_above_asyncio_floor": overhead_ms_per_step,
        "cpu_goal_met": cpu_ms_per_step < CPU_GOAL_MS_PER_STEP,
        "wall_over_max_of_bound_and_cpu": wall / max(bound_s, cpu),
        "asyncio_floor_wall_s": floor_wall,
        "asyncio_floor_cpu_s": floor_cpu,
        "repeats": REPEATS,
    }
    rows = [
        ["critical-path bound", bound_s, "", ""],
        ["executor (median)", wall, cpu, cpu_ms_per_step],
        ["asyncio floor (median)", floor_wall, floor_cpu, 1e3 * floor_cpu / steps],
    ]
    notes = [
        f"bound = ceil({WORKFLOWS}/{CONCURRENCY}) x {CRITICAL_PATH_STEPS} x {1e3 * LATENCY_S:.0f} ms "
        f"= {bound_s:.3f} s; "
        f"wall/bound = {wall / bound_s:.2f} (goal <= {WALL_GOAL_RATIO}); "
        f"CPU per step = {cpu_ms_per_step:.3f} ms (goal < {CPU_GOAL_MS_PER_STEP} ms), "
        f"{overhead_ms_per_step:.3f} ms above the asyncio floor.",
        "One event-loop thread: wall >= max(bound, CPU time); on a shared machine the wall also includes time "
        "spent waiting for a core (wall - CPU).",
    ]
    return Report(
        suite="env",
        columns=["run", "wall_s", "cpu_s", "cpu_ms_per_step"],
        rows=rows,
        figures=figures,
        notes=notes,
    )
