"""Outcomes: one scored answer per question and repeat, every method's through the env path training uses, and a
Conductor's (`conductor_outcomes`), each an episode over the recursion rounds the env runs."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from conductor.loop_environment import TokenizedConductorEnv, rollout_metrics
from env.gym_env import Scored
from env.tasks.base import Task
from env.workflow import Workflow
from rl.loop import Rollout
from rollout.types import SamplingParams

# Sample ids of evaluation rollouts start here, apart from training's, so cache keys and worker seeds never collide.
# Sample (question q, repeat r) is EVAL_SAMPLE_ID_BASE + r * questions + q for every method, so two methods that
# make the same call on the same question and repeat share its cached reply (common random numbers).
EVAL_SAMPLE_ID_BASE = 10**12
# A Conductor's later recursion rounds draw their workers afresh, as training's do: round k's sample ids are round 0's
# plus k times this.
EVAL_ROUND_SAMPLE_ID_STRIDE = 10**9


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One scored answer: its rollout metrics (`conductor.loop_environment.rollout_metrics`), the workers its steps
    used and its (last round's) workflow, None after a format error."""

    task_id: str
    task_label: str
    repeat: int
    metrics: Mapping[str, float]
    workers: tuple[int, ...]
    workflow: Workflow | None = None


def scored_outcome(task: Task, repeat: int, scored: Scored, **extra: float) -> Outcome:
    metrics = {**rollout_metrics(scored), **extra}
    workers = tuple(step.worker for step in scored.workflow.steps) if scored.workflow else ()
    return Outcome(task.id, task.task_label, repeat, metrics, workers, scored.workflow)


def sample_id(question: int, repeat: int, num_questions: int) -> int:
    return EVAL_SAMPLE_ID_BASE + repeat * num_questions + question


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
    workflows = [r.rollout.context.workflow for r in rounds]
    workers = tuple(step.worker for workflow in workflows if workflow is not None for step in workflow.steps)
    return Outcome(task.id, task.task_label, repeat, metrics, workers, workflows[-1])


def _token_masks(environment: TokenizedConductorEnv, questions: Sequence[int]) -> list[Any] | None:
    return [environment.token_mask(q) for q in questions] if environment.masked else None


def _episodes(
    generator: Any, environment: TokenizedConductorEnv, params: SamplingParams, repeat: int, first_question: int,
    questions: Sequence[int], completions: Sequence[Sequence[int]],
) -> list[list[_Round]]:
    """Scores the first-round `completions` and runs the recursion rounds the env asks for (`--recursion_rounds`):
    each round the world gives a follow-up prompt gets one completion, scored on the round before it."""
    sample_ids = [sample_id(q, repeat, environment.num_questions) for q in questions]
    rollouts = environment.score(questions, completions, None, sample_ids)
    episodes = [[_Round(environment.prompt_ids(q), c, r)] for q, c, r in zip(questions, completions, rollouts)]
    round_index = 0
    while following := [i for i, rounds in enumerate(episodes) if rounds[-1].rollout.followup_prompt_ids is not None]:
        round_index += 1
        prompts = [list(episodes[i][-1].rollout.followup_prompt_ids) for i in following]
        follow_questions = [questions[i] for i in following]
        masks = _token_masks(environment, follow_questions)
        groups = generator.generate(
            prompts, _batch_seeded(params, repeat, first_question, round_index), 1, token_masks=masks
        )
        sample_ids = [
            sample_id(q, repeat, environment.num_questions) + round_index * EVAL_ROUND_SAMPLE_ID_STRIDE
            for q in follow_questions
        ]
        contexts = [episodes[i][-1].rollout.context for i in following]
        follow_completions = [group[0].completion_ids for group in groups]
        scored = environment.score(follow_questions, follow_completions, contexts, sample_ids)
        for i, prompt, completion, rollout in zip(following, prompts, follow_completions, scored):
            episodes[i].append(_Round(prompt, completion, rollout))
    return episodes


def conductor_outcomes(
    generator: Any, environment: TokenizedConductorEnv, params: SamplingParams, repeats: int, batch_questions: int = 64,
) -> list[Outcome]:
    """One episode per question and repeat: a completion sampled from `generator` and scored by the env, and the
    recursion rounds the env runs after it (`_episode_outcome`). The Conductor's own prompt and completion tokens
    are `conductor_tokens`.

    Greedy decoding (temperature 0) writes the same completion every repeat, so it is generated once and only the
    workers' outcomes are drawn per repeat; a sampled Conductor draws a new completion each repeat.
    Every round decodes under the environment's token masks, if it has them (`TokenizedConductorEnv.token_mask`).
    """
    outcomes = []
    greedy_completions: dict[int, list[int]] = {}
    for repeat in range(repeats):
        for start in range(0, environment.num_questions, batch_questions):
            questions = list(range(start, min(start + batch_questions, environment.num_questions)))
            if params.temperature == 0 and repeat > 0:
                completions = [greedy_completions[q] for q in questions]
            else:
                prompts = [environment.prompt_ids(q) for q in questions]
                masks = _token_masks(environment, questions)
                groups = generator.generate(
                    prompts, _batch_seeded(params, repeat, start), 1, token_masks=masks
                )
                completions = [group[0].completion_ids for group in groups]
                greedy_completions.update(zip(questions, completions))
            episodes = _episodes(
                generator, environment, params, repeat, start, questions, completions
            )
            outcomes.extend(
                _episode_outcome(environment.tasks[q], repeat, rounds) for q, rounds in zip(questions, episodes)
            )
    return outcomes
