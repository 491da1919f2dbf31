"""The reference's baselines, scored like a Conductor's completions.

Baselines are fixed workflows in the Conductor's own format (`env.policies`), rendered as text and scored by
`ConductorEnv.score_batch` exactly like a Conductor completion: parsed, executed through the response cache, graded
and rewarded. The scoring env differs only in admitting the baseline's step count and fine-grained access
(Mixture-of-Agents exceeds the Conductor's five steps and reads only the previous layer). A pool worker prompted as
an untrained Conductor (`prompted_conductor_outcomes`) writes its own workflow.

Where a world knows every workflow's exact outcome (the orchestration world) or every call's recorded one (replay),
a contextual UCB1 bandit given a training run's feedback budget (`conductor.bandit`) answers the question a skeptic
asks: does the Conductor learn more than a table of counts per observed context? The orchestration world adds its
exact reference policies (the best fixed workflow per pool, the best per (task, pool), the per-question optimum)
and every method's exact expected reward there (`orchestration_figures`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any, Callable, Sequence

import numpy as np

from conductor import bandit
from conductor.outcomes import Outcome, sample_id, scored_outcome
from conductor.report import summarize
from env import frontier, orchestration, policies
from env.executor import step_seed
from env.gym_env import ConductorEnv
from env.tasks.base import Task
from env.workers.base import WorkerError, WorkerReply
from env.workers.cache import cache_key
from env.workflow import Workflow, render_workflow
from env.worlds import World

BASELINES = (
    "single", "task_best", "random", "oracle", "moa", "self_reflection", "consensus", "prompted_conductor",
    "bandit", "best_fixed", "task_optimum", "optimum",
)

WorkflowChoice = Callable[[Task, int], Workflow]  # (task, repeat) -> the workflow to run


def workflow_outcomes(env: ConductorEnv, choose: WorkflowChoice, repeats: int) -> list[Outcome]:
    """Scores `choose(task, repeat)` for every question and repeat through `ConductorEnv.score_batch`."""
    tasks = env.world.tasks
    jobs = [(q, r, choose(tasks[q], r)) for r in range(repeats) for q in range(len(tasks))]
    longest = max(len(workflow.steps) for _, _, workflow in jobs)
    config = dataclasses.replace(
        env.config, max_steps=max(longest, env.config.max_steps), access_mode="fine", recursion_rounds=0
    )
    scorer = ConductorEnv(env.world, config, env.cache)
    try:
        scored = scorer.score_batch_sync(
            [tasks[q] for q, _, _ in jobs],
            [render_workflow(workflow, "fine") for _, _, workflow in jobs],
            sample_indices=[sample_id(q, r, len(tasks)) for q, r, _ in jobs],
        )
    finally:
        scorer.close()
    return [scored_outcome(tasks[q], r, result) for (q, r, _), result in zip(jobs, scored)]


def oracle_choice(env: ConductorEnv) -> WorkflowChoice | None:
    """The oracle router where the world knows outcomes: the per-task optimal plan of the synthetic world, or
    the recorded best model per question of the replay world; None elsewhere."""
    world = env.world
    if world.oracle is not None:
        plans = world.oracle.plans
        return lambda task, repeat: plans[task.task_label].workflow(policies.SOLVE)
    if all("scores" in task.metadata for task in world.tasks):
        models = [getattr(worker, "model", worker.name) for worker in world.pool]
        return lambda task, repeat: policies.oracle_routing(task, models)
    return None


def bandit_choice(
    env: ConductorEnv, budget: int, seed: int, training: Sequence[Task] | None = None
) -> WorkflowChoice | None:
    """The contextual UCB1 bandit's workflows after `budget` pulls (`conductor.bandit`): on the orchestration world's
    training split, or on a replay world's `training` questions (default: the evaluated ones, in-sample like the
    per-task best worker), answering each evaluated question by its task; None on other worlds."""
    world = env.world
    if world.orchestration is not None:
        if training is not None:
            raise ValueError("the orchestration world's bandit learns on its own training split; give no questions")
        reference = world.orchestration
        training = orchestration.load_tasks(dataclasses.replace(reference.config, split="train"))
        problem = bandit.orchestration_problem(reference, training, env.config.expected_grades)
        statistics = bandit.ucb1(problem, budget, seed)
        return lambda task, repeat: bandit.orchestration_workflow(reference, problem, statistics, task)
    if training is not None and not training:
        raise ValueError("the bandit's training questions are empty")
    replayed = world.tasks if training is None else training
    if world.tasks and all("scores" in task.metadata for task in (*world.tasks, *replayed)):
        models = [getattr(worker, "model", worker.name) for worker in world.pool]
        problem = bandit.replay_problem(replayed, models, env.config.reward)
        statistics = bandit.ucb1(problem, budget, seed)
        return lambda task, repeat: policies.single(bandit.choose(problem, statistics, task.task_label))
    if training is not None:
        raise ValueError(f"the bandit learns on other questions only on a replay world (recorded scores), not on "
                         f"{world.name!r}")
    return None


def orchestration_figures(
    reference: orchestration.OrchestrationReference, tasks: Sequence[Task], outcomes: Sequence[Outcome]
) -> dict[str, Any]:
    """A method's exact figures on the orchestration world: `reward`, the mean exact expected reward of its workflows
    (a format error earns the format-error reward), beside the reference policies' on the same questions, the
    fraction of the gap from the best fixed workflow per pool to the per-question optimum it closes, its share of
    workflows per access pattern (`shapes`) and whether the questions' pools were all held out of training."""
    by_id = {task.id: task for task in tasks}
    rewards = [reference.expected_reward(by_id[outcome.task_id], outcome.workflow) for outcome in outcomes]
    figures = reference.figures(tasks)
    reward = float(np.mean(rewards))
    return {
        "reward": reward,
        **figures,
        "gap_closed": orchestration.gap_closed(reward, figures["best_fixed_reward"], figures["optimum_reward"]),
        "shapes": orchestration.shape_shares([outcome.workflow for outcome in outcomes]),
    }


def recorded_figures(world: World, outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """A method's accuracy and cost per question on a recorded world (zeroeval) beside the exact baselines of the
    same questions' records (`env.frontier`); pool by pool where the questions are offered pools (`env.pools`). The
    outcomes must be one per question, in the world's task order (a greedy evaluation)."""
    by_id = {outcome.task_id: outcome for outcome in outcomes}
    if len(by_id) != len(outcomes) or set(by_id) != {task.id for task in world.tasks}:
        raise ValueError("recorded figures need one outcome per question of the world")
    correct = [by_id[task.id].metrics["correct"] for task in world.tasks]
    cost = [by_id[task.id].metrics.get("cost_usd", 0.0) for task in world.tasks]
    if "pool" in world.tasks[0].metadata:
        return frontier.offered_pool_figures(world.tasks, world.pool, correct, cost)
    return frontier.method_and_baselines(world.tasks, world.pool, correct, cost)


def random_choice(pool_size: int, seed: int) -> WorkflowChoice:
    """Uniform routing, drawn from (seed, task, repeat) so every rerun routes the same way."""
    return lambda task, repeat: policies.random_routing(pool_size, random.Random(f"{seed}/{task.id}/{repeat}"))


# -- a worker prompted as the Conductor ----------------------------------------------------------------------------


async def _prompted_replies(
    env: ConductorEnv, worker_index: int, jobs: Sequence[tuple[int, int]], max_tokens: int
) -> list[WorkerReply | None]:
    worker = env.world.pool[worker_index]
    backend = getattr(worker, "backend", type(worker).__name__)
    model = getattr(worker, "cache_model", worker.name)
    temperature = env.config.executor.temperature
    limit = asyncio.Semaphore(env.config.max_concurrency)
    tasks = env.world.tasks

    async def reply(question: int, repeat: int) -> WorkerReply | None:
        # The full prompt whatever the env's: an untrained model has only the instructions and examples to go on.
        messages = env.observation(tasks[question], prompt="full")["messages"]
        sample = sample_id(question, repeat, len(tasks))
        seed = step_seed(env.config.executor.seed, sample, -1)  # -1: before the workflow's own steps
        key = cache_key(backend, model, messages, max_tokens=max_tokens, temperature=temperature, seed=seed,
                        sample=["conductor", sample])  # fmt: skip
        async with limit:
            if env.cache is not None and (cached := await env.cache.get(key)) is not None:
                return cached
            try:
                answer = await worker.complete(
                    messages, max_tokens=max_tokens, temperature=temperature, seed=seed, task=tasks[question]
                )
            except WorkerError:
                return None
            if env.cache is not None:
                await env.cache.put(key, backend, model, answer)
            return answer

    try:
        return await asyncio.gather(*(reply(q, r) for q, r in jobs))
    finally:
        close = getattr(worker, "aclose", None)
        if close is not None:
            await close()


def prompted_conductor_outcomes(
    env: ConductorEnv, worker_index: int, repeats: int, max_tokens: int = 1024
) -> list[Outcome]:
    """Pool worker `worker_index` is sent the Conductor prompt; its reply is parsed and executed as a Conductor
    completion. A failed call scores as an empty completion (a format error). Its own tokens and price are
    reported as `conductor_tokens` and added to `cost_usd`."""
    if not 0 <= worker_index < len(env.world.pool):
        raise ValueError(f"worker {worker_index} is outside the pool of {len(env.world.pool)}")
    tasks = env.world.tasks
    jobs = [(q, r) for r in range(repeats) for q in range(len(tasks))]
    replies = asyncio.run(_prompted_replies(env, worker_index, jobs, max_tokens))
    scored = env.score_batch_sync(
        [tasks[q] for q, _ in jobs],
        [reply.text if reply is not None else "" for reply in replies],
        sample_indices=[sample_id(q, r, len(tasks)) for q, r in jobs],
    )
    outcomes = []
    for (q, r), reply, result in zip(jobs, replies, scored):
        outcome = scored_outcome(
            tasks[q], r, result,
            conductor_tokens=float(reply.prompt_tokens + reply.completion_tokens) if reply else 0.0,
            conductor_failed=float(reply is None),
        )  # fmt: skip
        if reply is not None:
            metrics = dict(outcome.metrics)
            metrics["cost_usd"] = metrics.get("cost_usd", 0.0) + reply.cost_usd
            outcome = dataclasses.replace(outcome, metrics=metrics)
        outcomes.append(outcome)
    return outcomes


# -- every baseline ------------------------------------------------------------------------------------------------


# The task label was once called the domain (issue 63: one name per concept).
RENAMED_BASELINES = {"domain_best": "task_best", "domain_optimum": "task_optimum"}


@dataclasses.dataclass(frozen=True)
class BaselineConfig:
    """Which baselines run and their sizes. `worker` runs self-reflection and consensus and aggregates
    Mixture-of-Agents; None means the best single worker measured in the same run."""

    baselines: tuple[str, ...] = BASELINES
    moa_layers: int = 1
    reflection_revisions: int = 2
    consensus_samples: int = 3
    worker: int | None = None
    prompted_conductors: tuple[int, ...] = (0,)
    prompted_max_tokens: int = 1024
    bandit_budget: int = 1920
    seed: int = 0

    def __post_init__(self) -> None:
        renamed = [f"{old} is renamed to {RENAMED_BASELINES[old]}" for old in self.baselines if old in RENAMED_BASELINES]
        if renamed:
            raise ValueError("; ".join(renamed))
        unknown = sorted(set(self.baselines) - set(BASELINES))
        if unknown:
            raise ValueError(f"unknown baselines {unknown}; choose from {list(BASELINES)}")
        if self.moa_layers < 1 or self.consensus_samples < 1 or self.reflection_revisions < 0:
            raise ValueError("need moa_layers >= 1, consensus_samples >= 1 and reflection_revisions >= 0")
        if self.prompted_max_tokens < 1:
            raise ValueError(f"prompted_max_tokens must be >= 1, got {self.prompted_max_tokens}")
        if self.bandit_budget < 1:
            raise ValueError(f"bandit_budget must be >= 1, got {self.bandit_budget}")


def run_baselines(
    env: ConductorEnv, config: BaselineConfig, repeats: int, bandit_training: Sequence[Task] | None = None
) -> dict[str, dict[str, Any]]:
    """Method name -> `summarize` report, for every baseline in `config` that the world supports; a replay world's
    bandit learns on `bandit_training` where given (`bandit_choice`)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    pool = env.world.pool
    names = [worker.name for worker in pool]
    for index in (config.worker, *config.prompted_conductors):
        if index is not None and not 0 <= index < len(pool):
            raise ValueError(f"worker {index} is outside the pool of {len(pool)}")
    results: dict[str, dict[str, Any]] = {}
    reference = env.world.orchestration

    def run(method: str, choose: WorkflowChoice) -> None:
        outcomes = workflow_outcomes(env, choose, repeats)
        results[method] = summarize(outcomes, names)
        if reference is not None:
            results[method]["orchestration"] = orchestration_figures(reference, env.world.tasks, outcomes)

    needs_best = config.worker is None and {"moa", "self_reflection", "consensus"} & set(config.baselines)
    singles = {}
    if {"single", "task_best"} & set(config.baselines) or needs_best:
        for w in range(len(pool)):
            outcomes = workflow_outcomes(env, lambda task, repeat, w=w: policies.single(w), repeats)
            singles[w] = summarize(outcomes, names)
        if "single" in config.baselines:
            results.update({f"single {w}: {names[w]}": report for w, report in singles.items()})
    if "task_best" in config.baselines:
        # Each task to the worker with the best accuracy on it in this run: the most any Conductor whose choice
        # depends only on the question's task can reach (measured in-sample, like the best single worker).
        task_labels = singles[0]["tasks"]
        best = {d: max(singles, key=lambda w, d=d: singles[w]["tasks"][d]["correct"]) for d in task_labels}
        run("per-task best worker", lambda task, repeat: policies.single(best[task.task_label]))
    worker = config.worker
    if needs_best:
        worker = max(singles, key=lambda w: singles[w]["average_accuracy"])
    if "random" in config.baselines:
        run("random routing", random_choice(len(pool), config.seed))
    if "oracle" in config.baselines and (oracle := oracle_choice(env)) is not None:
        run("oracle routing", oracle)
    if "moa" in config.baselines:
        moa = policies.mixture_of_agents(range(len(pool)), worker, config.moa_layers)
        run(f"MoA ({config.moa_layers} layer, aggregator {worker})", lambda task, repeat: moa)
    if "self_reflection" in config.baselines:
        reflection = policies.self_reflection(worker, config.reflection_revisions)
        run(f"self-reflection ({config.reflection_revisions} revisions, worker {worker})",
            lambda task, repeat: reflection)  # fmt: skip
    if "consensus" in config.baselines:
        vote = policies.consensus(worker, config.consensus_samples)
        run(f"consensus ({config.consensus_samples} samples, worker {worker})", lambda task, repeat: vote)
    if reference is not None:
        for method, name, policy in (
            ("best_fixed", "best fixed workflow per pool", reference.fixed),
            ("task_optimum", "best workflow per (task, pool)", reference.per_task),
            ("optimum", "per-question optimum", reference.per_question),
        ):
            if method in config.baselines:
                run(name, lambda task, repeat, policy=policy: policy(task).workflow)
    if "bandit" in config.baselines and (
        ucb := bandit_choice(env, config.bandit_budget, config.seed, bandit_training)
    ) is not None:
        where = "" if bandit_training is None else f", learned on {len(bandit_training)} other questions"
        run(f"contextual UCB1 ({config.bandit_budget} pulls{where})", ucb)
    if "prompted_conductor" in config.baselines:
        for w in config.prompted_conductors:
            outcomes = prompted_conductor_outcomes(env, w, repeats, config.prompted_max_tokens)
            results[f"prompted Conductor: worker {w}"] = summarize(outcomes, names)
    return results
