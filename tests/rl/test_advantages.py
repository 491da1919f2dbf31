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
    batch = advantages.compute("grpo", rewards, group_ids, options={"std_scaling": "batch"})
    np.testing.assert_allclose(batch, centred / (np.std(rewards, ddof=1) + 1e-4), rtol=1e-5, atol=1e-6)
    unscaled = advantages.compute("grpo", rewards, group_ids, options={"std_scaling": "none"})
    np.testing.assert_allclose(unscaled, centred, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(advantages.compute("dr_grpo", rewards, group_ids), centred, rtol=1e-5, atol=1e-6)


def _labels_of_groups(group_ids):
    """Groups 10 and 20 labelled "a", 30 and 40 "b" (the singleton group 10 included)."""
    return np.where(group_ids <= 20, "a", "b")


def test_grpo_label_scaling_divides_by_the_std_of_the_centred_rewards_over_each_label():
    rewards, group_ids, _ = _random_batch(3)
    labels = _labels_of_groups(group_ids)
    centred = np.zeros_like(rewards)
    for idx in _members(group_ids):
        centred[idx] = rewards[idx] - rewards[idx].mean()
    expected = np.zeros_like(rewards)
    for label in ("a", "b"):
        idx = np.nonzero(labels == label)[0]
        expected[idx] = centred[idx] / (np.std(centred[idx], ddof=1) + 1e-4)
    got = advantages.compute("grpo", rewards, group_ids, labels=labels, options={"std_scaling": "label"})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    for label in ("a", "b"):
        assert np.std(got[labels == label], ddof=1) == pytest.approx(1.0, abs=1e-3)


def test_grpo_label_scaling_lets_no_label_outweigh_another_by_the_size_of_its_reward_differences():
    rewards, group_ids, _ = _random_batch(4)
    labels = _labels_of_groups(group_ids)
    louder = np.where(labels == "b", 10.0 * rewards, rewards)

    def scaled(values, std_scaling):
        return advantages.compute("grpo", values, group_ids, labels=labels, options={"std_scaling": std_scaling})

    np.testing.assert_allclose(scaled(louder, "label"), scaled(rewards, "label"), rtol=1e-4, atol=1e-5)
    quiet = labels == "a"
    assert np.abs(scaled(louder, "batch")[quiet]).sum() < 0.5 * np.abs(scaled(rewards, "batch")[quiet]).sum()


def test_labels_reach_only_the_estimators_that_declare_them_and_must_fit_the_rewards():
    rewards, group_ids, _ = _random_batch(5)
    labels = _labels_of_groups(group_ids)
    np.testing.assert_array_equal(
        advantages.compute("rloo", rewards, group_ids, labels=labels), advantages.compute("rloo", rewards, group_ids)
    )
    with pytest.raises(ValueError, match="std_scaling='label' needs the completions' labels"):
        advantages.compute("grpo", rewards, group_ids, options={"std_scaling": "label"})
    with pytest.raises(ValueError, match="labels shape"):
        advantages.compute("grpo", rewards, group_ids, labels=labels[:-1], options={"std_scaling": "label"})
    with pytest.raises(ValueError, match="takes no option 'labels'"):
        advantages.check_options("grpo", {"labels": labels})


def test_rloo_subtracts_mean_of_other_samples():
    rewards, group_ids, _ = _random_batch(2)
    expected = np.zeros_like(rewards)
    for idx in _members(group_ids):
        for i in idx:
            others = [j for j in idx if j != i]
            expected[i] = rewards[i] - np.mean(rewards[others]) if others else 0.0
    np.testing.assert_allclose(advantages.compute("rloo", rewards, group_ids), expected, rtol=1e-5, atol=1e-6)


def _verl_masked_whiten(values, mask):
    """numpy port of verl's `masked_whiten` (verl/utils/torch_functional.py): the mean and the variance over the
    masked tokens, the variance times n / (n - 1) for n masked tokens (unbiased), then (v - mean) / sqrt(var + 1e-8).
    """
    count = mask.sum()
    mean = (values * mask).sum() / count
    variance = ((values - mean) ** 2 * mask).sum() / count * (count / (count - 1))
    return (values - mean) / np.sqrt(variance + 1e-8)


def _response_mask(lengths):
    return (np.arange(int(lengths.max()))[None, :] < lengths[:, None]).astype(np.float64)


def _per_completion(token_advantages, mask):
    """The one advantage each completion's tokens share (checked equal over its tokens)."""
    first = token_advantages[:, :1]
    np.testing.assert_allclose(token_advantages * mask, first * mask, rtol=1e-12, atol=1e-12)
    return first[:, 0]


def _verl_reinforce_pp(rewards, mask):
    """verl's compute_reinforce_plus_plus_outcome_advantage, gamma 1: the outcome reward on each completion's last
    token, discounted returns summed backwards and reset after EOS, whitened over the response mask."""
    token_rewards = np.zeros_like(mask)
    token_rewards[np.arange(mask.shape[0]), mask.sum(axis=1).astype(int) - 1] = rewards
    returns = np.zeros_like(mask)
    running = np.zeros(mask.shape[0])
    for t in reversed(range(mask.shape[1])):
        running = token_rewards[:, t] + running
        returns[:, t] = running
        running = running * mask[:, t]
    return _per_completion(_verl_masked_whiten(returns, mask) * mask, mask)


def _verl_reinforce_pp_baseline(rewards, group_ids, mask):
    """verl's compute_reinforce_plus_plus_baseline_outcome_advantage: the group mean removed, the score tiled over
    the response, whitened over the response mask."""
    scores = rewards.copy()
    for idx in _members(group_ids):
        scores[idx] -= rewards[idx].mean()
    tiled = scores[:, None] * mask
    return _per_completion(_verl_masked_whiten(tiled, mask) * mask, mask)


def _batch_without_singletons(seed):
    rewards, group_ids, lengths = _random_batch(seed)
    sizes = {g: np.sum(group_ids == g) for g in np.unique(group_ids)}
    keep = np.array([sizes[g] > 1 for g in group_ids])  # verl's baseline is 0 for a group of one, ours the reward
    return rewards[keep], group_ids[keep], lengths[keep]


@pytest.mark.parametrize("name", ["reinforce_pp", "reinforce_pp_baseline"])
def test_reinforce_pp_token_whitening_matches_verl(name):
    rewards, group_ids, lengths = _batch_without_singletons(3)
    mask = _response_mask(lengths)
    if name == "reinforce_pp":
        expected = _verl_reinforce_pp(rewards, mask)
    else:
        expected = _verl_reinforce_pp_baseline(rewards, group_ids, mask)
    got = advantages.compute(name, rewards, group_ids, lengths=lengths)  # per token is the default
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert np.abs(got - advantages.compute(name, rewards, group_ids, options={"whiten": "sequence"})).max() > 0.05


@pytest.mark.parametrize("name", ["reinforce_pp", "reinforce_pp_baseline"])
def test_reinforce_pp_sequence_whitening_matches_verl_with_one_token_per_completion(name):
    rewards, group_ids, lengths = _batch_without_singletons(4)
    mask = np.ones((rewards.size, 1))
    if name == "reinforce_pp":
        expected = _verl_reinforce_pp(rewards, mask)
    else:
        expected = _verl_reinforce_pp_baseline(rewards, group_ids, mask)
    got = advantages.compute(name, rewards, group_ids, lengths=lengths, options={"whiten": "sequence"})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_token_whitening_weighs_long_completions_more():
    # three tokens of reward 1 and one of reward 0: mean 3/4, unbiased variance (3/16 + 9/16) / 3 = 1/4
    got = advantages.compute("reinforce_pp", [1.0, 0.0], [0, 0], lengths=[3, 1])
    np.testing.assert_allclose(got, [0.5, -1.5], rtol=1e-6)
    # one value per completion: mean 1/2, variance 1/2
    got = advantages.compute("reinforce_pp", [1.0, 0.0], [0, 0], options={"whiten": "sequence"})
    np.testing.assert_allclose(got, [np.sqrt(0.5), -np.sqrt(0.5)], rtol=1e-6)


def test_reinforce_pp_baseline_gives_a_singleton_group_a_zero_centred_reward():
    rewards, group_ids, lengths = _random_batch(7)
    centred = rewards.copy()
    for idx in _members(group_ids):
        centred[idx] -= rewards[idx].mean()
    mean = np.sum(lengths * centred) / lengths.sum()
    variance = np.sum(lengths * (centred - mean) ** 2) / (lengths.sum() - 1)
    got = advantages.compute("reinforce_pp_baseline", rewards, group_ids, lengths=lengths)
    np.testing.assert_allclose(got, (centred - mean) / np.sqrt(variance + 1e-8), rtol=1e-5, atol=1e-6)


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
        (lambda: advantages.compute("grpo", [1.0, 0.0], [0, 0], options={"std_scaling": "rows"}), "std_scaling"),
        (lambda: advantages.compute("reinforce_pp", [1.0, 0.0], [0, 0]), "needs completion lengths"),
        (lambda: advantages.compute("reinforce_pp", [1.0, 0.0], [0, 0], lengths=[2, -1]), "non-negative"),
        (lambda: advantages.compute("reinforce_pp", [1.0, 0.0], [0, 0], lengths=[0, 0]), "positive total"),
        (lambda: advantages.compute("reinforce_pp_baseline", [1.0, 0.0], [0, 0], options={"whiten": "rows"}), "whiten"),
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


def test_an_option_reaches_the_estimator_that_declares_it(monkeypatch):
    def scaled(rewards, group_ids, *, scale: float = 1.0):
        return rewards * scale

    monkeypatch.setitem(advantages.ESTIMATORS, "scaled", scaled)
    assert advantages.accepted_options("scaled") == {"scale": 1.0}
    np.testing.assert_array_equal(advantages.compute("scaled", [1.0, -2.0], [0, 0]), [1.0, -2.0])
    np.testing.assert_array_equal(advantages.compute("scaled", [1.0, -2.0], [0, 0], options={"scale": 3}), [3.0, -6.0])
    with pytest.raises(ValueError, match=r"'scaled': option 'scale' must be float, got '3'"):
        advantages.compute("scaled", [1.0, -2.0], [0, 0], options={"scale": "3"})


def test_the_registered_estimators_declare_their_options_and_lengths_and_labels_are_not_options():
    assert advantages.accepted_options("grpo") == {"std_scaling": "group", "eps": 1e-4}
    assert advantages.accepted_options("reinforce_pp") == {"whiten": "token", "eps": 1e-8}
    assert advantages.accepted_options("opo") == {} and advantages.accepted_options("dr_grpo") == {}


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("dr_grpo", {"std_scaling": "none"}, r"estimator 'dr_grpo' takes no option 'std_scaling'; it takes none"),
        ("grpo", {"whiten": "token"}, r"estimator 'grpo' takes no option 'whiten'; it takes \['eps', 'std_scaling'\]"),
        ("grpo", {"eps": True}, r"'grpo': option 'eps' must be float, got True"),
        ("grpo", {"std_scaling": "rows"},
         r"'grpo': option 'std_scaling' must be \('group', 'batch', 'label', 'none'\)"),
        ("opo", {"lengths": [1.0, 2.0]}, r"'opo' takes no option 'lengths'"),
    ],
)
def test_an_option_the_estimator_does_not_declare_or_of_the_wrong_type_is_rejected(name, options, message):
    with pytest.raises(ValueError, match=message):
        advantages.compute(name, [1.0, 0.0], [0, 0], lengths=[1.0, 2.0], options=options)
    with pytest.raises(ValueError, match=message):
        advantages.check_options(name, options)


def test_an_option_of_an_uncheckable_type_is_a_type_error(monkeypatch):
    def listed(rewards, group_ids, *, weights: list | None = None):
        return rewards

    monkeypatch.setitem(advantages.ESTIMATORS, "listed", listed)
    with pytest.raises(TypeError, match="cannot be checked"):
        advantages.compute("listed", [1.0, 0.0], [0, 0], options={"weights": [1.0]})


def test_options_for_picks_the_estimators_own_options_and_rejects_a_misspelt_one():
    every_flag = {"std_scaling": "batch", "whiten": "sequence"}
    assert advantages.options_for("grpo", every_flag) == {"std_scaling": "batch"}
    assert advantages.options_for("reinforce_pp_baseline", every_flag) == {"whiten": "sequence"}
    assert advantages.options_for("rloo", every_flag) == {}
    with pytest.raises(ValueError, match=r"no advantage estimator takes option 'std_scale'"):
        advantages.options_for("grpo", {"std_scale": "batch"})
