"""The supervised per-question router: it learns a signal the question text carries and trades accuracy for cost."""

from __future__ import annotations

import numpy as np
import pytest

from env.frontier import Outcomes
from env.tasks.base import Task
from env.tasks.graders import grade_exact
from env.text_router import RouterConfig, ceiling, features


def test_features_are_stable_hashed_unit_rows_with_the_task_label():
    x = features(["Add two and two", "add two and two", ""], [0, 0, 1], 2, bits=6)
    assert x.shape == (3, 64 + 2)
    assert np.array_equal(x[0], x[1])  # case folded
    assert np.linalg.norm(x[0, :64]) == pytest.approx(1.0) and x[0, 64] == 1.0 and x[0, 65] == 0.0
    assert not x[2, :64].any() and x[2, 65] == 1.0
    assert np.array_equal(x, features(["Add two and two", "add two and two", ""], [0, 0, 1], 2, bits=6))


def test_the_router_learns_which_questions_the_cheap_model_gets_right():
    rng = np.random.default_rng(0)
    words = ["apple", "river", "stone", "cloud", "maple", "tiger", "ocean", "piano"]
    easy = rng.random(200) < 0.5
    questions = [" ".join(rng.choice(words, 5)) + (" easy" if e else " hard") for e in easy]
    tasks = [Task(f"t/{i}", "d", q, "g", grade_exact) for i, q in enumerate(questions)]
    # model 0: always right, costs 10; model 1: right exactly on the easy questions, costs 1
    correct = np.stack([np.ones(200, dtype=bool), easy], axis=1)
    o = Outcomes(("big", "small"), ("d",), np.zeros(200, dtype=int), correct, np.tile([10.0, 1.0], (200, 1)))
    test = np.arange(200) % 2 == 0
    result = ceiling(tasks, o, test, RouterConfig(feature_bits=10, usd_weights=(0.0, 0.02, 10.0)))
    free, balanced, stingy = result["points"]
    assert free["accuracy"] == 1.0 and free["cost_usd_per_question"] == 10.0
    # weighing cost, easy questions go to the small model and hard ones stay with the big one
    ideal = 1.0 * easy[test].mean() + 10.0 * (1 - easy[test].mean())  # each question to its cheapest right model
    assert balanced["accuracy"] == 1.0 and ideal <= balanced["cost_usd_per_question"] <= ideal + 0.2
    assert stingy["cost_usd_per_question"] == 1.0 and stingy["accuracy"] == pytest.approx(easy[test].mean())
    assert result["test_log_loss"] < result["test_log_loss_task_base_rate"]


def test_router_config_is_validated():
    with pytest.raises(ValueError, match="feature_bits"):
        RouterConfig(feature_bits=30)
    with pytest.raises(ValueError, match="usd_weights"):
        RouterConfig(usd_weights=(-1.0,))
