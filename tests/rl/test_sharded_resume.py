"""A learner on a device mesh resumes from its checkpoint: everything the checkpoint restores lands on the mesh, as
every process of a multi-host run needs (tests/launch/test_multihost.py runs two such processes). Its steps, and the
warm-start's, return the state where the partition rules put it, so a second step runs the first one's program and
a resumed run the programs of the run it resumed."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from models.config import ModelConfig
from models.sharding import make_mesh, shard_model
from models.transformer import Transformer
import rl.learner
from rl import advantages, compiles
from rl.checkpoint import Checkpointer
from rl.learner import Learner, LearnerConfig, OptimizerConfig
from rl.supervised import Example, SFTConfig, SupervisedTrainer
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


def _places(tree) -> list:
    return [(leaf.sharding, leaf.ndim) for leaf in jax.tree.leaves(tree)]


def _assert_same_places(got: list, expected: list) -> None:
    assert len(got) == len(expected)
    for (after, ndim), (before, _) in zip(got, expected):
        assert after.is_equivalent_to(before, ndim), (before, after)


def test_an_update_leaves_the_state_where_the_rules_put_it_and_its_second_step_compiles_nothing(monkeypatch):
    """Before `models.sharding.keep_shardings`, a norm's weight came out of the first step split over `fsdp` (the
    rules replicate it) and the update's second step compiled the step again for that layout."""
    mesh = make_mesh(fsdp=4)
    config = LearnerConfig(optimizer=OptimizerConfig(learning_rate=1e-3, total_steps=8), mini_batch_size=4)
    learner = Learner(Transformer(CONFIG, rngs=nnx.Rngs(0)), config, mesh=mesh)
    placed = _places((learner.params, learner.opt_state))
    assert learner.params["layers"][0]["input_layernorm"]["weight"].sharding.is_fully_replicated
    programs, train_step = [], rl.learner._train_step

    def counted(*args, **kwargs):
        before = compiles.totals()
        result = train_step(*args, **kwargs)
        programs.append((compiles.totals() - before).programs)
        return result

    monkeypatch.setattr(rl.learner, "_train_step", counted)
    learner.update(_batch(1))  # two optimizer steps of 4 rows
    assert len(programs) == 2 and programs[1] == 0, programs
    _assert_same_places(_places((learner.params, learner.opt_state)), placed)
    assert learner.params["layers"][0]["input_layernorm"]["weight"].sharding.is_fully_replicated


def test_a_warm_start_step_on_a_mesh_leaves_the_state_in_place_and_its_second_step_compiles_nothing():
    mesh = make_mesh(fsdp=4)
    model = Transformer(CONFIG, rngs=nnx.Rngs(0))
    shard_model(model, mesh)
    trainer = SupervisedTrainer(model, SFTConfig(batch_size=4))
    rng = np.random.default_rng(0)
    examples = [Example(prompt_ids=tuple(rng.integers(3, 250, 5).tolist()),
                        completion_ids=tuple(rng.integers(3, 250, 4).tolist())) for _ in range(4)]
    batch = trainer.batch(examples, pad_id=0)
    placed = _places((nnx.state(model, nnx.Param), trainer.opt_state))
    trainer.step(batch)
    _assert_same_places(_places((nnx.state(model, nnx.Param), trainer.opt_state)), placed)
    before = compiles.totals()
    trainer.step(batch)
    assert (compiles.totals() - before).programs == 0, "the second step compiled a new program"
