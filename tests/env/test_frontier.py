"""Exact baselines of a recorded world on hand-computed outcomes, and the task-routing frontier against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from env import frontier
from env.frontier import Outcomes, Point
from env.tasks.base import Task
from env.tasks.graders import grade_exact
from env.workers.base import WorkerError, WorkerReply


def tiny() -> Outcomes:
    # Two tasks (a: questions 0-1, b: 2-3), three models costing 3, 1 and 2 dollars a call.
    correct = np.array([[1, 0, 1], [1, 0, 0], [0, 1, 1], [1, 0, 0]], dtype=bool)
    cost = np.tile([3.0, 1.0, 2.0], (4, 1))
    return Outcomes(("m0", "m1", "m2"), ("a", "b"), np.array([0, 0, 1, 1]), correct, cost)


def summary(point: Point) -> tuple[float, float]:
    return point.accuracy, point.cost_usd_per_question


def test_single_models_and_the_best_and_cheapest():
    o = tiny()
    assert [summary(p) for p in frontier.single_models(o)] == [(0.75, 3.0), (0.25, 1.0), (0.5, 2.0)]
    assert frontier.best_single(o).route == "m0" and frontier.cheapest_single(o).route == "m1"


def test_per_task_best_breaks_ties_by_cost():
    best = frontier.per_task_best(tiny())
    # a: m0 right twice; b: every model right once, m1 cheapest
    assert best.route == "a: m0, b: m1" and summary(best) == (0.75, 2.0)


def test_the_oracle_pays_the_cheapest_right_answer_and_the_cheapest_call_where_none_is_right():
    o = tiny()
    assert summary(frontier.oracle(o)) == (1.0, (2 + 3 + 1 + 3) / 4)
    hopeless = Outcomes(o.models, o.task_labels, o.task_label_of, o.correct & np.array([[1], [0], [1], [1]], dtype=bool),
                        o.cost_usd)
    assert summary(frontier.oracle(hopeless)) == (0.75, (2 + 1 + 1 + 3) / 4)


def test_the_task_routing_frontier_of_the_tiny_world():
    o = tiny()
    assert len(frontier.task_routing_points(o)) == 9
    assert [(p.route, *summary(p)) for p in frontier.task_routing_frontier(o)] == [
        ("a: m1, b: m1", 0.25, 1.0), ("a: m2, b: m1", 0.5, 1.5), ("a: m0, b: m1", 0.75, 2.0)
    ]
    points = [p for _, p in frontier.task_routing_points(o)]
    assert summary(frontier.cheapest_within(points, 0.5)) == (0.5, 1.5)
    assert frontier.cheapest_within(points, 0.8) is None


def test_the_frontier_is_exactly_the_undominated_assignments_by_brute_force():
    rng = np.random.default_rng(0)
    for trial in range(5):
        questions, models, task_labels = 40, 4, 3
        task_label_of = rng.integers(0, task_labels, questions)
        task_label_of[:task_labels] = np.arange(task_labels)
        o = Outcomes(tuple(f"m{m}" for m in range(models)), ("x", "y", "z"), task_label_of,
                     rng.random((questions, models)) < 0.5, rng.integers(1, 6, (questions, models)) / 1000)
        brute = set()
        for assignment in itertools.product(range(models), repeat=task_labels):
            chosen = np.array([assignment[d] for d in task_label_of])
            rows = np.arange(questions)
            brute.add((round(o.correct[rows, chosen].mean(), 12), round(o.cost_usd[rows, chosen].mean(), 12)))
        undominated = {p for p in brute if not any(q != p and q[0] >= p[0] and q[1] <= p[1] for q in brute)}
        found = {(round(p.accuracy, 12), round(p.cost_usd_per_question, 12)) for p in frontier.task_routing_frontier(o)}
        assert found == undominated, trial


def test_outcomes_reject_inconsistent_shapes_and_costs():
    o = tiny()
    with pytest.raises(ValueError, match="must be"):
        Outcomes(o.models[:2], o.task_labels, o.task_label_of, o.correct, o.cost_usd)
    with pytest.raises(ValueError, match="one task index per question"):
        Outcomes(o.models, o.task_labels, o.task_label_of[:3], o.correct, o.cost_usd)
    with pytest.raises(ValueError, match="indexes 2 tasks"):
        Outcomes(o.models, o.task_labels, np.array([0, 0, 1, 2]), o.correct, o.cost_usd)
    with pytest.raises(ValueError, match="finite and >= 0"):
        Outcomes(o.models, o.task_labels, o.task_label_of, o.correct, -o.cost_usd)


class _Fixed:
    """A recorded worker stand-in: answers `answers[task.id]` at `cost`; a missing answer fails the call."""

    def __init__(self, name, answers, cost):
        self.name, self.answers, self.cost = name, answers, cost

    def reply(self, task):
        if task.id not in self.answers:
            raise WorkerError(f"{self.name}: no record of {task.id}")
        return WorkerReply(f"<answer>{self.answers[task.id]}</answer>", 1, 1, self.cost, 0.0)


def test_a_methods_summary_sits_beside_the_exact_baselines_of_the_same_questions():
    tasks = [Task(f"t/{i}", task_label, "q", "right", grade_exact) for i, task_label in enumerate("aabb")]
    workers = [
        _Fixed("m0", {"t/0": "right", "t/1": "right", "t/2": "wrong", "t/3": "right"}, 3.0),
        _Fixed("m1", {"t/0": "wrong", "t/1": "wrong", "t/2": "right"}, 1.0),  # no record of t/3: wrong, no cost
    ]
    o = frontier.outcomes(tasks, workers)
    assert o.correct.tolist() == [[True, False], [True, False], [False, True], [True, False]]
    assert o.cost_usd[:, 1].tolist() == [1.0, 1.0, 1.0, 0.0]
    figures = frontier.method_and_baselines(tasks, workers, [1.0, 0.0, 1.0, 1.0], [3.0, 1.0, 1.0, 3.0])
    assert (figures["accuracy"], figures["cost_usd_per_question"]) == (0.75, 2.0)
    assert figures["baselines"]["best_single"] == {"route": "m0", "accuracy": 0.75, "cost_usd_per_question": 3.0}
    # b: each model right once; m1 is cheaper there (its failed call on t/3 costs nothing)
    assert figures["baselines"]["per_task_best"] == {"route": "a: m0, b: m1", "accuracy": 0.75,
                                                     "cost_usd_per_question": (3 + 3 + 1 + 0) / 4}
    assert figures["baselines"]["oracle"] == {"accuracy": 1.0, "cost_usd_per_question": (3 + 3 + 1 + 3) / 4}
    with pytest.raises(ValueError, match="one correct and one cost per answer"):
        frontier.method_and_baselines(tasks, workers, [1.0], [])
