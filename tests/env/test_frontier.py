"""Exact baselines of a recorded world on hand-computed outcomes, and the task-routing frontier against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from env import frontier
from env.frontier import Outcomes, Point


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
    hopeless = Outcomes(o.models, o.domains, o.domain_of, o.correct & np.array([[1], [0], [1], [1]], dtype=bool),
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
        questions, models, domains = 40, 4, 3
        domain_of = rng.integers(0, domains, questions)
        domain_of[:domains] = np.arange(domains)
        o = Outcomes(tuple(f"m{m}" for m in range(models)), ("x", "y", "z"), domain_of,
                     rng.random((questions, models)) < 0.5, rng.integers(1, 6, (questions, models)) / 1000)
        brute = set()
        for assignment in itertools.product(range(models), repeat=domains):
            chosen = np.array([assignment[d] for d in domain_of])
            rows = np.arange(questions)
            brute.add((round(o.correct[rows, chosen].mean(), 12), round(o.cost_usd[rows, chosen].mean(), 12)))
        undominated = {p for p in brute if not any(q != p and q[0] >= p[0] and q[1] <= p[1] for q in brute)}
        found = {(round(p.accuracy, 12), round(p.cost_usd_per_question, 12)) for p in frontier.task_routing_frontier(o)}
        assert found == undominated, trial


def test_outcomes_reject_inconsistent_shapes_and_costs():
    o = tiny()
    with pytest.raises(ValueError, match="must be"):
        Outcomes(o.models[:2], o.domains, o.domain_of, o.correct, o.cost_usd)
    with pytest.raises(ValueError, match="one domain index per question"):
        Outcomes(o.models, o.domains, o.domain_of[:3], o.correct, o.cost_usd)
    with pytest.raises(ValueError, match="indexes 2 domains"):
        Outcomes(o.models, o.domains, np.array([0, 0, 1, 2]), o.correct, o.cost_usd)
    with pytest.raises(ValueError, match="finite and >= 0"):
        Outcomes(o.models, o.domains, o.domain_of, o.correct, -o.cost_usd)
