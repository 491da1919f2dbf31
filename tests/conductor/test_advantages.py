"""The Conductor's advantage transforms (`conductor.advantages`): each formula against hand-computed values, and the
registered transforms as the loop runs them (`rl.advantages.apply_transforms`)."""

import numpy as np
import pytest

from conductor import advantages as conductor_advantages
from conductor.advantages import ROUTE
from rl.advantages import AdvantageBatch, TransformConfig, apply_transforms


def test_balance_routes_removes_each_routes_batch_mean_and_leaves_rows_without_a_route():
    values = np.asarray([1.0, -0.5, 2.0, 0.25, -1.0, 3.0], dtype=np.float32)
    routes = [(0,), (1,), (0,), None, (1,), (0, 1)]
    balanced = conductor_advantages.balance_routes(values, routes)
    expected = values.copy()
    expected[[0, 2]] -= 1.5
    expected[[1, 4]] -= -0.75
    expected[5] = 0.0
    np.testing.assert_allclose(balanced, expected, rtol=1e-6)
    for route in [(0,), (1,), (0, 1)]:
        assert sum(balanced[i] for i, r in enumerate(routes) if r == route) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="5 routes for advantages of shape"):
        conductor_advantages.balance_routes(values, routes[:5])


def test_balance_routes_by_a_fraction_removes_that_fraction_of_each_routes_batch_mean():
    values = np.asarray([1.0, -0.5, 2.0, 0.25, -1.0, 3.0], dtype=np.float32)
    routes = [(0,), (1,), (0,), None, (1,), (0, 1)]
    partly = conductor_advantages.balance_routes(values, routes, fraction=0.4)
    expected = values - 0.4 * np.asarray([1.5, -0.75, 1.5, 0.0, -0.75, 3.0], dtype=np.float32)
    np.testing.assert_allclose(partly, expected, rtol=1e-6)
    np.testing.assert_array_equal(conductor_advantages.balance_routes(values, routes, fraction=0.0), values)
    for fraction in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="fraction must lie in"):
            conductor_advantages.balance_routes(values, routes, fraction=fraction)


def test_pooling_routes_by_task_gives_each_tasks_route_its_mean_and_keeps_each_routes_batch_sum():
    values = np.asarray([1.0, -0.5, 2.0, 0.25, -1.0, 3.0, 0.5, -2.0], dtype=np.float32)
    routes = [(0,), (1,), (0,), None, (1,), (0,), (1,), (0,)]
    tasks = ["x", "x", "x", "x", "x", "y", "y", "y"]
    pooled = conductor_advantages.pool_routes_by_task(values, routes, tasks)
    # x: route 0 rows 0, 2 (mean 1.5), route 1 rows 1, 4 (mean -0.75); y: route 0 rows 5, 7 (0.5), route 1 row 6.
    expected = np.asarray([1.5, -0.75, 1.5, 0.25, -0.75, 0.5, 0.5, 0.5], dtype=np.float32)
    np.testing.assert_allclose(pooled, expected, rtol=1e-6)
    for route in [(0,), (1,)]:
        rows = [i for i, r in enumerate(routes) if r == route]
        assert pooled[rows].sum() == pytest.approx(values[rows].sum(), abs=1e-6)
    partly = conductor_advantages.pool_routes_by_task(values, routes, tasks, fraction=0.25)
    np.testing.assert_allclose(partly, 0.75 * values + 0.25 * expected, rtol=1e-6)
    np.testing.assert_array_equal(conductor_advantages.pool_routes_by_task(values, routes, tasks, fraction=0.0), values)


def test_pooling_routes_by_task_refuses_mismatched_tasks_routes_and_fractions():
    values = np.asarray([1.0, -1.0, 0.5], dtype=np.float32)
    routes = [(0,), (1,), (0,)]
    with pytest.raises(ValueError, match="2 task labels for advantages of shape"):
        conductor_advantages.pool_routes_by_task(values, routes, ["x", "y"])
    with pytest.raises(ValueError, match="2 routes for advantages of shape"):
        conductor_advantages.pool_routes_by_task(values, routes[:2], ["x", "y", "x"])
    for fraction in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="fraction must lie in"):
            conductor_advantages.pool_routes_by_task(values, routes, ["x", "y", "x"], fraction=fraction)



def test_inverse_propensity_route_weights_are_inverse_probabilities_over_their_batch_mean_capped():
    logprobs = [[np.log(0.5)], [np.log(0.25), np.log(0.1)], []]
    # Inverse probabilities 2, 4, 10; their mean 16/3.
    weights = conductor_advantages.inverse_propensity_route_weights(logprobs, cap=5.0)
    for row, expected in zip(weights, ([0.375], [0.75, 1.875], [])):
        np.testing.assert_allclose(row, expected, rtol=1e-6)
    capped = conductor_advantages.inverse_propensity_route_weights(logprobs, cap=1.5)
    np.testing.assert_allclose(np.concatenate(capped), [0.375, 0.75, 1.5], rtol=1e-6)
    # A token sampled at a log-prob whose inverse probability overflows a float64 still gets a finite weight: twice
    # the mean of two inverse probabilities of which it is nearly the whole sum.
    extreme = conductor_advantages.inverse_propensity_route_weights([[-800.0], [np.log(0.5)]], cap=5.0)
    np.testing.assert_allclose(np.concatenate(extreme), [2.0, 0.0], rtol=1e-6, atol=1e-30)
    assert conductor_advantages.inverse_propensity_route_weights([[], []], cap=5.0)[0].size == 0


def test_inverse_propensity_route_weights_refuse_a_cap_below_one_and_non_finite_log_probs():
    for cap in (0.5, float("nan")):
        with pytest.raises(ValueError, match="cap must be >= 1"):
            conductor_advantages.inverse_propensity_route_weights([[-1.0]], cap=cap)
    with pytest.raises(ValueError, match="must be finite"):
        conductor_advantages.inverse_propensity_route_weights([[-1.0], [float("-inf")]], cap=5.0)


def test_the_registered_transforms_run_in_order_on_the_batchs_routes_tasks_and_route_tokens():
    values = np.array([2.0, -1.0, 1.0, 0.5, -0.5, 1.0], dtype=np.float32)
    routes = [(0,), (1,), (0,), None, (1,), (0,)]
    tasks = np.array(["x", "x", "x", "x", "y", "y"])
    route_tokens = [(1,), (0,), (2,), (), (1,), (0,)]
    logprobs = [[-0.1, np.log(0.5), -0.2], [np.log(0.25), -1.0], [-0.3, -0.3, np.log(0.5)], [-1.0],
                [-1.0, np.log(0.25)], [np.log(0.5)]]
    batch = AdvantageBatch(
        advantages=values, rewards=np.zeros(6), group_ids=np.zeros(6, dtype=np.int32), question_labels=tasks,
        labels={ROUTE: routes}, marked_tokens={ROUTE: route_tokens}, sampler_logprobs=logprobs,
    )
    transforms = (
        TransformConfig("pool_routes", {"fraction": 1.0}),
        TransformConfig("balance_routes", {"fraction": 0.5}),
        TransformConfig("route_propensity", {"cap": 5.0}),
    )
    got, scalings, metrics = apply_transforms(transforms, batch)
    pooled = conductor_advantages.pool_routes_by_task(values, routes, tasks, 1.0)
    np.testing.assert_allclose(pooled, [1.5, -1.0, 1.5, 0.5, -0.5, 1.0], rtol=1e-6)
    np.testing.assert_allclose(got, conductor_advantages.balance_routes(pooled, routes, 0.5), rtol=1e-6)
    # Route tokens drawn at 0.5, 0.25, 0.5, 0.25, 0.5: inverse 2, 4, 2, 4, 2 over their mean 2.8.
    [(indices, factors)] = scalings
    assert indices == route_tokens
    np.testing.assert_allclose(np.concatenate(factors), np.array([2, 4, 2, 4, 2]) / 2.8, rtol=1e-5)
    assert metrics == pytest.approx({"route_weight_max": 4 / 2.8, "route_weight_capped": 0.0})


def test_pooling_without_question_labels_and_misspelt_or_mistyped_options_are_refused():
    batch = AdvantageBatch(advantages=np.zeros(2, np.float32), rewards=np.zeros(2), group_ids=np.zeros(2))
    with pytest.raises(ValueError, match="pool_routes needs an environment with question labels"):
        apply_transforms((TransformConfig("pool_routes"),), batch)
    with pytest.raises(ValueError, match="transform 'balance_routes' takes no option 'fractoin'; it takes"):
        TransformConfig("balance_routes", {"fractoin": 0.5})
    with pytest.raises(ValueError, match="option 'cap' must be float"):
        TransformConfig("route_propensity", {"cap": "5"})
