"""The GRPO objective against a plain numpy implementation that loops over sequences and tokens."""

import dataclasses
import itertools
from typing import get_args

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl import auxiliary, losses
from rl.auxiliary import TermConfig, TermInputs, TermSpec
from rl.losses import Aggregation, LossConfig, aggregation_weights, grpo_loss, kl_penalty, mismatch_weights

BATCH, TIME = 6, 9


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = np.array([1, 4, 9, 0, 6, 3])  # uneven, one row without loss tokens (batch padding)
    starts = np.array([3, 2, 0, 0, 1, 5])
    mask = np.zeros((BATCH, TIME), dtype=bool)
    for row, (start, length) in enumerate(zip(starts, lengths)):
        mask[row, start:start + length] = True
    old = -rng.uniform(0.1, 3.0, size=(BATCH, TIME))
    logprobs = old + rng.normal(scale=0.3, size=(BATCH, TIME))  # ratios around 1, some clipped
    sampler = old + rng.normal(scale=0.5, size=(BATCH, TIME))
    ref = old + rng.normal(scale=0.4, size=(BATCH, TIME))
    entropy = rng.uniform(0.0, 4.0, size=(BATCH, TIME))
    advantages = np.array([1.3, -0.7, 0.4, 2.0, -1.5, -0.2])
    # Garbage at masked positions must not leak into the loss.
    for array in (logprobs, old, sampler, ref, entropy):
        array[~mask] = rng.normal(scale=100.0, size=(~mask).sum())
    row_bonus = rng.uniform(0.0, 2.0, size=BATCH)
    row_bonus[2] = 0.0  # a row the auxiliary term does not read
    return dict(
        logprobs=logprobs.astype(np.float32), old_logprobs=old.astype(np.float32),
        sampler_logprobs=sampler.astype(np.float32), ref_logprobs=ref.astype(np.float32),
        entropy=entropy.astype(np.float32), advantages=advantages, loss_mask=mask,
        row_bonus=row_bonus.astype(np.float32),
    )


def _numpy_kl(logp, ref, estimator):
    log_ratio = ref - logp
    if estimator.startswith("k1"):
        return -log_ratio
    if estimator.startswith("k2"):
        return 0.5 * log_ratio**2
    return np.exp(log_ratio) - 1 - log_ratio


def _numpy_correction(old, sampler, config):
    log_w = old - sampler
    cap = config.mismatch_cap
    kind = config.mismatch_correction
    if kind == "none":
        return np.ones_like(log_w)
    if kind == "tis-token":
        return np.minimum(np.exp(log_w), cap)
    if kind == "tis-seq":
        return np.full_like(log_w, min(np.exp(log_w.sum()), cap))
    if kind == "mask-token":
        w = np.exp(log_w)
        return ((w >= 1 / cap) & (w <= cap)).astype(np.float64)
    geometric = np.exp(log_w.mean())
    return np.full_like(log_w, float(1 / cap <= geometric <= cap))


def numpy_objective(config: LossConfig, data, coef: float = 0.0) -> float:
    """The objective written out per sequence, in float64; `coef` is the row bonus term's weight, if it is on."""
    per_sequence = []
    for row in range(BATCH):
        idx = np.nonzero(data["loss_mask"][row])[0]
        if idx.size == 0:
            continue
        logp, old = data["logprobs"][row, idx].astype(np.float64), data["old_logprobs"][row, idx].astype(np.float64)
        sampler, ref = data["sampler_logprobs"][row, idx], data["ref_logprobs"][row, idx].astype(np.float64)
        entropy, adv = data["entropy"][row, idx], data["advantages"][row]
        if config.policy_loss == "gspo":
            ratio = np.full(idx.size, np.exp(np.mean(logp - old)))
        else:
            ratio = np.exp(logp - old)
        clipped = np.clip(ratio, 1 - config.clip_low, 1 + config.clip_high)
        if config.policy_loss == "cispo":
            terms = -clipped * adv * logp
        else:
            terms = np.maximum(-adv * ratio, -adv * clipped)
            if config.dual_clip is not None and adv < 0:
                terms = np.minimum(terms, -adv * config.dual_clip)
        terms = terms * _numpy_correction(old, sampler.astype(np.float64), config)
        terms = terms + config.kl_coef * _numpy_kl(logp, ref, config.kl_estimator)
        terms = terms - config.entropy_coef * entropy
        # The row bonus term weighs each row as the aggregation does: its bonus on every one of its tokens.
        if config.auxiliary_terms:
            terms = terms - coef * data["row_bonus"][row]
        per_sequence.append(terms)
    if config.aggregation == "token-mean":
        return np.concatenate(per_sequence).sum() / sum(t.size for t in per_sequence)
    if config.aggregation == "seq-mean-token-mean":
        return np.mean([t.mean() for t in per_sequence])
    if config.aggregation == "seq-mean-token-sum":
        return np.mean([t.sum() for t in per_sequence])
    return np.sum([t.sum() for t in per_sequence]) / (len(per_sequence) * config.norm_length)


def _jax_objective(config: LossConfig, data, rows=slice(None), step=0):
    mask = jnp.asarray(data["loss_mask"])
    advantages = jnp.broadcast_to(jnp.asarray(data["advantages"], jnp.float32)[:, None], mask.shape)
    weights = aggregation_weights(mask, config)
    take = lambda x: jnp.asarray(x)[rows]  # noqa: E731
    return grpo_loss(
        config,
        logprobs=take(data["logprobs"]), entropy=take(data["entropy"]), old_logprobs=take(data["old_logprobs"]),
        sampler_logprobs=take(data["sampler_logprobs"]), ref_logprobs=take(data["ref_logprobs"]),
        advantages=advantages[rows], loss_mask=mask[rows], token_weights=weights[rows],
        num_tokens=mask.sum().astype(jnp.float32), step=step,
        term_inputs=TermInputs(
            model=None, temperature=1.0, states={"bonus": take(data["row_bonus"])[:, None]}, positions={},
            row_labels={}, loss_mask=mask[rows], token_weights=weights[rows], num_micro_batches=1,
        ),
    )


def row_bonus(inputs: TermInputs) -> tuple[jax.Array, dict[str, jax.Array]]:
    """A test term: minus each row's bonus (its state's one entry), each row weighted as the aggregation weighs it."""
    weighted = jnp.sum(inputs.token_weights.sum(axis=1) * inputs.states["bonus"][:, 0])
    return -weighted, {"row_bonus": weighted}


@pytest.fixture
def bonus_term(monkeypatch):
    """A factory of LossConfigs with the registered `row_bonus` term at coefficient `coef`."""
    monkeypatch.setitem(auxiliary.AUXILIARY_TERMS, "row_bonus", TermSpec(row_bonus, token_positions=("bonus",)))
    return lambda coef, decay_steps=0, **fields: LossConfig(
        auxiliary_terms=(TermConfig("row_bonus", coef, decay_steps),), **fields
    )


CONFIGS = {
    "ppo-token-mean": LossConfig(aggregation="token-mean"),
    "ppo-clip-higher-seq-mean-token-mean": LossConfig(clip_low=0.2, clip_high=0.28),
    "ppo-dual-clip-seq-mean-token-sum": LossConfig(dual_clip=1.5, clip_low=0.1, aggregation="seq-mean-token-sum"),
    "ppo-seq-mean-token-sum-norm": LossConfig(aggregation="seq-mean-token-sum-norm", norm_length=12),
    "gspo": LossConfig(policy_loss="gspo", clip_low=0.05, clip_high=0.08),
    "cispo": LossConfig(policy_loss="cispo", clip_low=0.9, clip_high=0.3, aggregation="token-mean"),
    "kl-k1": LossConfig(kl_coef=0.1, kl_estimator="k1"),
    "kl-k2": LossConfig(kl_coef=0.1, kl_estimator="k2"),
    "kl-k3": LossConfig(kl_coef=0.1, kl_estimator="k3"),
    "kl-k1+": LossConfig(kl_coef=0.1, kl_estimator="k1+"),
    "kl-k2+": LossConfig(kl_coef=0.1, kl_estimator="k2+"),
    "kl-k3+": LossConfig(kl_coef=0.1, kl_estimator="k3+", aggregation="token-mean"),
    "entropy": LossConfig(entropy_coef=0.01),
    "tis-token": LossConfig(mismatch_correction="tis-token", mismatch_cap=1.5),
    "tis-seq": LossConfig(mismatch_correction="tis-seq", mismatch_cap=3.0),
    "mask-token": LossConfig(mismatch_correction="mask-token", mismatch_cap=1.5),
    "mask-seq": LossConfig(mismatch_correction="mask-seq", mismatch_cap=1.2, aggregation="token-mean"),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_objective_matches_numpy(name):
    config = CONFIGS[name]
    for seed in range(3):
        data = _inputs(seed)
        loss, metrics = _jax_objective(config, data)
        np.testing.assert_allclose(float(loss), numpy_objective(config, data), rtol=2e-5, atol=1e-6)
        assert all(np.isfinite(float(v)) for v in metrics.values())


def test_mismatch_corrections_actually_change_weights():
    data = _inputs(0)
    mask = jnp.asarray(data["loss_mask"])
    for kind in ("tis-token", "tis-seq", "mask-token", "mask-seq"):
        config = LossConfig(mismatch_correction=kind, mismatch_cap=1.2)
        weights = np.asarray(mismatch_weights(data["old_logprobs"], data["sampler_logprobs"], mask, config))
        active = weights[data["loss_mask"]]
        assert np.any(active != 1.0) and np.all(active >= 0.0), kind


AGGREGATIONS_FOR_THE_TERM = {
    "seq-mean-token-mean": {},
    "token-mean": {"aggregation": "token-mean"},
    "seq-mean-token-sum-norm": {"aggregation": "seq-mean-token-sum-norm", "norm_length": 12},
}


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS_FOR_THE_TERM))
def test_an_auxiliary_term_adds_its_weighted_value_to_the_objective_and_logs_it(bonus_term, aggregation):
    config = bonus_term(0.3, **AGGREGATIONS_FOR_THE_TERM[aggregation])
    for seed in range(2):
        data = _inputs(seed)
        loss, metrics = _jax_objective(config, data)
        np.testing.assert_allclose(float(loss), numpy_objective(config, data, coef=0.3), rtol=2e-5, atol=1e-6)
        assert float(metrics["loss/row_bonus"]) == pytest.approx(-0.3 * float(metrics["row_bonus"]), rel=1e-6)
    rows_with_tokens = data["loss_mask"].any(axis=1)
    if aggregation == "seq-mean-token-mean":  # every row with tokens weighs 1 / rows
        expected = data["row_bonus"][rows_with_tokens].astype(np.float64).mean()
        assert float(metrics["row_bonus"]) == pytest.approx(expected, rel=1e-6)
    mask = jnp.asarray(data["loss_mask"])
    with pytest.raises(ValueError, match="'row_bonus' needs term_inputs"):
        grpo_loss(
            config, logprobs=mask * 0.0, entropy=mask * 0.0, old_logprobs=mask * 0.0, sampler_logprobs=mask * 0.0,
            ref_logprobs=None, advantages=mask * 0.0, loss_mask=mask, token_weights=mask * 0.0, num_tokens=1.0,
        )


def test_a_decaying_term_falls_linearly_to_zero_over_its_decay_steps(bonus_term):
    decaying = bonus_term(0.3, decay_steps=4)
    [term] = decaying.auxiliary_terms
    coefs = [term.coef_at(step) for step in (0, 1, 2, 3, 4, 9)]
    assert all(type(coef) is float for coef in coefs)  # a host step needs no device op
    np.testing.assert_allclose(coefs, [0.3, 0.225, 0.15, 0.075, 0.0, 0.0], rtol=1e-12)
    np.testing.assert_allclose(float(term.coef_at(jnp.int32(3))), 0.075, rtol=1e-6)
    assert [t.name for t in decaying.terms_on_at(3)] == ["row_bonus"] and decaying.terms_on_at(4) == ()
    assert bonus_term(0.3).auxiliary_terms[0].coef_at(10_000) == 0.3

    # Inside a jitted step the step is traced, and the objective is the reference objective at that step's weight.
    data = _inputs(0)
    objective = jax.jit(lambda step: _jax_objective(decaying, data, step=step))
    for step, coef in ((0, 0.3), (1, 0.225), (6, 0.0)):
        loss, metrics = objective(jnp.int32(step))
        np.testing.assert_allclose(float(loss), numpy_objective(decaying, data, coef=coef), rtol=2e-5, atol=1e-6)
        assert float(metrics["loss/row_bonus"]) == pytest.approx(-coef * float(metrics["row_bonus"]), abs=1e-7)


def test_micro_batch_sums_equal_whole_batch_with_an_auxiliary_term(bonus_term):
    config = bonus_term(0.3, aggregation="token-mean")
    data = _inputs(1)
    whole, whole_metrics = _jax_objective(config, data)
    parts = [_jax_objective(config, data, slice(start, start + 2)) for start in range(0, BATCH, 2)]
    np.testing.assert_allclose(sum(float(loss) for loss, _ in parts), float(whole), rtol=1e-6, atol=1e-7)
    for key, value in whole_metrics.items():
        np.testing.assert_allclose(sum(float(m[key]) for _, m in parts), float(value), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_micro_batch_sums_equal_whole_batch(name):
    config = CONFIGS[name]
    data = _inputs(1)
    whole, whole_metrics = _jax_objective(config, data)
    parts = [_jax_objective(config, data, slice(start, start + 2)) for start in range(0, BATCH, 2)]
    np.testing.assert_allclose(sum(float(loss) for loss, _ in parts), float(whole), rtol=1e-6, atol=1e-7)
    for key, value in whole_metrics.items():
        np.testing.assert_allclose(sum(float(m[key]) for _, m in parts), float(value), rtol=1e-5, atol=1e-7)


def test_straight_through_kl_has_k2_gradient_and_own_value():
    rng = np.random.default_rng(0)
    logp, ref = jnp.asarray(-rng.uniform(0.1, 2, 20)), jnp.asarray(-rng.uniform(0.1, 2, 20))
    k2_grad = jax.grad(lambda x: kl_penalty(x, ref, "k2").sum())(logp)
    for name in ("k1", "k3"):
        value = kl_penalty(logp, ref, name + "+")
        np.testing.assert_allclose(value, kl_penalty(logp, ref, name), rtol=1e-6)
        np.testing.assert_allclose(jax.grad(lambda x: kl_penalty(x, ref, name + "+").sum())(logp), k2_grad, rtol=1e-6)
    # Plain k1 has gradient 1 per token (its expectation, not its sample value, is what has zero gradient).
    np.testing.assert_allclose(jax.grad(lambda x: kl_penalty(x, ref, "k1").sum())(logp), np.ones(20))


def test_cispo_gradient_is_clipped_ratio_times_advantage():
    data = _inputs(2)
    config = CONFIGS["cispo"]
    grad = jax.grad(lambda lp: _jax_objective(config, dict(data, logprobs=lp))[0])(jnp.asarray(data["logprobs"]))
    mask = data["loss_mask"]
    ratio = np.exp(np.where(mask, data["logprobs"] - data["old_logprobs"], 0.0))
    clipped = np.clip(ratio, 1 - config.clip_low, 1 + config.clip_high)
    expected = np.where(mask, -clipped * data["advantages"][:, None] / mask.sum(), 0.0)
    np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-5, atol=1e-7)


def test_ppo_gradient_vanishes_where_clipped():
    data = _inputs(3)
    config = LossConfig(clip_low=0.05, clip_high=0.05, aggregation="token-mean")
    grad = np.asarray(jax.grad(lambda lp: _jax_objective(config, dict(data, logprobs=lp))[0])(
        jnp.asarray(data["logprobs"])))
    mask = data["loss_mask"]
    ratio = np.exp(np.where(mask, data["logprobs"] - data["old_logprobs"], 0.0))
    adv = np.broadcast_to(data["advantages"][:, None], mask.shape)
    clipped = mask & (((ratio > 1.05) & (adv > 0)) | ((ratio < 0.95) & (adv < 0)))
    assert clipped.any() and (mask & ~clipped).any()
    assert np.all(grad[clipped] == 0.0)
    np.testing.assert_allclose(grad[mask & ~clipped], (-adv * ratio / mask.sum())[mask & ~clipped], rtol=1e-5)


def test_clip_fraction_metrics_count_clipped_tokens():
    data = _inputs(4)
    config = LossConfig(clip_low=0.1, clip_high=0.1, dual_clip=1.2)
    _, metrics = _jax_objective(config, data)
    mask = data["loss_mask"]
    ratio = np.exp(data["logprobs"][mask] - data["old_logprobs"][mask])
    adv = np.broadcast_to(data["advantages"][:, None], mask.shape)[mask]
    np.testing.assert_allclose(metrics["clip/high"], np.mean((ratio > 1.1) & (adv > 0)), rtol=1e-6)
    np.testing.assert_allclose(metrics["clip/low"], np.mean((ratio < 0.9) & (adv < 0)), rtol=1e-6)
    np.testing.assert_allclose(metrics["clip/dual"], np.mean((ratio > 1.2) & (adv < 0)), rtol=1e-6)
    sampler_log_ratio = (data["old_logprobs"] - data["sampler_logprobs"])[mask]
    np.testing.assert_allclose(
        metrics["mismatch/k3"], np.mean(np.exp(sampler_log_ratio) - 1 - sampler_log_ratio), rtol=1e-5)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(policy_loss="ppo2"), "policy_loss"),
        (dict(aggregation="sum"), "aggregation"),
        (dict(kl_estimator="k4"), "kl_estimator"),
        (dict(mismatch_correction="is"), "mismatch_correction"),
        (dict(clip_low=1.0), "clip_low"),
        (dict(clip_high=-0.1), "clip_high"),
        (dict(dual_clip=0.9), "dual_clip"),
        (dict(dual_clip=3.0, policy_loss="cispo"), "dual_clip"),
        (dict(aggregation="seq-mean-token-sum-norm"), "norm_length"),
        (dict(kl_coef=-1.0), "kl_coef"),
        (dict(mismatch_cap=1.0), "mismatch_cap"),
        (dict(auxiliary_terms=("route_entropy",)), "must be TermConfigs"),
    ],
)
def test_bad_config_is_rejected(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(LossConfig(), **changes)


ZERO_ADVANTAGE_ROW = 1  # four loss tokens


def assert_a_zero_advantage_row_has_no_gradient(config: LossConfig) -> None:
    """The gradient of the objective (no KL or entropy term) with respect to the log-probs is exactly 0 on a row whose
    advantage is 0, and not 0 on each other row with loss tokens."""
    data = _inputs(5)
    data["advantages"] = data["advantages"].copy()
    data["advantages"][ZERO_ADVANTAGE_ROW] = 0.0
    grad = np.asarray(jax.grad(lambda lp: _jax_objective(config, dict(data, logprobs=lp))[0])(
        jnp.asarray(data["logprobs"])))
    assert np.all(grad[ZERO_ADVANTAGE_ROW] == 0.0), f"{config.policy_loss}: a zero-advantage row has a gradient"
    for row in np.flatnonzero(data["loss_mask"].any(axis=1)):
        if row != ZERO_ADVANTAGE_ROW:
            assert np.any(grad[row] != 0.0), f"{config.policy_loss}: row {row} has no gradient"


@pytest.mark.parametrize(
    "policy_loss, aggregation", itertools.product(sorted(losses.POLICY_LOSSES), get_args(Aggregation))
)
def test_every_policy_loss_gives_a_zero_advantage_row_no_gradient(policy_loss, aggregation):
    # What `LearnerConfig.skip_zero_gradient_rows` relies on to skip such rows without changing the update.
    assert_a_zero_advantage_row_has_no_gradient(
        LossConfig(policy_loss=policy_loss, aggregation=aggregation, norm_length=TIME)
    )


def test_the_zero_advantage_check_fails_for_a_loss_with_a_term_not_proportional_to_the_advantage(monkeypatch):
    def ppo_with_a_length_penalty(logprobs, old_logprobs, advantages, loss_mask, config):
        loss, clips = losses.ppo_loss(logprobs, old_logprobs, advantages, loss_mask, config)
        return loss + 0.01 * logprobs, clips

    monkeypatch.setitem(losses.POLICY_LOSSES, "ppo-length-penalty", ppo_with_a_length_penalty)
    with pytest.raises(AssertionError, match="a zero-advantage row has a gradient"):
        assert_a_zero_advantage_row_has_no_gradient(LossConfig(policy_loss="ppo-length-penalty"))
