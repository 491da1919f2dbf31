"""The accelerator default, bfloat16 matmuls over float32 weights and AdamW state (docs/memory-and-precision.md),
against an all-float32 learner on the CPU: the same log-probs and the same update, within bfloat16's rounding."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from models.config import ModelConfig
from models.transformer import Transformer
from rl import advantages
from rl.learner import Learner, LearnerConfig
from rl.trajectories import build
from tests.rl.helpers import SGDConfig
from tests.tiny_models import tiny_config

CONFIG = ModelConfig.from_hf(tiny_config("qwen2", num_hidden_layers=1))
# SGD: each learner moves its weights by lr x its own gradient, so the two updates compare the gradients themselves.
LEARNER = LearnerConfig(optimizer=SGDConfig(learning_rate=1.0, schedule="constant", max_grad_norm=None))


def _batch():
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(3, 250, size=6))] * 4 + [list(rng.integers(3, 250, size=9))] * 4
    completions = [list(rng.integers(3, 250, size=rng.integers(4, 12))) for _ in range(8)]
    group_ids = np.repeat(np.arange(2), 4)
    adv = advantages.compute("grpo", rng.integers(0, 2, size=8).astype(np.float64), group_ids)
    return build(prompts, completions, [[-5.0] * len(c) for c in completions], adv, group_ids, pad_id=0,
                 length_buckets=(32,))


def _learner(dtype: str) -> Learner:
    return Learner(Transformer(CONFIG.replace(dtype=dtype), rngs=nnx.Rngs(0)), LEARNER)


def _update(learner: Learner, batch) -> list[np.ndarray]:
    before = [np.asarray(x) for x in jax.tree.leaves(learner.params)]
    learner.update(batch)
    return [np.asarray(after) - b for after, b in zip(jax.tree.leaves(learner.params), before, strict=True)]


def test_bfloat16_compute_matches_float32_within_bfloat16_rounding():
    batch = _batch()
    full, mixed = _learner("float32"), _learner("bfloat16")
    assert {leaf.dtype for leaf in jax.tree.leaves(mixed.params)} == {np.dtype(np.float32)}
    assert mixed.model.config.dtype == np.dtype("bfloat16")

    mask = np.asarray(batch.loss_mask)
    full_logprobs = np.asarray(full.logprobs(batch))[mask]
    mixed_logprobs = np.asarray(mixed.logprobs(batch))[mask]
    # bfloat16 keeps 8 significant bits (relative rounding 2^-9 = 0.2%), while norms, RoPE, softmax and the
    # log-softmax stay float32: log-probs near -5.5 moved by at most 0.0018 (Xeon, 2026-12-05); 0.01 leaves 5x.
    assert np.abs(full_logprobs).mean() > 4.0
    assert np.abs(mixed_logprobs - full_logprobs).max() < 0.01

    full_step = np.concatenate([d.ravel() for d in _update(full, batch)])
    mixed_step = np.concatenate([d.ravel() for d in _update(mixed, batch)])
    cosine = full_step @ mixed_step / (np.linalg.norm(full_step) * np.linalg.norm(mixed_step))
    # The two gradients point the same way and have the same size to within a few bfloat16 roundings (measured:
    # cosine 0.99999, norms 0.05% apart).
    assert cosine > 0.9995
    assert abs(np.linalg.norm(mixed_step) / np.linalg.norm(full_step) - 1) < 0.005
    # A wrong-signed or dropped term is far outside this: the float32 step against a step on negated advantages.
    flipped = _learner("float32")
    flipped_step = np.concatenate([d.ravel() for d in _update(flipped, batch.replace(
        advantages=-np.asarray(batch.advantages)))])
    assert full_step @ flipped_step < 0
