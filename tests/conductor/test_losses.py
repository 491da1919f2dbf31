"""The Conductor's loss pieces without a model: the tasks' state overlap against numpy."""

import jax
import jax.numpy as jnp
import numpy as np

from conductor.losses import task_state_overlap
from rl.supervised import marked_states


def test_task_state_overlap_is_the_mean_squared_cosine_between_the_tasks_mean_states():
    rng = np.random.default_rng(3)
    hidden = rng.normal(size=(7, 5, 6)).astype(np.float32)
    positions = np.array([0, 4, 2, 1, 3, 0, 2])
    labels = np.array([0, 0, 2, -1, 2, 3, 3])  # task 1 absent, one row unlabelled
    states = hidden[np.arange(7), positions]
    means = {f: states[labels == f].mean(axis=0) for f in (0, 2, 3)}
    cosines = [
        means[f] @ means[g] / (np.linalg.norm(means[f]) * np.linalg.norm(means[g]))
        for f in means for g in means if f != g
    ]
    probed = marked_states(jnp.asarray(hidden), jnp.asarray(positions))
    np.testing.assert_array_equal(np.asarray(probed), states)
    overlap = task_state_overlap(probed, jnp.asarray(labels))
    np.testing.assert_allclose(float(overlap), np.mean(np.square(cosines)), rtol=1e-5)
    # Pairs of tasks count once each, however many rows a task has.
    repeated = np.concatenate([np.arange(7), np.flatnonzero(labels == 0).repeat(5)])
    repeated_overlap = task_state_overlap(probed[repeated], jnp.asarray(labels[repeated]))
    np.testing.assert_allclose(float(repeated_overlap), np.mean(np.square(cosines)), rtol=1e-5)
    assert float(task_state_overlap(probed, jnp.asarray([1] * 7))) == 0.0
    assert float(task_state_overlap(probed, jnp.asarray([-1] * 7))) == 0.0
    # An unlabelled row's task mean is 0: the overlap's gradient must stay finite there.
    gradient = jax.grad(task_state_overlap)(probed, jnp.asarray(labels))
    assert np.isfinite(np.asarray(gradient)).all() and np.abs(np.asarray(gradient)).max() > 0
    assert not np.asarray(gradient)[labels == -1].any()
