"""Same loss value as TRL 1.16's GRPOTrainer on identical log-probs, advantages and masks.

The trainer is built without a model: `GRPOTrainer._compute_loss` is run as-is on an instance whose only state is
the handful of attributes that method reads, with the model forward replaced by the given per-token log-probs.
"""

import collections
import types

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from trl import GRPOTrainer

from rl.losses import LossConfig, aggregation_weights, grpo_loss

BATCH, MAX_COMPLETION = 8, 12


def _data(seed: int):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, MAX_COMPLETION + 1, size=BATCH)
    mask = np.arange(MAX_COMPLETION)[None, :] < lengths[:, None]
    old = -rng.uniform(0.05, 4.0, size=(BATCH, MAX_COMPLETION))
    logprobs = old + rng.normal(scale=0.3, size=old.shape)
    ref = old + rng.normal(scale=0.3, size=old.shape)
    advantages = rng.normal(size=BATCH)
    f32 = lambda x: x.astype(np.float32)  # noqa: E731
    return dict(mask=mask, old=f32(old), logprobs=f32(logprobs), ref=f32(ref), advantages=f32(advantages))


def _trl_loss(loss_type: str, epsilon: float, epsilon_high: float | None, beta: float, data) -> float:
    trainer = object.__new__(GRPOTrainer)
    accelerator = types.SimpleNamespace(
        gather=lambda x: x, gather_for_metrics=lambda x: x, reduce=lambda x, reduction: x,
        num_processes=1, sync_gradients=True,
    )
    trainer.__dict__.update(
        model=types.SimpleNamespace(training=True),
        accelerator=accelerator,
        args=types.SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        loss_type=loss_type,
        epsilon_low=epsilon,
        epsilon_high=epsilon_high if epsilon_high is not None else epsilon,
        beta=beta,
        importance_sampling_level="token",
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=1,
        max_completion_length=MAX_COMPLETION,
        _metrics={"train": collections.defaultdict(list), "eval": collections.defaultdict(list)},
    )
    logprobs = torch.from_numpy(data["logprobs"])
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logprobs, torch.ones_like(logprobs), None)
    mask = torch.from_numpy(data["mask"].astype(np.int64))
    inputs = {
        "prompt_ids": torch.ones((BATCH, 3), dtype=torch.long),
        "prompt_mask": torch.ones((BATCH, 3), dtype=torch.long),
        "completion_ids": torch.ones((BATCH, MAX_COMPLETION), dtype=torch.long),
        "completion_mask": mask,
        "advantages": torch.from_numpy(data["advantages"]),
        "old_per_token_logps": torch.from_numpy(data["old"]),
        "ref_per_token_logps": torch.from_numpy(data["ref"]),
        "num_items_in_batch": mask.sum(),
    }
    return float(trainer._compute_loss(None, inputs))


AGGREGATION_OF_TRL_LOSS_TYPE = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dapo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
}


def _our_loss(loss_type: str, epsilon: float, epsilon_high: float | None, beta: float, data) -> float:
    config = LossConfig(
        clip_low=epsilon,
        clip_high=epsilon_high if epsilon_high is not None else epsilon,
        aggregation=AGGREGATION_OF_TRL_LOSS_TYPE[loss_type],
        norm_length=MAX_COMPLETION,
        kl_coef=beta,
        kl_estimator="k3",
    )
    mask = jnp.asarray(data["mask"])
    logprobs = jnp.asarray(data["logprobs"])
    loss, _ = grpo_loss(
        config,
        logprobs=logprobs,
        entropy=jnp.ones_like(logprobs),
        old_logprobs=jnp.asarray(data["old"]),
        sampler_logprobs=jnp.asarray(data["old"]),
        ref_logprobs=jnp.asarray(data["ref"]),
        advantages=jnp.broadcast_to(jnp.asarray(data["advantages"])[:, None], mask.shape),
        loss_mask=mask,
        token_weights=aggregation_weights(mask, config),
        num_tokens=mask.sum().astype(jnp.float32),
    )
    return float(loss)


@pytest.mark.parametrize("loss_type", sorted(AGGREGATION_OF_TRL_LOSS_TYPE))
@pytest.mark.parametrize("epsilon_high", [None, 0.28])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_loss_equals_trl_grpo_trainer(loss_type, epsilon_high, beta):
    for seed in range(3):
        data = _data(seed)
        expected = _trl_loss(loss_type, 0.2, epsilon_high, beta, data)
        got = _our_loss(loss_type, 0.2, epsilon_high, beta, data)
        assert abs(got - expected) <= 1e-6, (loss_type, seed, got, expected)


def test_parity_inputs_exercise_clipping():
    data = _data(0)
    ratio = np.exp(data["logprobs"] - data["old"])[data["mask"]]
    assert np.any(ratio > 1.28) and np.any(ratio < 0.8)
