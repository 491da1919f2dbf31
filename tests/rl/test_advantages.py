"""Advantage estimators against direct per-group numpy formulas, on uneven, interleaved groups."""

import numpy as np
import pytest

from rl import advantages


def _random_batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    sizes = [1, 3, 4, 6]  # uneven, including a singleton group
    group_ids = np.concatenate([np.full(size, 10 * (g + 1)) for g, size in enumerate(sizes)])
    order = rng.permutation(group_ids.size)  # interleave the groups
    group_ids = group_ids[order]
    rewards = rng.normal(size=group_ids.size)
    lengths = rng.integers(1, 50, size=group_ids.size).astype(np.float64)
    return rewards, group_ids, lengths


def _members(group_ids):
    return [np.nonzero(group_ids == g)[0] for g in np.unique(group_ids)]


def _std(values):
    return np.std(values, ddof=1) if values.size > 1 else 0.0


def test_grpo_group_scaling_matches_per_group_formula():
    rewards, group_ids, _ = _random_batch()
    expected = np.zeros_like(rewards)
    for idx in _members(group_ids):
        expected[idx] = (rewards[idx] - rewards[idx].mean()) / (_std(rewards[idx]) + 1e-4)
    np.testing.assert_allclose(advantages.compute("grpo", rewards, group_ids), expected, rtol=1e-5, atol=1e-6)


def test_grpo_batch_and_no_scaling():
    rewards, group_ids, _ = _random_batch(1)
    centred = np.zeros_like(rewards)
    for idx in _members(group_ids):
        centred[idx] = rewards[idx] - rewards[idx].mean()
    batch = advantages.compute("grpo", rewards, group_ids, std_scaling="batch")
    np.testing.assert_allclose(batch, centred / (np.std(rewards, ddof=1) + 1e-4), rtol=1e-5, atol=1e-6)
    unscaled = advantages.compute("grpo", rewards, group_ids, std_scaling="none")
    np.testing.assert_allclose(unscaled, centred, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(advantages.compute("dr_grpo", rewards, group_ids), centred, rtol=1e-5, atol=1e-6)


def test_rloo_subtracts_mean_of_other_samples():
    rewards, group_ids, _ = _random_batch(2)
    expected = np.zeros_like(rewards)
    for idx in _members(group_ids):
        for i in idx:
            others = [j for j in idx if j != i]
            expected[i] = rewards[i] - np.mean(rewards[others]) if others else 0.0
    np.testing.assert_allclose(advantages.compute("rloo", rewards, group_ids), expected, rtol=1e-5, atol=1e-6)


def test_reinforce_pp_whitens_over_batch():
    rewards, group_ids, _ = _random_batch(3)
    expected = (rewards - rewards.mean()) / (np.std(rewards, ddof=1) + 1e-8)
    np.testing.assert_allclose(advantages.compute("reinforce_pp", rewards, group_ids), expected, rtol=1e-5)


def test_reinforce_pp_baseline_removes_group_mean_then_whitens():
    rewards, group_ids, _ = _random_batch(4)
    centred = rewards.copy()
    for idx in _members(group_ids):
        centred[idx] -= rewards[idx].mean()
    expected = (centred - centred.mean()) / (np.std(centred, ddof=1) + 1e-8)
    got = advantages.compute("reinforce_pp_baseline", rewards, group_ids)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_opo_uses_length_weighted_baseline():
    rewards, group_ids, lengths = _random_batch(5)
    expected = np.zeros_like(rewards)
    for idx in _members(group_ids):
        baseline = np.sum(lengths[idx] * rewards[idx]) / np.sum(lengths[idx])
        expected[idx] = rewards[idx] - baseline
    got = advantages.compute("opo", rewards, group_ids, lengths=lengths)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_every_registered_estimator_returns_float32_per_sample():
    rewards, group_ids, lengths = _random_batch(6)
    for name in advantages.ESTIMATORS:
        out = advantages.compute(name, rewards, group_ids, lengths=lengths)
        assert out.dtype == np.float32 and out.shape == rewards.shape, name
        assert np.all(np.isfinite(out)), name


def test_binary_rewards_in_one_group_give_opposite_signs():
    rewards = np.array([1.0, 0.0, 0.0, 1.0])
    out = advantages.compute("grpo", rewards, np.zeros(4))
    # mean 0.5, unbiased std sqrt(1/3)
    np.testing.assert_allclose(out, (rewards - 0.5) / (np.sqrt(1 / 3) + 1e-4), rtol=1e-6)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: advantages.compute("nope", [1.0], [0]), "unknown advantage estimator"),
        (lambda: advantages.compute("grpo", [1.0, 2.0], [0]), "group_ids shape"),
        (lambda: advantages.compute("grpo", [], []), "non-empty"),
        (lambda: advantages.compute("grpo", [np.nan, 1.0], [0, 0]), "finite"),
        (lambda: advantages.compute("opo", [1.0, 0.0], [0, 0]), "needs completion lengths"),
        (lambda: advantages.compute("opo", [1.0, 0.0], [0, 0], lengths=[3]), "lengths shape"),
        (lambda: advantages.compute("grpo", [1.0, 0.0], [0, 0], std_scaling="rows"), "std_scaling"),
    ],
)
def test_bad_input_is_rejected(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_zero_variance_groups_drops_constant_groups():
    rewards = np.array([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.0])
    group_ids = np.array([0, 0, 1, 1, 2, 2, 2, 3])
    keep, dropped = advantages.zero_variance_groups(rewards, group_ids)
    np.testing.assert_array_equal(keep, [False, False, True, True, False, False, False, False])
    assert dropped == 3  # groups 0 and 2 are constant; the singleton group 3 has no variance either
    with pytest.raises(ValueError):
        advantages.zero_variance_groups(rewards, group_ids[:-1])
