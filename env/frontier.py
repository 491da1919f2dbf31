"""Exact cost-accuracy baselines of a recorded world (`env.tasks.zeroeval`): every model alone, the best single model,
the cheapest, the best model per task, the per-question oracle, and the frontier of routing by task label.

Everything is computed from the outcome matrix: whether each model's recorded answer to each question is right, and
what the call cost. A model with no record of a question is wrong on it at no cost (a failed call).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Sequence

import numpy as np

from env.pools import offered_pool
from env.tasks.base import Task
from env.workers.base import WorkerError


@dataclasses.dataclass(frozen=True)
class Outcomes:
    """correct[q, m] and cost_usd[q, m] of model m on question q; task_label_of[q] indexes `tasks`."""

    models: tuple[str, ...]
    task_labels: tuple[str, ...]
    task_label_of: np.ndarray
    correct: np.ndarray
    cost_usd: np.ndarray

    def __post_init__(self) -> None:
        questions, models = self.correct.shape
        if models != len(self.models) or self.cost_usd.shape != self.correct.shape:
            raise ValueError(f"correct {self.correct.shape} and cost {self.cost_usd.shape} must be [questions, "
                             f"{len(self.models)} models]")
        if self.task_label_of.shape != (questions,) or questions == 0:
            raise ValueError(f"task_label_of must hold one task index per question ({questions}), got "
                             f"{self.task_label_of.shape}")
        if self.task_label_of.min() < 0 or self.task_label_of.max() >= len(self.task_labels):
            raise ValueError(f"task_label_of indexes {len(self.task_labels)} tasks")
        if (self.cost_usd < 0).any() or not np.isfinite(self.cost_usd).all():
            raise ValueError("costs must be finite and >= 0")

    def subset(self, questions: np.ndarray) -> "Outcomes":
        return dataclasses.replace(
            self, task_label_of=self.task_label_of[questions], correct=self.correct[questions],
            cost_usd=self.cost_usd[questions],
        )


@dataclasses.dataclass(frozen=True)
class Point:
    """A routing rule's accuracy (fraction) and mean cost per question; `route` names its choice."""

    route: str
    accuracy: float
    cost_usd_per_question: float

    def summary(self) -> dict[str, float]:
        return {"accuracy": self.accuracy, "cost_usd_per_question": self.cost_usd_per_question}


def outcomes(tasks: Sequence[Task], workers: Sequence, correct: np.ndarray | None = None) -> Outcomes:
    """The outcome matrix of recorded `workers` (each with `reply(task)`) on `tasks`, graded by each task's grader;
    `correct` (a previous call's, for the same tasks and models) skips the grading, which is the slow part."""
    task_labels = tuple(sorted({task.task_label for task in tasks}))
    grade = correct is None
    correct = np.zeros((len(tasks), len(workers)), dtype=bool) if grade else correct
    cost = np.zeros((len(tasks), len(workers)))
    for q, task in enumerate(tasks):
        for m, worker in enumerate(workers):
            try:
                reply = worker.reply(task)
            except WorkerError:
                continue
            if grade:
                correct[q, m] = task.grade(reply.text) == 1.0
            cost[q, m] = reply.cost_usd
    task_label_of = np.array([task_labels.index(task.task_label) for task in tasks])
    return Outcomes(tuple(worker.name for worker in workers), task_labels, task_label_of, correct, cost)


def single_models(o: Outcomes) -> list[Point]:
    """Each model alone, in `o.models` order."""
    accuracy, cost = o.correct.mean(axis=0), o.cost_usd.mean(axis=0)
    return [Point(model, float(accuracy[m]), float(cost[m])) for m, model in enumerate(o.models)]


def best_single(o: Outcomes) -> Point:
    """The most accurate model alone; among equals, the cheapest."""
    return min(single_models(o), key=lambda p: (-p.accuracy, p.cost_usd_per_question))


def cheapest_single(o: Outcomes) -> Point:
    """The cheapest model alone; among equals, the most accurate."""
    return min(single_models(o), key=lambda p: (p.cost_usd_per_question, -p.accuracy))


def _task_sums(o: Outcomes) -> tuple[np.ndarray, np.ndarray]:
    """[task, model] sums of right answers and of costs."""
    right = np.zeros((len(o.task_labels), len(o.models)))
    cost = np.zeros_like(right)
    np.add.at(right, o.task_label_of, o.correct.astype(float))
    np.add.at(cost, o.task_label_of, o.cost_usd)
    return right, cost


def task_routing_points(o: Outcomes) -> list[tuple[tuple[int, ...], Point]]:
    """Every assignment of one model to each task (len(models) ** len(tasks) of them), with its point."""
    right, cost = _task_sums(o)
    count = len(o.task_label_of)
    points = []
    for assignment in itertools.product(range(len(o.models)), repeat=len(o.task_labels)):
        rows = np.arange(len(o.task_labels))
        points.append((assignment, Point(
            _route_name(o, assignment), float(right[rows, assignment].sum() / count),
            float(cost[rows, assignment].sum() / count),
        )))
    return points


def _route_name(o: Outcomes, assignment: Sequence[int]) -> str:
    return ", ".join(f"{task_label}: {o.models[m]}" for task_label, m in zip(o.task_labels, assignment))


def pareto_frontier(points: Sequence[Point]) -> list[Point]:
    """The points no other point beats (at most the cost with more accuracy, or less cost with at least the
    accuracy), by increasing cost; of points equal in both, the first. Costs within a relative 1e-9 count as equal:
    sums of the same prices in another order differ in the last bits."""
    frontier: list[Point] = []
    for point in sorted(points, key=lambda p: (p.cost_usd_per_question, -p.accuracy)):
        if frontier and point.accuracy <= frontier[-1].accuracy:
            continue
        while frontier and math.isclose(frontier[-1].cost_usd_per_question, point.cost_usd_per_question,
                                        rel_tol=1e-9, abs_tol=0.0):
            frontier.pop()
        frontier.append(point)
    return frontier


def task_routing_frontier(o: Outcomes) -> list[Point]:
    """The exact cost-accuracy frontier of routing by task label."""
    return pareto_frontier([point for _, point in task_routing_points(o)])


def per_task_best(o: Outcomes) -> Point:
    """Each task to its most accurate model (among equals, the cheapest there)."""
    right, cost = _task_sums(o)
    assignment = tuple(min(range(len(o.models)), key=lambda m: (-right[d, m], cost[d, m])) for d in
                       range(len(o.task_labels)))
    rows = np.arange(len(o.task_labels))
    count = len(o.task_label_of)
    return Point(_route_name(o, assignment), float(right[rows, assignment].sum() / count),
                 float(cost[rows, assignment].sum() / count))


def oracle(o: Outcomes) -> Point:
    """Per question, the cheapest model that is right; where none is, the cheapest model (still wrong)."""
    right_cost = np.where(o.correct, o.cost_usd, np.inf)
    any_right = o.correct.any(axis=1)
    cost = np.where(any_right, right_cost.min(axis=1), o.cost_usd.min(axis=1))
    return Point("per-question oracle (cheapest right answer)", float(any_right.mean()), float(cost.mean()))


def cheapest_within(points: Sequence[Point], accuracy: float) -> Point | None:
    """The cheapest of `points` with at least `accuracy`; None if none has."""
    eligible = [p for p in points if p.accuracy >= accuracy]
    return min(eligible, key=lambda p: (p.cost_usd_per_question, -p.accuracy)) if eligible else None


def method_and_baselines(
    tasks: Sequence[Task], workers: Sequence, correct: Sequence[float], cost_usd: Sequence[float]
) -> dict:
    """A method's accuracy and mean cost per question (`correct`, `cost_usd`: one per answer), beside the exact
    baselines of the recorded `workers` on the same `tasks`: what an evaluation summary reports on a recorded world."""
    if not correct or len(correct) != len(cost_usd):
        raise ValueError(f"need one correct and one cost per answer, got {len(correct)} and {len(cost_usd)}")
    o = outcomes(tasks, workers)
    return {
        "accuracy": float(np.mean(correct)),
        "cost_usd_per_question": float(np.mean(cost_usd)),
        "baselines": {
            "best_single": {"route": best_single(o).route, **best_single(o).summary()},
            "cheapest": {"route": cheapest_single(o).route, **cheapest_single(o).summary()},
            "per_task_best": {"route": per_task_best(o).route, **per_task_best(o).summary()},
            "oracle": oracle(o).summary(),
        },
    }


def offered_pool_figures(
    tasks: Sequence[Task], pool: Sequence, correct: Sequence[float], cost_usd: Sequence[float], share: float = 0.95
) -> dict:
    """`method_and_baselines` for questions offered pools (`env.pools`), pool by pool: each pool's questions with the
    exact baselines of its own models (`pool`: the world's, which holds every model), and the
    method's accuracy as a fraction of that pool's per-task best (`to_per_task_best`). `pools_at_share` counts the
    pools where that fraction is at least `share`; `accuracy` and `cost_usd_per_question` are over every question."""
    if len(tasks) != len(correct):
        raise ValueError(f"{len(tasks)} questions but {len(correct)} answers")
    groups: dict[str, list[int]] = {}
    for index, task in enumerate(tasks):
        members = offered_pool(task)
        groups.setdefault(task.metadata.get("pool_name") or "-".join(map(str, members)), []).append(index)
    pools = {}
    for name, rows in groups.items():
        members = offered_pool(tasks[rows[0]])
        if any(offered_pool(tasks[row]) != members for row in rows):
            raise ValueError(f"the questions of pool {name!r} are offered different pools")
        workers = [pool[member] for member in members]
        figures = method_and_baselines([tasks[row] for row in rows], workers,
                                       [correct[row] for row in rows], [cost_usd[row] for row in rows])
        best = figures["baselines"]["per_task_best"]["accuracy"]
        pools[name] = {"models": [worker.name for worker in workers], "questions": len(rows), **figures,
                       "to_per_task_best": figures["accuracy"] / best if best else float("nan")}
    return {
        "accuracy": float(np.mean(correct)),
        "cost_usd_per_question": float(np.mean(cost_usd)),
        "pools": pools,
        "pools_at_share": sum(figures["to_per_task_best"] >= share for figures in pools.values()),
        "share": share,
    }
