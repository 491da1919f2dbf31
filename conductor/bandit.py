"""A contextual UCB1 bandit over candidate workflows: the baseline a Conductor must beat where a table of counts per
observed context could learn the same thing (issue 64).

The bandit learns from the same kind of feedback a training run gets, and as much of it (`budget` pulls): each pull
draws a training question uniformly, picks one of its context's arms by UCB1, and sees the reward of one drawn
outcome (right with the arm's exact or recorded probability, `BanditProblem`), or, on the orchestration world for a
run with `--expected_grades`, the arm's exact expected reward. After the budget it answers each question with the
arm of the highest mean reward seen in the question's context (ties: the lower arm, which has fewer steps). A
context it never saw falls back to the statistics of every seen context of the same group, pooled by what each arm
means outside its context (`arm_keys`: in the orchestration world the workflow over the workers themselves rather
than over the pool's positions), restricted to arms the unseen context offers; with nothing to go on, arm 0.

Two worlds supply problems: the orchestration world (context: task, difficulty and offered pool; arms: every
candidate workflow; group: task and difficulty; trained on the training split, whose pools the validation and
test splits never offer) and a replay world (context: the task; arms: one call of each recorded model; trained
on the evaluated questions themselves, like the per-task best worker).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Hashable, Sequence

import numpy as np

from env import orchestration, pools
from env.rewards import RewardConfig
from env.tasks.base import Task
from env.workflow import Workflow


@dataclasses.dataclass(frozen=True)
class BanditProblem:
    """Training questions for the bandit: each one's context, and per arm its probability of a right outcome and the
    reward of a right and of a wrong one ([question, arm] arrays). `arm_keys(context)` names each arm outside its
    context and `group(context)` says which contexts an unseen one may borrow from."""

    contexts: tuple[Hashable, ...]
    p_right: np.ndarray
    reward_right: np.ndarray
    reward_wrong: np.ndarray
    arm_keys: Callable[[Hashable], Sequence[Hashable]]
    group: Callable[[Hashable], Hashable]

    def __post_init__(self) -> None:
        shape = (len(self.contexts), self.p_right.shape[1] if self.p_right.ndim == 2 else -1)
        if self.p_right.ndim != 2 or self.p_right.shape[0] != len(self.contexts) or shape[1] < 1:
            raise ValueError(f"p_right must be [questions, arms] for {len(self.contexts)} questions")
        if self.reward_right.shape != self.p_right.shape or self.reward_wrong.shape != self.p_right.shape:
            raise ValueError("reward_right and reward_wrong must have p_right's shape")
        if np.any((self.p_right < 0) | (self.p_right > 1)):
            raise ValueError("p_right must be probabilities")

    @property
    def arms(self) -> int:
        return self.p_right.shape[1]

    @property
    def reward_range(self) -> float:
        """The spread of rewards UCB1's exploration bonus is scaled to (its bound assumes rewards in [0, 1])."""
        return float(max(self.reward_right.max(), self.reward_wrong.max()) -
                     min(self.reward_right.min(), self.reward_wrong.min())) or 1.0  # fmt: skip


@dataclasses.dataclass
class ArmStatistics:
    """Pulls and summed rewards of every arm in one context."""

    counts: np.ndarray
    sums: np.ndarray

    @classmethod
    def empty(cls, arms: int) -> "ArmStatistics":
        return cls(np.zeros(arms, dtype=np.int64), np.zeros(arms))


def ucb1(problem: BanditProblem, budget: int, seed: int) -> dict[Hashable, ArmStatistics]:
    """Runs `budget` pulls (module docstring) and returns each seen context's statistics. UCB1 pulls every arm of a
    context once, in order, then the arm maximising mean + range * sqrt(2 ln n / n_arm)."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    rng = np.random.default_rng(seed)
    statistics: dict[Hashable, ArmStatistics] = {}
    scale = problem.reward_range
    questions = rng.integers(len(problem.contexts), size=budget)
    uniforms = rng.random(budget)
    for question, uniform in zip(questions, uniforms):
        stats = statistics.setdefault(problem.contexts[question], ArmStatistics.empty(problem.arms))
        untried = np.flatnonzero(stats.counts == 0)
        if untried.size:
            arm = int(untried[0])
        else:
            bonus = scale * np.sqrt(2.0 * np.log(stats.counts.sum()) / stats.counts)
            arm = int(np.argmax(stats.sums / stats.counts + bonus))
        right = uniform < problem.p_right[question, arm]
        stats.counts[arm] += 1
        stats.sums[arm] += problem.reward_right[question, arm] if right else problem.reward_wrong[question, arm]
    return statistics


def choose(problem: BanditProblem, statistics: dict[Hashable, ArmStatistics], context: Hashable) -> int:
    """The arm the trained bandit plays in `context`: its best mean there, or the fallback of the module docstring."""
    if context in statistics:
        return _best(statistics[context])
    pooled: dict[Hashable, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for seen, stats in statistics.items():
        if problem.group(seen) != problem.group(context):
            continue
        for key, count, total in zip(problem.arm_keys(seen), stats.counts, stats.sums):
            pooled[key][0] += count
            pooled[key][1] += total
    keys = problem.arm_keys(context)
    counts = np.asarray([pooled[key][0] if key in pooled else 0 for key in keys])
    sums = np.asarray([pooled[key][1] if key in pooled else 0.0 for key in keys])
    if not counts.any():
        return 0
    return _best(ArmStatistics(counts, sums))


def _best(stats: ArmStatistics) -> int:
    means = np.where(stats.counts > 0, stats.sums / np.maximum(stats.counts, 1), -np.inf)
    return int(np.argmax(means))


# -- the worlds' problems -----------------------------------------------------------------------------------------


def orchestration_problem(
    reference: orchestration.OrchestrationReference, tasks: Sequence[Task], expected_grades: bool = False
) -> BanditProblem:
    """Arms: the reference's candidate workflows over the pool's positions; context: what the question shows. With
    `expected_grades` (a run's `--expected_grades`) a pull sees the arm's exact expected reward, as that run's
    Conductor sees each sample's: the same kind of feedback, not only as much. Without, a drawn outcome's."""
    correct, wrong = reference.reward_config.correct, reference.reward_config.wrong
    p_rows, reward_rows = [], []
    for task in tasks:
        p_right, reward = reference.table(pools.offered_pool(task))
        row = reference.row(task)
        p_rows.append(p_right[row])
        reward_rows.append(reward[row])
    p_right = np.asarray(p_rows)
    reward = np.asarray(reward_rows)
    reward_wrong = reward if expected_grades else reward - (correct - wrong) * p_right
    reward_right = reward if expected_grades else reward_wrong + (correct - wrong)
    candidates = reference.candidates

    def arm_keys(context: Hashable) -> list[Hashable]:
        pool = context[2]  # type: ignore[index]
        return [tuple((pool[step.worker], step.visible_steps(i)) for i, step in enumerate(w.steps))
                for w in candidates]  # fmt: skip

    return BanditProblem(
        contexts=tuple(orchestration.context(task) for task in tasks),
        p_right=p_right,
        reward_right=reward_right,
        reward_wrong=reward_wrong,
        arm_keys=arm_keys,
        group=lambda context: context[:2],  # type: ignore[index]
    )


def orchestration_workflow(
    reference: orchestration.OrchestrationReference, problem: BanditProblem,
    statistics: dict[Hashable, ArmStatistics], task: Task,
) -> Workflow:
    """The bandit's workflow for an orchestration question, naming the model ids it offers (`env.pools.named`)."""
    arm = choose(problem, statistics, orchestration.context(task))
    return pools.named(reference.candidates[arm], pools.offered_pool(task))


def replay_problem(tasks: Sequence[Task], models: Sequence[str], reward_config: RewardConfig) -> BanditProblem:
    """Arms: one call of each recorded model; context: the task. The reward is the env's for a one-step
    workflow (no USD penalty: a replayed call has no price)."""
    p_right = np.asarray([[task.metadata["scores"][model] for model in models] for task in tasks], dtype=np.float64)
    shaping = reward_config.format_bonus - reward_config.step_penalty
    return BanditProblem(
        contexts=tuple(task.task_label for task in tasks),
        p_right=p_right,
        reward_right=np.full_like(p_right, reward_config.correct + shaping),
        reward_wrong=np.full_like(p_right, reward_config.wrong + shaping),
        arm_keys=lambda context: list(range(len(models))),
        group=lambda context: context,
    )
