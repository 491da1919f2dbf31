"""A learner on a device mesh resumes from its checkpoint: everything the checkpoint restores lands on the mesh, as
every process of a multi-host run needs (tests/launch/test_multihost.py runs two such processes)."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from models.config import ModelConfig
from models.sharding import make_mesh
from models.transformer import Transformer
from rl import advantages
from rl.checkpoint import Checkpointer
from rl.learner import Learner, LearnerConfig, OptimizerConfig
from rl.trajectories import build
from tests.tiny_models import tiny_config

CONFIG = ModelConfig.from_hf(tiny_config("llama", num_hidden_layers=1))


def _batch(seed: int, rows: int = 8):
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(3, 250, size=rng.integers(2, 7))) for _ in range(rows)]
    completions = [list(rng.integers(3, 250, size=rng.integers(1, 9))) for _ in range(rows)]
    sampler = [list(-rng.uniform(3.0, 8.0, size=len(c))) for c in completions]
    group_ids = np.repeat(np.arange(rows // 4), 4)
    rewards = np.asarray([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0])[:rows]
    return build(prompts, completions, sampler, advantages.compute("grpo", rewards, group_ids), group_ids, pad_id=0,
                 length_buckets=(16,))


def test_a_learner_on_a_mesh_resumes_to_the_uninterrupted_update(tmp_path):
    mesh = make_mesh(fsdp=4)
    config = LearnerConfig(optimizer=OptimizerConfig(learning_rate=1e-3, total_steps=8), mini_batch_size=4)
    batches = [_batch(1), _batch(2)]
    uninterrupted = Learner(Transformer(CONFIG, rngs=nnx.Rngs(0)), config, mesh=mesh)
    for batch in batches:
        uninterrupted.update(batch)

    interrupted = Learner(Transformer(CONFIG, rngs=nnx.Rngs(0)), config, mesh=mesh)
    interrupted.update(batches[0])
    checkpointer = Checkpointer(tmp_path, keep=1)
    checkpointer.save(1, interrupted, jax.random.key(0), {})
    checkpointer.close()
    resumed = Learner(Transformer(CONFIG, rngs=nnx.Rngs(5)), config, mesh=mesh)
    Checkpointer(tmp_path).restore(resumed)
    resumed.update(batches[1])

    for got, expected in zip(jax.tree.leaves((resumed.params, resumed.opt_state)),
                             jax.tree.leaves((uninterrupted.params, uninterrupted.opt_state))):
        assert got.sharding.is_equivalent_to(expected.sharding, got.ndim)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
