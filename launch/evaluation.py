"""Evaluation of a Conductor and of the reference's baselines through the same env path training uses.

Every method yields `Outcome`s (one scored answer per question and repeat) and `summarize` turns any list of them
into the same report: per-domain and average accuracy (standard error over repeats), worker tokens, worker calls,
USD and steps per question, format validity and the distribution of the workers chosen.

Baselines are fixed workflows in the Conductor's own format (`env.policies`). They are rendered as text and scored
by `ConductorEnv.score_batch` exactly like a Conductor completion: parsed, executed through the response cache,
graded and rewarded. The scoring env differs only in admitting the baseline's step count and fine-grained access
(Mixture-of-Agents exceeds the Conductor's five steps and reads only the previous layer).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import pathlib
import random
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from env import policies, prompts
from env.executor import step_seed
from env.gym_env import ConductorEnv, Scored
from env.tasks.base import Task
from env.tasks.synthetic import load_synthetic
from env.workers.base import WorkerError, WorkerReply
from env.workers.cache import cache_key
from env.workflow import AccessMode, Workflow, WorkflowFormatError, parse_workflow, render_workflow
from launch.common import EnvWorld, rollout_metrics
from models.tokenizer import render_chat
from rl.loop import Rollout
from rollout.types import SamplingParams

# Sample ids of evaluation rollouts start here, apart from training's, so cache keys and worker seeds never collide.
# Sample (question q, repeat r) is EVAL_SAMPLE_ID_BASE + r * questions + q for every method, so two methods that
# make the same call on the same question and repeat share its cached reply (common random numbers).
EVAL_SAMPLE_ID_BASE = 10**12
# A Conductor's later recursion rounds draw their workers afresh, as training's do: round k's sample ids are round 0's
# plus k times this.
EVAL_ROUND_SAMPLE_ID_STRIDE = 10**9

BASELINES = (
    "single", "domain_best", "random", "oracle", "moa", "self_reflection", "consensus", "prompted_conductor"
)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One scored answer: the rollout metrics of `launch.common.rollout_metrics` and the workers its steps used."""

    task_id: str
    domain: str
    repeat: int
    metrics: Mapping[str, float]
    workers: tuple[int, ...]


def _outcome(task: Task, repeat: int, scored: Scored, **extra: float) -> Outcome:
    metrics = {**rollout_metrics(scored), **extra}
    workers = tuple(step.worker for step in scored.workflow.steps) if scored.workflow else ()
    return Outcome(task.id, task.domain, repeat, metrics, workers)


def sample_id(question: int, repeat: int, num_questions: int) -> int:
    return EVAL_SAMPLE_ID_BASE + repeat * num_questions + question


def _stderr(values: Sequence[float]) -> float | None:
    return float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else None


def summarize(outcomes: Sequence[Outcome], worker_names: Sequence[str]) -> dict[str, Any]:
    """The report of one method. Per domain: the mean of every metric over questions and repeats, and
    `correct_stderr`, the standard error of the domain's accuracy over repeats (None with one repeat). `average`:
    the unweighted mean of the domain means, `correct_stderr` over repeats of that average. `workers_chosen`: the
    fraction of all steps run by each worker; `workers_chosen_by_domain`: the same within each domain."""
    if not outcomes:
        raise ValueError("no outcomes to summarize")
    by_domain: dict[str, list[Outcome]] = collections.defaultdict(list)
    for outcome in outcomes:
        by_domain[outcome.domain].append(outcome)
    repeats = sorted({outcome.repeat for outcome in outcomes})
    names = sorted({name for outcome in outcomes for name in outcome.metrics})
    domains: dict[str, dict[str, Any]] = {}
    per_repeat_accuracy: dict[str, list[float]] = {}
    for domain, rows in sorted(by_domain.items()):
        domains[domain] = {name: float(np.mean([row.metrics.get(name, 0.0) for row in rows])) for name in names}
        per_repeat_accuracy[domain] = [
            float(np.mean([row.metrics["correct"] for row in rows if row.repeat == repeat])) for repeat in repeats
        ]
        domains[domain]["correct_stderr"] = _stderr(per_repeat_accuracy[domain])
        domains[domain]["questions"] = len(rows) // len(repeats)
    average = {name: float(np.mean([domains[d][name] for d in domains])) for name in names}
    average_by_repeat = np.mean([per_repeat_accuracy[d] for d in domains], axis=0)
    average["correct_stderr"] = _stderr(list(average_by_repeat))

    def shares(rows: Sequence[Outcome]) -> dict[str, float]:
        counts = collections.Counter(worker for outcome in rows for worker in outcome.workers)
        total_steps = sum(counts.values())
        return {worker_names[w]: counts[w] / total_steps for w in range(len(worker_names)) if counts[w]}

    return {
        "questions": len({outcome.task_id for outcome in outcomes}),
        "repeats": len(repeats),
        "domains": domains,
        "average": average,
        "average_accuracy": average["correct"],
        "average_accuracy_stderr": average["correct_stderr"],
        "workers_chosen": shares(outcomes),
        "workers_chosen_by_domain": {domain: shares(rows) for domain, rows in sorted(by_domain.items())},
    }


# -- a Conductor ---------------------------------------------------------------------------------------------------


def _batch_seeded(params: SamplingParams, repeat: int, first_question: int, round_index: int = 0) -> SamplingParams:
    """`params` with a seed of this batch, repeat and recursion round's own, derived from the given one: a seeded
    sampler (the torch generator, SGLang's per-row seeds) draws the same uniforms from the same seed, so one seed for
    every call would make the repeats copies of each other and tie each batch's rows to the same rows of every other
    batch."""
    if params.seed is None:
        return params
    entropy = [params.seed, repeat, first_question] + ([round_index] if round_index else [])
    seed = int(np.random.SeedSequence(entropy).generate_state(1)[0] >> 1)
    return dataclasses.replace(params, seed=seed)


# An episode's work, summed over its Conductor rounds; its other metrics are its last round's.
EPISODE_TOTALS = ("steps", "worker_calls", "tokens", "cost_usd", "failed_steps", "conductor_tokens")


@dataclasses.dataclass(frozen=True)
class _Round:
    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    rollout: Rollout  # its context is the env's Scored


def _episode_outcome(task: Task, repeat: int, rounds: Sequence[_Round]) -> Outcome:
    """The outcome of one question's episode: the last round's answer, grade, format and reward (the env's, which
    blends in the earlier rounds'), the work of every round, and the workers of every round's steps."""
    per_round = [
        {**rollout_metrics(r.rollout.context), "conductor_tokens": float(len(r.prompt_ids) + len(r.completion_ids))}
        for r in rounds
    ]
    metrics = {**per_round[-1], "reward": float(rounds[-1].rollout.reward), "rounds": float(len(rounds))}
    metrics |= {name: float(sum(m.get(name, 0.0) for m in per_round)) for name in EPISODE_TOTALS}
    workers = tuple(worker for r in rounds for worker in r.rollout.workers)
    return Outcome(task.id, task.domain, repeat, metrics, workers)


def _episodes(
    generator: Any, world: EnvWorld, params: SamplingParams, repeat: int, first_question: int,
    questions: Sequence[int], completions: Sequence[Sequence[int]],
) -> list[list[_Round]]:
    """Scores the first-round `completions` and runs the recursion rounds the env asks for (`--recursion_rounds`):
    each round the world gives a follow-up prompt gets one completion, scored on the round before it."""
    rollouts = world.score(questions, completions, None, [sample_id(q, repeat, world.num_questions) for q in questions])
    episodes = [[_Round(world.prompt_ids(q), c, r)] for q, c, r in zip(questions, completions, rollouts)]
    round_index = 0
    while following := [i for i, rounds in enumerate(episodes) if rounds[-1].rollout.followup_prompt_ids is not None]:
        round_index += 1
        prompts = [list(episodes[i][-1].rollout.followup_prompt_ids) for i in following]
        groups = generator.generate(prompts, _batch_seeded(params, repeat, first_question, round_index), 1)
        follow_questions = [questions[i] for i in following]
        sample_ids = [
            sample_id(q, repeat, world.num_questions) + round_index * EVAL_ROUND_SAMPLE_ID_STRIDE
            for q in follow_questions
        ]
        contexts = [episodes[i][-1].rollout.context for i in following]
        follow_completions = [group[0].completion_ids for group in groups]
        scored = world.score(follow_questions, follow_completions, contexts, sample_ids)
        for i, prompt, completion, rollout in zip(following, prompts, follow_completions, scored):
            episodes[i].append(_Round(prompt, completion, rollout))
    return episodes


def conductor_outcomes(
    generator: Any, world: EnvWorld, params: SamplingParams, repeats: int, batch_questions: int = 64
) -> list[Outcome]:
    """One episode per question and repeat: a completion sampled from `generator` and scored by the env, and the
    recursion rounds the env runs after it (`_episode_outcome`). The Conductor's own prompt and completion tokens
    are `conductor_tokens`.

    Greedy decoding (temperature 0) writes the same completion every repeat, so it is generated once and only the
    workers' outcomes are drawn per repeat; a sampled Conductor draws a new completion each repeat.
    """
    outcomes = []
    greedy_completions: dict[int, list[int]] = {}
    for repeat in range(repeats):
        for start in range(0, world.num_questions, batch_questions):
            questions = list(range(start, min(start + batch_questions, world.num_questions)))
            if params.temperature == 0 and repeat > 0:
                completions = [greedy_completions[q] for q in questions]
            else:
                prompts = [world.prompt_ids(q) for q in questions]
                groups = generator.generate(prompts, _batch_seeded(params, repeat, start), 1)
                completions = [group[0].completion_ids for group in groups]
                greedy_completions.update(zip(questions, completions))
            episodes = _episodes(generator, world, params, repeat, start, questions, completions)
            outcomes.extend(_episode_outcome(world.tasks[q], repeat, rounds) for q, rounds in zip(questions, episodes))
    return outcomes


def evaluate(
    generator: Any,
    world: EnvWorld,
    *,
    params: SamplingParams,
    repeats: int = 1,
    batch_questions: int = 64,
) -> dict[str, Any]:
    """Samples one completion per question with `params` (the Conductor's own completion limit: a default would
    hold a non-stopping small Conductor for 1024 steps), `repeats` times, scores it and summarizes it."""
    outcomes = conductor_outcomes(generator, world, params, repeats, batch_questions)
    return summarize(outcomes, [worker.name for worker in world.env.world.pool])


# -- format validity -----------------------------------------------------------------------------------------------


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
            render_chat(tokenizer, prompts.conductor_messages(q, pool_size, max_steps, access_mode),
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


# -- fixed workflows -----------------------------------------------------------------------------------------------

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
    return [_outcome(tasks[q], r, result) for (q, r, _), result in zip(jobs, scored)]


def oracle_choice(env: ConductorEnv) -> WorkflowChoice | None:
    """The oracle router where the world knows outcomes: the per-domain optimal plan of the synthetic world, or
    the recorded best model per question of the replay world; None elsewhere."""
    world = env.world
    if world.oracle is not None:
        plans = world.oracle.plans
        return lambda task, repeat: plans[task.domain].workflow(policies.SOLVE)
    if all("scores" in task.metadata for task in world.tasks):
        models = [getattr(worker, "model", worker.name) for worker in world.pool]
        return lambda task, repeat: policies.oracle_routing(task, models)
    return None


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
        messages = env.observation(tasks[question])["messages"]
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
        outcome = _outcome(
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
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.baselines) - set(BASELINES))
        if unknown:
            raise ValueError(f"unknown baselines {unknown}; choose from {list(BASELINES)}")
        if self.moa_layers < 1 or self.consensus_samples < 1 or self.reflection_revisions < 0:
            raise ValueError("need moa_layers >= 1, consensus_samples >= 1 and reflection_revisions >= 0")
        if self.prompted_max_tokens < 1:
            raise ValueError(f"prompted_max_tokens must be >= 1, got {self.prompted_max_tokens}")


def run_baselines(env: ConductorEnv, config: BaselineConfig, repeats: int) -> dict[str, dict[str, Any]]:
    """Method name -> `summarize` report, for every baseline in `config` that the world supports."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    pool = env.world.pool
    names = [worker.name for worker in pool]
    for index in (config.worker, *config.prompted_conductors):
        if index is not None and not 0 <= index < len(pool):
            raise ValueError(f"worker {index} is outside the pool of {len(pool)}")
    results: dict[str, dict[str, Any]] = {}

    def run(method: str, choose: WorkflowChoice) -> None:
        results[method] = summarize(workflow_outcomes(env, choose, repeats), names)

    needs_best = config.worker is None and {"moa", "self_reflection", "consensus"} & set(config.baselines)
    singles = {}
    if {"single", "domain_best"} & set(config.baselines) or needs_best:
        for w in range(len(pool)):
            outcomes = workflow_outcomes(env, lambda task, repeat, w=w: policies.single(w), repeats)
            singles[w] = summarize(outcomes, names)
        if "single" in config.baselines:
            results.update({f"single {w}: {names[w]}": report for w, report in singles.items()})
    if "domain_best" in config.baselines:
        # Each domain to the worker with the best accuracy on it in this run: the most any Conductor whose choice
        # depends only on the question's domain can reach (measured in-sample, like the best single worker).
        domains = singles[0]["domains"]
        best = {d: max(singles, key=lambda w, d=d: singles[w]["domains"][d]["correct"]) for d in domains}
        run("per-domain best worker", lambda task, repeat: policies.single(best[task.domain]))
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
    if "prompted_conductor" in config.baselines:
        for w in config.prompted_conductors:
            outcomes = prompted_conductor_outcomes(env, w, repeats, config.prompted_max_tokens)
            results[f"prompted Conductor: worker {w}"] = summarize(outcomes, names)
    return results


# -- reports -------------------------------------------------------------------------------------------------------


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def markdown_report(results: Mapping[str, Mapping[str, Any]], title: str) -> str:
    """Two tables: the averages with costs and workflow shape, then accuracy per task; then workers chosen."""
    domains = sorted({domain for report in results.values() for domain in report["domains"]})
    lines = [
        f"# {title}",
        "",
        "Accuracy in %, ± standard error over repeats; worker tokens, USD, steps (one worker call each) and "
        "provider calls (calls the response cache did not answer) are per question; averages are unweighted over "
        "tasks.",
        "",
        "| method | accuracy | tokens | USD | steps | provider calls | valid format |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, report in results.items():
        average = report["average"]
        stderr = average["correct_stderr"]
        accuracy = _percent(average["correct"]) + ("" if stderr is None else f" ± {_percent(stderr)}")
        lines.append(
            f"| {method} | {accuracy} | {average.get('tokens', 0.0):.0f} | {average.get('cost_usd', 0.0):.5f} | "
            f"{average['steps']:.2f} | {average.get('worker_calls', 0.0):.2f} | {_percent(average['valid_format'])} |"
        )
    lines += ["", "| method | " + " | ".join(domains) + " |", "|---|" + "---|" * len(domains)]
    for method, report in results.items():
        cells = [_percent(report["domains"][d]["correct"]) if d in report["domains"] else "–" for d in domains]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "Workers chosen (share of all steps, %):", ""]

    def listed(shares: Mapping[str, float]) -> str:
        return ", ".join(f"{name} {_percent(share)}" for name, share in shares.items()) or "no steps"

    for method, report in results.items():
        lines.append(f"- {method}: {listed(report['workers_chosen'])}")
        by_domain = report["workers_chosen_by_domain"]
        if len({listed(shares) for shares in by_domain.values()}) > 1:  # routing that differs between domains
            lines += [f"  - {domain}: {listed(shares)}" for domain, shares in by_domain.items()]
    return "\n".join(lines) + "\n"


def plot_accuracy_tokens(results: Mapping[str, Mapping[str, Any]], path: pathlib.Path, title: str) -> None:
    """Side-by-side horizontal bars per method: average accuracy (with standard error) and tokens per question."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    methods = list(results)
    accuracy = [100 * results[m]["average"]["correct"] for m in methods]
    errors = [100 * (results[m]["average"]["correct_stderr"] or 0.0) for m in methods]
    tokens = [results[m]["average"].get("tokens", 0.0) for m in methods]
    height = max(3.0, 0.4 * len(methods) + 1.5)
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(12, height), sharey=True)
    positions = np.arange(len(methods))
    left.barh(positions, accuracy, xerr=errors, color="tab:blue")
    left.set_xlabel("accuracy (%)")
    left.set_yticks(positions, methods)
    left.invert_yaxis()
    right.barh(positions, tokens, color="tab:orange")
    right.set_xlabel("worker tokens per question")
    left.set_xlim(0, 105)
    panels = ((left, accuracy, errors, "{:.1f}"), (right, tokens, [0.0] * len(tokens), "{:.0f}"))
    for axis, values, offsets, fmt in panels:
        for position, value, offset in zip(positions, values, offsets):
            axis.annotate(fmt.format(value), (value + offset, position), xytext=(3, 0), textcoords="offset points",
                          va="center", fontsize=8)  # fmt: skip
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


def write_report(results: Mapping[str, Mapping[str, Any]], out_dir: pathlib.Path, title: str) -> dict[str, str]:
    """results.json, results.md and accuracy_tokens.png under `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "results.json",
        "markdown": out_dir / "results.md",
        "plot": out_dir / "accuracy_tokens.png",
    }
    paths["json"].write_text(json.dumps({"title": title, "methods": results}, indent=2, sort_keys=False))
    paths["markdown"].write_text(markdown_report(results, title))
    plot_accuracy_tokens(results, paths["plot"], title)
    return {kind: str(path) for kind, path in paths.items()}
