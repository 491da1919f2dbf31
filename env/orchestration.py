"""The orchestration world (issue 64): the best workflow depends on the question and on the pool it is offered.

Questions are the synthetic world's (`env.tasks.synthetic`: four task labels, graded by the normal graders), each
given a difficulty and a pool of `pool_size` of the world's workers. The question text states the first two, and the
Conductor's prompt lists the offered model ids (`env.pools`: model id w is worker Ww in every pool), so a Conductor
can read all three:

    Task domain: algebra. Difficulty: hard.

Worker w (`DifficultyWorker`) is a simulated worker whose skill depends on the task and the difficulty and who
charges a fixed price per call (a fixed number of completion tokens at an output-only price, so the USD penalty of a
workflow is exact). A step that
reads a right answer adopts it (`AnswerModel`, rule "adopt"), so a second step that reviews an answer, or an
aggregator of parallel answers, raises the chance of a right final answer on hard questions and only costs calls
on easy ones.

The pools are every `pool_size`-subset of the workers; a deterministic split (`split_seed`) holds `validation_pools`
and `test_pools` of them out of training, so the validation and test questions are offered pools no training
question is. `OrchestrationReference` holds the exact expected reward of every candidate workflow in every
(task, difficulty, pool) context (`env.optimum.reward_table`) and from it three policies: the best fixed workflow
per pool (no adaptation to the question), the best per (task, pool) and the per-question optimum.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from typing import TYPE_CHECKING, Sequence

import numpy as np

from env.optimum import access_pattern, candidate_workflows, reward_table
from env.pools import named, offered_pool, positions
from env.rewards import RewardConfig
from env.tasks import synthetic
from env.tasks.base import Task
from env.workers.api import Price
from env.workers.base import Message, WorkerError, WorkerReply
from env.workers.simulated import AnswerModel, SimulatedWorker
from env.workflow import Workflow

if TYPE_CHECKING:
    from env.worlds import World

TASK_LABELS = synthetic.TASK_LABELS
DIFFICULTIES = ("easy", "medium", "hard")
SPLITS = ("train", "validation", "test")
# Rewards closer than this are float rounding (a chain and an aggregator of the same workers can tie exactly under
# the adopt rule): the earlier candidate, the one with fewer steps, wins such a tie.
_TIE = 1e-12


@dataclasses.dataclass(frozen=True)
class OrchestrationWorker:
    """One worker: `skills[d][h]` is its probability of a right answer alone on task TASK_LABELS[d] at difficulty
    DIFFICULTIES[h]; `price_per_call` the US dollars one call costs."""

    name: str
    skills: tuple[tuple[float, ...], ...]
    price_per_call: float

    def __post_init__(self) -> None:
        if len(self.skills) != len(TASK_LABELS) or any(len(row) != len(DIFFICULTIES) for row in self.skills):
            raise ValueError(f"{self.name}: skills must be {len(TASK_LABELS)} tasks x {len(DIFFICULTIES)} difficulties")
        if any(not 0.0 <= s <= 1.0 for row in self.skills for s in row):
            raise ValueError(f"{self.name}: every skill must be in [0, 1]")
        if self.price_per_call < 0:
            raise ValueError(f"{self.name}: price_per_call must be >= 0, got {self.price_per_call}")


def _specialist(name: str, homes: Sequence[int], home: tuple[float, ...], away: tuple[float, ...], price: float):
    return OrchestrationWorker(
        name, tuple(home if d in homes else away for d in range(len(TASK_LABELS))), price
    )


# Four cheap specialists, one per task, and two dear generalists, each a little weaker than a specialist at home
# but far stronger away from it. Easy questions: any worker alone is right 90-98% of the time, so one cheap call is
# best. Medium and hard: only the task's specialist (or a generalist) is much good, and reading a right answer
# pays, so a reviewed answer or an aggregator of two answers is best (docs/orchestration-world.md has the figures).
DEFAULT_WORKERS = (
    *(_specialist(f"W{d}", (d,), (0.98, 0.75, 0.4), (0.9, 0.3, 0.1), 0.002) for d in range(len(TASK_LABELS))),
    _specialist("W4", (0, 1), (0.95, 0.7, 0.35), (0.9, 0.6, 0.3), 0.01),
    _specialist("W5", (2, 3), (0.95, 0.7, 0.35), (0.9, 0.6, 0.3), 0.01),
)


@dataclasses.dataclass(frozen=True)
class OrchestrationWorldConfig:
    """The workers, how many each question is offered, the held-out pools and the questions of each split.

    `split` picks the questions the world holds: "train" (offered the training pools), "validation" or "test"
    (offered their own held-out pools). Everything is a function of `split_seed`, not of a run's seed, so every run
    sees the same splits."""

    workers: tuple[OrchestrationWorker, ...] = DEFAULT_WORKERS
    pool_size: int = 3
    validation_pools: int = 3
    test_pools: int = 3
    train_questions: int = 960
    validation_questions: int = 240
    test_questions: int = 240
    split: str = "train"
    split_seed: int = 0
    completion_tokens: int = 200
    answer_model: AnswerModel = AnswerModel(rule="adopt", adopt_rate=0.9)

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {self.split!r}")
        if len({worker.name for worker in self.workers}) != len(self.workers):
            raise ValueError("worker names must be distinct")
        if not 1 <= self.pool_size <= len(self.workers):
            raise ValueError(f"pool_size must be in [1, {len(self.workers)}], got {self.pool_size}")
        if self.validation_pools < 1 or self.test_pools < 1:
            raise ValueError("need at least one validation pool and one test pool")
        pools = len(list(itertools.combinations(range(len(self.workers)), self.pool_size)))
        if pools - self.validation_pools - self.test_pools < 1:
            raise ValueError(
                f"{pools} pools of {self.pool_size} cannot hold out {self.validation_pools} + {self.test_pools} and "
                "leave one for training"
            )
        if min(self.train_questions, self.validation_questions, self.test_questions) < 1:
            raise ValueError("every split needs at least one question")
        if self.completion_tokens < 1:
            raise ValueError(f"completion_tokens must be >= 1, got {self.completion_tokens}")

    @property
    def questions(self) -> int:
        return {"train": self.train_questions, "validation": self.validation_questions,
                "test": self.test_questions}[self.split]  # fmt: skip

    def skills(self) -> np.ndarray:
        """skills[worker, task, difficulty]."""
        return np.asarray([worker.skills for worker in self.workers], dtype=np.float64)


def pool_split(config: OrchestrationWorldConfig) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Split name -> its pools (sorted worker indices): every `pool_size`-subset, shuffled by `split_seed`, the first
    `validation_pools` to validation, the next `test_pools` to test, the rest to training."""
    pools = list(itertools.combinations(range(len(config.workers)), config.pool_size))
    random.Random(f"orchestration pools/{config.split_seed}").shuffle(pools)
    validation = pools[: config.validation_pools]
    test = pools[config.validation_pools : config.validation_pools + config.test_pools]
    train = pools[config.validation_pools + config.test_pools :]
    return {"train": tuple(sorted(train)), "validation": tuple(sorted(validation)), "test": tuple(sorted(test))}


def context(task: Task) -> tuple[str, str, tuple[int, ...]]:
    """What the question text shows: (task, difficulty, offered pool)."""
    return task.task_label, task.metadata["difficulty"], offered_pool(task)


def load_tasks(config: OrchestrationWorldConfig) -> list[Task]:
    """The split's questions: tasks in turn, each task's difficulties in turn (every (task, difficulty) equally
    often), each question offered a pool drawn uniformly from the split's pools."""
    split_index = SPLITS.index(config.split)
    base = synthetic.load_synthetic(config.questions, seed=1000 * config.split_seed + split_index)
    pools = pool_split(config)[config.split]
    rng = random.Random(f"orchestration questions/{config.split_seed}/{config.split}")
    tasks = []
    for index, question in enumerate(base):
        difficulty = DIFFICULTIES[(index // len(TASK_LABELS)) % len(DIFFICULTIES)]
        pool = rng.choice(pools)
        tasks.append(
            Task(
                id=f"orchestration/{config.split_seed}/{config.split}/{index}",
                task_label=question.task_label,
                question=f"Task domain: {question.task_label}. Difficulty: {difficulty}.\n\n{question.question}",
                gold=question.gold,
                grader=question.grader,
                metadata={**question.metadata, "difficulty": difficulty, "pool": pool},
            )
        )
    return tasks


class DifficultyWorker:
    """Worker `index` of the world: on each question, a `SimulatedWorker` with that worker's skill at the question's
    difficulty and its price per call."""

    backend = "simulated"

    def __init__(self, index: int, config: OrchestrationWorldConfig) -> None:
        worker = config.workers[index]
        self.index = index
        self.name = worker.name
        self.model = worker.name
        self._config = config
        tokens = config.completion_tokens
        self._at = tuple(
            SimulatedWorker(
                worker.name,
                {task_label: worker.skills[d][h] for d, task_label in enumerate(TASK_LABELS)},
                completion_tokens=tokens,
                price=Price(0.0, worker.price_per_call / tokens * 1e6),
                answer_model=config.answer_model,
            )
            for h in range(len(DIFFICULTIES))
        )

    @property
    def cache_model(self) -> str:
        """Everything that changes this worker's answers, for the response cache."""
        return f"{self.name} [{self._config.workers[self.index]}, {self._config.answer_model}, " \
               f"{self._config.completion_tokens}]"

    def at(self, task: Task) -> SimulatedWorker:
        """This worker at `task`'s difficulty."""
        if self.index not in offered_pool(task):
            raise WorkerError(f"{self.name}: task {task.id} does not offer it")
        return self._at[DIFFICULTIES.index(task.metadata["difficulty"])]

    def p_right(self, messages: Sequence[Message], task: Task) -> float:
        return self.at(task).p_right(messages, task)

    async def complete(
        self, messages: Sequence[Message], *, max_tokens: int, temperature: float, seed: int | None,
        task: Task | None = None,
    ) -> WorkerReply:  # fmt: skip
        if task is None:
            raise WorkerError(f"{self.name}: needs the task to know its difficulty")
        if max_tokens < self._config.completion_tokens:
            # fewer completion tokens would charge less than the price per call the exact optimum counts
            raise WorkerError(
                f"{self.name}: max_tokens {max_tokens} < completion_tokens {self._config.completion_tokens}"
            )
        return await self.at(task).complete(
            messages, max_tokens=max_tokens, temperature=temperature, seed=seed, task=task
        )


@dataclasses.dataclass(frozen=True)
class Choice:
    """One policy's workflow for one question and its exact expected reward there."""

    workflow: Workflow
    expected_reward: float


class OrchestrationReference:
    """Exact expected rewards in the world: every candidate workflow (1 to `max_steps` steps over a pool's positions,
    binary access lists) in every (task, difficulty) context of every pool, and the three reference policies, whose
    workflows name model ids as a Conductor's do (`env.pools.named`). The
    policies choose for the population, where every (task, difficulty) is equally likely; figures on a question
    list average the exact reward of each question's choice."""

    def __init__(self, config: OrchestrationWorldConfig, reward_config: RewardConfig, max_steps: int) -> None:
        if reward_config.token_penalty:
            raise ValueError("the orchestration world's optimum is exact only without a token penalty")
        self.config = config
        self.reward_config = reward_config
        self.max_steps = max_steps
        self.candidates = candidate_workflows(config.pool_size, max_steps)
        split = pool_split(config)
        self.heldout_pools = frozenset(split["validation"] + split["test"])
        self._tables: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}

    def table(self, pool: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(p_correct, reward) of every candidate (columns) in every context (rows: task-major, then difficulty)
        of `pool` (sorted worker indices; a candidate's worker k is the pool's k-th)."""
        if pool not in self._tables:
            self._tables[pool] = self._table(self.candidates, pool)
        return self._tables[pool]

    def _table(self, workflows: Sequence[Workflow], pool: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        skills = self.config.skills()[list(pool)]  # [position, task, difficulty]
        rows = skills.transpose(1, 2, 0).reshape(len(TASK_LABELS) * len(DIFFICULTIES), len(pool))
        costs = [self.config.workers[w].price_per_call for w in pool]
        return reward_table(workflows, rows, costs, self.config.answer_model, self.reward_config)

    @staticmethod
    def row(task: Task) -> int:
        return TASK_LABELS.index(task.task_label) * len(DIFFICULTIES) + DIFFICULTIES.index(task.metadata["difficulty"])

    def expected_reward(self, task: Task, workflow: Workflow | None) -> float:
        """The exact expected reward of `workflow` (naming model ids `task` offers) on `task`; None (a format error)
        earns the format-error reward."""
        if workflow is None:
            return self.reward_config.format_error
        pool = offered_pool(task)
        return float(self._table([positions(workflow, pool)], pool)[1][self.row(task), 0])

    def fixed(self, task: Task) -> Choice:
        """The best single workflow for every question of the task's pool."""
        pool = offered_pool(task)
        reward = self.table(pool)[1]
        return self._choice(pool, reward.mean(axis=0), reward[self.row(task)])

    def per_task(self, task: Task) -> Choice:
        """The best workflow for the question's (task, pool), whatever its difficulty."""
        pool = offered_pool(task)
        reward = self.table(pool)[1]
        d = TASK_LABELS.index(task.task_label) * len(DIFFICULTIES)
        return self._choice(pool, reward[d : d + len(DIFFICULTIES)].mean(axis=0), reward[self.row(task)])

    def per_question(self, task: Task) -> Choice:
        """The best workflow for the task's (task, difficulty, pool): the per-question optimum."""
        pool = offered_pool(task)
        reward = self.table(pool)[1][self.row(task)]
        return self._choice(pool, reward, reward)

    def _choice(self, pool: tuple[int, ...], objective: np.ndarray, reward: np.ndarray) -> Choice:
        best = int(np.flatnonzero(objective >= objective.max() - _TIE)[0])
        return Choice(named(self.candidates[best], pool), float(reward[best]))

    def figures(self, tasks: Sequence[Task]) -> dict[str, object]:
        """Mean exact expected reward of the three policies on `tasks`, the per-question optimum's share of questions
        per access pattern, and whether every task's pool is held out of training."""
        optimum = [self.per_question(task) for task in tasks]
        return {
            "best_fixed_reward": float(np.mean([self.fixed(task).expected_reward for task in tasks])),
            "per_task_reward": float(np.mean([self.per_task(task).expected_reward for task in tasks])),
            "optimum_reward": float(np.mean([choice.expected_reward for choice in optimum])),
            "optimum_shapes": shape_shares([choice.workflow for choice in optimum]),
            "heldout_pools": all(offered_pool(task) in self.heldout_pools for task in tasks),
        }


def shape_shares(workflows: Sequence[Workflow | None]) -> dict[str, float]:
    """Share of `workflows` per access pattern (`env.optimum.access_pattern`; None, a format error: "invalid")."""
    names = [access_pattern(w) if w is not None else "invalid" for w in workflows]
    return {name: names.count(name) / len(names) for name in sorted(set(names))}


def gap_closed(reward: float, best_fixed: float, optimum: float) -> float:
    """The fraction of the gap from the best fixed workflow per pool to the per-question optimum that `reward`
    closes."""
    if optimum <= best_fixed:
        raise ValueError(f"no gap to close: optimum {optimum} <= best fixed {best_fixed}")
    return (reward - best_fixed) / (optimum - best_fixed)


def build(config: OrchestrationWorldConfig, reward_config: RewardConfig, max_steps: int) -> "World":
    from env.worlds import World  # env.worlds dispatches here

    pool = [DifficultyWorker(index, config) for index in range(len(config.workers))]
    return World("orchestration", pool, load_tasks(config),
                 orchestration=OrchestrationReference(config, reward_config, max_steps))  # fmt: skip
