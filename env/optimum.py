"""Exact expected rewards of fixed workflows in a world of simulated workers, and the best fixed workflow.

A simulated worker's call is right with a probability that depends only on its skill on the question's task and on
whether any response it reads is right (`AnswerModel.p_correct`). A workflow's outcome is therefore a random vector of
right/wrong step outcomes, and step i's outcome depends on the earlier ones only through "some step I read is right".
`final_p_correct` sums over all 2^k outcome vectors of a k-step workflow, each weighted by the product of its steps'
conditional probabilities: exact, no sampling. Wrong responses never contain the reference response (they grade 0),
so "reads a right response" is exactly "reads a step whose outcome is right"; a Conductor-written instruction that
itself held the gold answer would break this, which a Conductor that never sees the answer cannot write.

`best_fixed_workflow` searches every workflow shape up to `max_steps`: each step's worker, and each step's access
list (binary mode: "all" or nothing, step 0 always nothing; fine mode: any subset of the earlier steps). Shapes that
share a prefix share its outcome distribution, so the search extends one distribution per prefix.

`reward_table` gives every candidate workflow's exact expected reward in every context of a world whose workers
charge a fixed price per call (so a USD penalty is exact too): what the orchestration world (`env.orchestration`)
compares its fixed, per-task and per-question optima on. `access_pattern` names a workflow's topology apart from
its workers.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator, Mapping, Sequence

import numpy as np

from env.rewards import RewardConfig
from env.workers.simulated import AnswerModel
from env.workflow import ACCESS_MODES, AccessMode, Step, Workflow

# An instruction changes nothing for a simulated worker; these only make the found workflows readable.
_ANSWER = "Solve the question and give the final answer."
_READ = "Read the earlier answers, check them, and give the final answer."
# Reward differences below this are float rounding: the shorter workflow wins such a tie.
_TIE = 1e-12


@dataclasses.dataclass(frozen=True)
class FixedWorkflowOptimum:
    """The best single workflow for every question of the mix, its exact expected reward and probability of a right
    final answer (both averaged over the tasks by weight), and how many workflow shapes were compared."""

    workflow: Workflow
    expected_reward: float
    p_correct: float
    shapes_searched: int


def final_p_correct(workflow: Workflow, skills: Sequence[float], answer_model: AnswerModel) -> float:
    """The exact probability that the last step's answer is right, on a question where worker w is right alone with
    probability `skills[w]`."""
    return float(_final_p_correct_by_task(workflow, np.asarray([skills], dtype=np.float64), answer_model)[0])


def expected_reward(
    workflow: Workflow,
    skills: Mapping[str, Sequence[float]],
    task_weights: Mapping[str, float],
    answer_model: AnswerModel,
    reward_config: RewardConfig,
) -> float:
    """The exact expected reward of answering every question with `workflow`: `skills[task][w]` is worker w's
    skill on the task, `task_weights` the task mix."""
    _, matrix, weights = _task_arrays(skills, task_weights)
    p_correct = _final_p_correct_by_task(workflow, matrix, answer_model)
    return _reward(float(weights @ p_correct), len(workflow.steps), reward_config)


def best_fixed_workflow(
    skills: Mapping[str, Sequence[float]],
    task_weights: Mapping[str, float],
    answer_model: AnswerModel,
    reward_config: RewardConfig,
    max_steps: int,
    access_mode: AccessMode = "binary",
) -> FixedWorkflowOptimum:
    """The workflow with the highest exact expected reward when every question gets it, by exhaustive search over
    every shape of 1 to `max_steps` steps (`workflow_shapes` lists them, `shape_count` counts them); ties go to fewer
    steps, then to lower workers and shorter access lists. Token and cost penalties depend on the text a policy
    writes, so they must be zero here."""
    if reward_config.token_penalty or reward_config.usd_penalty:
        raise ValueError("the optimum is exact only without token or USD penalties")
    _check_search(max_steps, access_mode)
    task_labels, matrix, weights = _task_arrays(skills, task_weights)
    pool_size = matrix.shape[1]
    adopted = np.asarray([[answer_model.p_correct(s, True) for s in row] for row in matrix])
    best: tuple[float, float, tuple[Step, ...]] | None = None
    searched = 0
    # Depth-first over prefixes: `outcomes[d, v]` is the probability, on task d, that the steps so far came out as
    # the bit vector v (bit i: step i right).
    stack: list[tuple[tuple[Step, ...], np.ndarray]] = [((), np.ones((len(task_labels), 1)))]
    while stack:
        steps, outcomes = stack.pop()
        index = len(steps)
        for worker in range(pool_size):
            for access in _access_choices(index, access_mode):
                extended = _extend(outcomes, _reads_right(index, access), matrix[:, worker], adopted[:, worker])
                shape = (*steps, Step(worker, _READ if access else _ANSWER, access))
                searched += 1
                p_correct = float(weights @ extended[:, 1 << index :].sum(axis=1))
                reward = _reward(p_correct, index + 1, reward_config)
                better = best is None or reward > best[0] + _TIE
                if better or (abs(reward - best[0]) <= _TIE and _before(shape, best[2])):
                    best = (reward, p_correct, shape)
                if index + 1 < max_steps:
                    stack.append((shape, extended))
    assert best is not None
    return FixedWorkflowOptimum(Workflow(steps=best[2]), best[0], best[1], searched)


def reward_table(
    candidates: Sequence[Workflow],
    skills: np.ndarray,
    call_costs: Sequence[float],
    answer_model: AnswerModel,
    reward_config: RewardConfig,
) -> tuple[np.ndarray, np.ndarray]:
    """(p_correct[c, w], reward[c, w]): candidate w's exact probability of a right final answer and expected reward in
    context c, where `skills[c, j]` is pool worker j's skill there and `call_costs[j]` the USD it charges per call.
    The reward subtracts the step penalty and the USD penalty times the summed call costs; a token penalty depends on
    the text and is refused."""
    if reward_config.token_penalty:
        raise ValueError("the reward table is exact only without a token penalty")
    matrix = np.asarray(skills, dtype=np.float64)
    costs = np.asarray(call_costs, dtype=np.float64)
    if matrix.ndim != 2 or costs.shape != (matrix.shape[1],):
        raise ValueError(f"skills must be [contexts, workers] and call_costs one per worker, got {matrix.shape}, "
                         f"{costs.shape}")
    if np.any(costs < 0):
        raise ValueError("call costs must be >= 0")
    if not candidates:
        raise ValueError("no candidate workflows")
    p_correct = np.stack([_final_p_correct_by_task(w, matrix, answer_model) for w in candidates], axis=1)
    spent = np.asarray([costs[[step.worker for step in w.steps]].sum() for w in candidates])
    steps = np.asarray([len(w.steps) for w in candidates], dtype=np.float64)
    reward = (
        reward_config.wrong + (reward_config.correct - reward_config.wrong) * p_correct + reward_config.format_bonus
        - reward_config.step_penalty * steps[None, :] - reward_config.usd_penalty * spent[None, :]
    )
    return p_correct, reward


def candidate_workflows(pool_size: int, max_steps: int, access_mode: AccessMode = "binary") -> list[Workflow]:
    """Every workflow of 1 to `max_steps` steps (`workflow_shapes`), fewer steps first: the order ties are broken in."""
    return [w for steps in range(1, max_steps + 1) for w in workflow_shapes(pool_size, steps, access_mode)]


def access_pattern(workflow: Workflow) -> str:
    """A workflow's topology without its workers: each step's visible earlier steps, e.g. "[] [] [0,1]" for two
    parallel answers and an aggregator reading both."""
    return " ".join(
        "[" + ",".join(str(j) for j in step.visible_steps(i)) + "]" for i, step in enumerate(workflow.steps)
    )


def workflow_shapes(pool_size: int, steps: int, access_mode: AccessMode = "binary") -> Iterator[Workflow]:
    """Every workflow of exactly `steps` steps over a pool of `pool_size` workers: pool_size^steps worker choices
    times 2^(steps - 1) access choices in binary mode, 2^(steps (steps - 1) / 2) in fine mode."""
    _check_search(steps, access_mode)
    if pool_size < 1:
        raise ValueError(f"pool_size must be >= 1, got {pool_size}")
    access_lists = [list(_access_choices(index, access_mode)) for index in range(steps)]
    for workers in itertools.product(range(pool_size), repeat=steps):
        for accesses in itertools.product(*access_lists):
            yield Workflow(
                steps=tuple(Step(w, _READ if a else _ANSWER, a) for w, a in zip(workers, accesses))
            )


def shape_count(pool_size: int, max_steps: int, access_mode: AccessMode = "binary") -> int:
    """How many shapes `best_fixed_workflow` compares."""
    _check_search(max_steps, access_mode)
    per_step_access = (lambda k: 2 ** (k - 1)) if access_mode == "binary" else (lambda k: 2 ** (k * (k - 1) // 2))
    return sum(pool_size**k * per_step_access(k) for k in range(1, max_steps + 1))


def _check_search(max_steps: int, access_mode: str) -> None:
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    if access_mode not in ACCESS_MODES:
        raise ValueError(f"access_mode must be one of {ACCESS_MODES}, got {access_mode!r}")


def _access_choices(index: int, access_mode: str) -> Iterator[tuple[int, ...]]:
    """The access lists step `index` may have, as explicit earlier-step indices (binary "all": all of them)."""
    if index == 0:
        yield ()
        return
    if access_mode == "binary":
        yield ()
        yield tuple(range(index))
        return
    for size in range(index + 1):
        yield from itertools.combinations(range(index), size)


def _reads_right(index: int, access: Sequence[int]) -> np.ndarray:
    """For each outcome vector of steps 0..index-1, whether a step in `access` is right in it."""
    mask = sum(1 << j for j in access)
    return (np.arange(1 << index) & mask) != 0


def _extend(outcomes: np.ndarray, reads_right: np.ndarray, skill: np.ndarray, adopted: np.ndarray) -> np.ndarray:
    """The outcome distribution after one more step (its outcome is the new high bit)."""
    p_right = np.where(reads_right[None, :], adopted[:, None], skill[:, None])
    return np.concatenate([outcomes * (1.0 - p_right), outcomes * p_right], axis=1)


def _final_p_correct_by_task(workflow: Workflow, matrix: np.ndarray, answer_model: AnswerModel) -> np.ndarray:
    if not workflow.steps:
        raise ValueError("an empty workflow has no answer of its own")
    pool_size = matrix.shape[1]
    adopted = np.asarray([[answer_model.p_correct(s, True) for s in row] for row in matrix])
    outcomes = np.ones((matrix.shape[0], 1))
    for index, step in enumerate(workflow.steps):
        if not 0 <= step.worker < pool_size:
            raise ValueError(f"step {index}'s worker {step.worker} is outside the pool of {pool_size}")
        visible = step.visible_steps(index)
        if any(not 0 <= j < index for j in visible):
            raise ValueError(f"step {index} reads {visible}, which are not earlier steps")
        outcomes = _extend(outcomes, _reads_right(index, visible), matrix[:, step.worker], adopted[:, step.worker])
    return outcomes[:, 1 << (len(workflow.steps) - 1) :].sum(axis=1)


def _task_arrays(
    skills: Mapping[str, Sequence[float]], task_weights: Mapping[str, float]
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Tasks with a positive weight, their skill rows and their normalised weights."""
    task_labels = [task_label for task_label, weight in task_weights.items() if weight > 0]
    if not task_labels:
        raise ValueError("the task mix needs a task with a positive weight")
    missing = [task_label for task_label in task_labels if task_label not in skills]
    if missing:
        raise ValueError(f"no skills for tasks {missing}")
    matrix = np.asarray([skills[task_label] for task_label in task_labels], dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[1] < 1:
        raise ValueError("every task needs one skill per worker, the same workers for all")
    weights = np.asarray([task_weights[task_label] for task_label in task_labels], dtype=np.float64)
    return task_labels, matrix, weights / weights.sum()


def _reward(p_correct: float, steps: int, config: RewardConfig) -> float:
    return (
        config.wrong + (config.correct - config.wrong) * p_correct + config.format_bonus - config.step_penalty * steps
    )


def _before(shape: tuple[Step, ...], other: tuple[Step, ...]) -> bool:
    """The tie order: fewer steps first, then by workers and access lists."""
    return (len(shape), [(s.worker, s.access) for s in shape]) < (len(other), [(s.worker, s.access) for s in other])
