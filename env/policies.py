"""Fixed workflows written in the Conductor's own action format.

Template policies are the teacher of the supervised format warm-start (`launch.sft`): with workers drawn uniformly
they give a Conductor that writes valid workflows and routes at random, the starting point RL improves on. The same
builders express the evaluation baselines, so a baseline runs through exactly the executor and graders a trained
Conductor does.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

from env.tasks.base import Task
from env.workflow import Step, Workflow

SOLVE = "Solve the question step by step and give the final answer inside <answer></answer>."


def single(worker: int, instruction: str = SOLVE) -> Workflow:
    """One worker answers the question directly."""
    return Workflow(
        steps=(Step(worker, instruction),),
        reasoning="This question needs one careful answer, so a single model solves it directly.",
    )


def plan_solve_verify(planner: int, solver: int, verifier: int) -> Workflow:
    """A plan, a solution that follows it, and a check that states the final answer."""
    return Workflow(
        steps=(
            Step(planner, "Outline the steps needed to solve the question, without solving it."),
            Step(solver, "Follow the plan to solve the question and give the answer inside <answer></answer>."),
            Step(verifier, "Check the solution for mistakes, fix any, and give the final answer inside "
                           "<answer></answer>.", "all"),
        ),
        reasoning="Planning first, then solving, then verifying catches most mistakes.",
    )


def fan_out_aggregate(proposers: Sequence[int], aggregator: int) -> Workflow:
    """Independent answers from several workers, then one worker that reads them all and decides."""
    if not proposers:
        raise ValueError("fan_out_aggregate needs at least one proposer")
    steps = tuple(Step(worker, SOLVE) for worker in proposers)
    final = Step(
        aggregator,
        "Compare the earlier answers, resolve any disagreement, and give the final answer inside <answer></answer>.",
        "all",
    )
    return Workflow(
        steps=steps + (final,),
        reasoning="Independent attempts followed by an aggregator make the answer more reliable.",
    )


def _random_single(pool_size: int, rng: random.Random) -> Workflow:
    return single(rng.randrange(pool_size))


def _random_plan_solve_verify(pool_size: int, rng: random.Random) -> Workflow:
    return plan_solve_verify(*(rng.randrange(pool_size) for _ in range(3)))


def _random_fan_out(pool_size: int, rng: random.Random) -> Workflow:
    proposers = [rng.randrange(pool_size) for _ in range(rng.choice((2, 3)))]
    return fan_out_aggregate(proposers, rng.randrange(pool_size))


UNIFORM_SHAPE_MAX_STEPS = 3
ANSWER = "Answer the question."
CHECK = "Check the answers above and give the final answer."


def _random_uniform_shape(pool_size: int, rng: random.Random) -> Workflow:
    """1 to UNIFORM_SHAPE_MAX_STEPS steps, uniformly; each step's worker uniform; each later step reads every
    earlier step or none, uniformly. A teacher that favours no workflow size and no access list, so whether reading
    earlier steps pays is left to RL (the plain-text instructions change nothing for a simulated worker)."""
    steps = []
    for index in range(rng.randint(1, UNIFORM_SHAPE_MAX_STEPS)):
        reads = index > 0 and rng.random() < 0.5
        steps.append(Step(rng.randrange(pool_size), CHECK if reads else ANSWER, "all" if reads else ()))
    return Workflow(steps=tuple(steps))


# name -> (pool size, rng) -> a workflow with uniformly drawn workers
TEMPLATES: dict[str, Callable[[int, random.Random], Workflow]] = {
    "single": _random_single,
    "plan_solve_verify": _random_plan_solve_verify,
    "fan_out_aggregate": _random_fan_out,
    "uniform_shape": _random_uniform_shape,
}
# The warm-start's mix unless a run picks its own: the reference's workflow kinds.
DEFAULT_TEMPLATES = ("single", "plan_solve_verify", "fan_out_aggregate")


def random_template(pool_size: int, rng: random.Random, names: Sequence[str] = DEFAULT_TEMPLATES) -> Workflow:
    """A template chosen uniformly from `names`, with workers drawn uniformly from the pool (uniform routing)."""
    if pool_size < 1:
        raise ValueError(f"pool_size must be >= 1, got {pool_size}")
    unknown = set(names) - set(TEMPLATES)
    if unknown or not names:
        raise ValueError(f"unknown templates {sorted(unknown)}; choose from {sorted(TEMPLATES)}")
    return TEMPLATES[rng.choice(list(names))](pool_size, rng)


# -- evaluation baselines ------------------------------------------------------------------------------------------

AGGREGATE = "Compare the earlier answers, resolve any disagreement, and give the final answer inside <answer></answer>."
REVISE = (
    "Review your earlier attempts at the question, find any mistakes, and give a corrected final answer inside "
    "<answer></answer>."
)
CONSENSUS = (
    "Several independent attempts at the question are shown. State the final answer that most of them agree on "
    "inside <answer></answer>."
)


def random_routing(pool_size: int, rng: random.Random) -> Workflow:
    """One step by a worker drawn uniformly from the pool (the reference's random router)."""
    if pool_size < 1:
        raise ValueError(f"pool_size must be >= 1, got {pool_size}")
    return single(rng.randrange(pool_size))


def mixture_of_agents(proposers: Sequence[int], aggregator: int, layers: int = 1) -> Workflow:
    """Mixture-of-Agents: every proposer answers; in each further layer every proposer reads the layer before it;
    then the aggregator reads the last layer and decides. Reading only the previous layer needs fine-grained
    access lists, and the step count (layers x proposers + 1) may exceed the Conductor's step limit."""
    if not proposers:
        raise ValueError("mixture_of_agents needs at least one proposer")
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    width = len(proposers)
    steps = [Step(worker, SOLVE) for worker in proposers]
    for layer in range(1, layers + 1):
        previous_layer = tuple(range((layer - 1) * width, layer * width))
        if layer == layers:
            steps.append(Step(aggregator, AGGREGATE, previous_layer))
        else:
            steps.extend(Step(worker, AGGREGATE, previous_layer) for worker in proposers)
    return Workflow(
        steps=tuple(steps),
        reasoning=f"Mixture-of-Agents with {width} proposers and {layers} layer{'s' if layers > 1 else ''}.",
    )


def self_reflection(worker: int, revisions: int) -> Workflow:
    """One worker answers, then revises `revisions` times, each time reading all its earlier attempts."""
    if revisions < 0:
        raise ValueError(f"revisions must be >= 0, got {revisions}")
    steps = (Step(worker, SOLVE),) + tuple(Step(worker, REVISE, "all") for _ in range(revisions))
    return Workflow(steps=steps, reasoning=f"One model answers and revises its answer {revisions} times.")


def consensus(worker: int, samples: int, judge: int | None = None) -> Workflow:
    """`samples` independent attempts by `worker`, then `judge` (default the same worker) reads them all and
    states the majority answer."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    steps = tuple(Step(worker, SOLVE) for _ in range(samples))
    final = Step(worker if judge is None else judge, CONSENSUS, "all")
    return Workflow(steps=steps + (final,), reasoning=f"{samples} independent samples and a majority decision.")


def oracle_routing(task: Task, worker_models: Sequence[str]) -> Workflow:
    """One step by the worker with the best recorded outcome on this question (`task.metadata["scores"]`, keyed
    by model name; `worker_models[i]` is worker i's model). Ties go to the lowest worker id."""
    scores = task.metadata.get("scores")
    if not scores:
        raise ValueError(f"task {task.id} records no per-model scores, so it has no oracle route")
    missing = [model for model in worker_models if model not in scores]
    if missing:
        raise ValueError(f"task {task.id} records no score for {missing}")
    best = max(range(len(worker_models)), key=lambda w: (scores[worker_models[w]], -w))
    return single(best)
