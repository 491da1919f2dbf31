"""The learner with LoRA (`LearnerConfig.lora`): only the adapters train and carry optimizer state, generators
receive the merged weights in process and on disk, and a checkpoint of the adapters resumes exactly."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
import orbax.checkpoint as ocp
from flax import nnx

from models import hf_io
from models.lora import LoRAConfig
from rl.checkpoint import Checkpointer
from rl.learner import Learner, LearnerConfig, OptimizerConfig
from rl.trajectories import build
from rollout.torch_generator import TorchGenerator
from rollout.transport import read_checkpoint
from rollout.types import SamplingParams
from rollout.weight_sync import save_checkpoint, sync
from tests.tiny_models import tiny_hf_model_dir

PROMPTS = [[5, 17, 33, 9], [100, 7]]
SAMPLING = SamplingParams(temperature=2.0, max_new_tokens=8, seed=3)
# One config for every learner here: the tests share its compiled programs.
CONFIG = LearnerConfig(
    optimizer=OptimizerConfig(learning_rate=3e-2, schedule="constant"),
    temperature=2.0,
    lora=LoRAConfig(rank=4, alpha=8.0),
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_hf_model_dir(tmp_path_factory.mktemp("lora_base"), "qwen2", seed=0, num_hidden_layers=1)


def _batch(groups, advantages):
    completions = [c for group in groups for c in group]
    return build(
        [c.prompt_ids for c in completions], [c.completion_ids for c in completions],
        [c.logprobs for c in completions], np.asarray(advantages, np.float64),
        [i for i, group in enumerate(groups) for _ in group], pad_id=0, length_buckets=(32,),
    )


def _sampled_batch(generator, seed: int):
    groups = generator.generate(PROMPTS, SamplingParams(temperature=2.0, max_new_tokens=8, seed=seed), n=2)
    return _batch(groups, [1.0, -1.0, -1.0, 1.0]), groups


def _base_weights(model) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Not(nnx.LoRAParam)))]


def test_an_update_moves_only_the_adapters_and_they_alone_carry_optimizer_state(model_dir):
    learner = Learner(hf_io.load(model_dir), CONFIG)
    generator = TorchGenerator(model_dir)
    adapters = jax.tree.leaves(learner.params)
    # seven projections, A and B each, in the one layer
    assert len(adapters) == 14 and all(leaf.dtype == np.float32 for leaf in adapters)
    assert {leaf.shape for leaf in jax.tree.leaves(learner.opt_state) if leaf.ndim} == {a.shape for a in adapters}
    base_before = _base_weights(learner.model)
    adapters_before = [np.asarray(a) for a in adapters]

    batch, _ = _sampled_batch(generator, seed=0)
    metrics = learner.update(batch)

    assert metrics["grad_norm"] > 0
    for got, expected in zip(_base_weights(learner.model), base_before, strict=True):
        np.testing.assert_array_equal(got, expected)
    # From B = 0 the loss has no gradient in A (it reaches A through B), so the first step moves every B alone,
    # the second every A too.
    changes = _changes(learner, adapters_before)
    assert min(changes["lora_b"]) > 1e-3 and max(changes["lora_a"]) == 0.0
    learner.update(_sampled_batch(generator, seed=5)[0])
    assert min(_changes(learner, adapters_before)["lora_a"]) > 1e-4
    for got, expected in zip(_base_weights(learner.model), base_before, strict=True):
        np.testing.assert_array_equal(got, expected)


def _changes(learner, adapters_before) -> dict[str, list[float]]:
    """The largest change of each adapter matrix since `adapters_before`, by kind (lora_a, lora_b)."""
    changes: dict[str, list[float]] = {}
    for (path, after), before in zip(nnx.to_flat_state(learner.params), adapters_before, strict=True):
        changes.setdefault(path[-1], []).append(float(np.abs(np.asarray(after[...]) - before).max()))
    return changes


def test_generators_receive_the_merged_weights_in_process_and_on_disk(model_dir, tmp_path):
    learner = Learner(hf_io.load(model_dir), CONFIG)
    generator = TorchGenerator(model_dir)
    batch, groups = _sampled_batch(generator, seed=1)
    learner.update(batch)
    stale = np.abs(np.asarray(learner.logprobs(batch)) - batch.sampler_logprobs)[batch.loss_mask].max()

    sync(learner.model, generator, version=1)
    fresh = _batch(generator.generate(PROMPTS, SAMPLING, n=2), [0.0] * 4)
    gap = np.abs(np.asarray(learner.logprobs(fresh)) - fresh.sampler_logprobs)[fresh.loss_mask].max()
    assert stale > 1e-2 and gap < 1e-4  # the generator samples from the adapted policy

    on_disk = read_checkpoint(save_checkpoint(learner.model, tmp_path / "policy-1", config_dir=model_dir))
    expected = hf_io.to_hf_tensors(learner.model)  # base + scale * B A (tests/models/test_lora.py)
    assert on_disk.keys() == expected.keys()
    for name, tensor in on_disk.items():
        np.testing.assert_array_equal(tensor.numpy(), np.asarray(expected[name]))


def test_a_checkpoint_of_the_adapters_resumes_to_the_uninterrupted_update(model_dir, tmp_path):
    generator = TorchGenerator(model_dir)
    batches = [_sampled_batch(generator, seed=seed)[0] for seed in (2, 3)]
    uninterrupted = Learner(hf_io.load(model_dir), CONFIG)
    for batch in batches:
        uninterrupted.update(batch)

    interrupted = Learner(hf_io.load(model_dir), CONFIG)
    interrupted.update(batches[0])
    checkpointer = Checkpointer(tmp_path, keep=1)
    checkpointer.save(1, interrupted, jax.random.key(0), {})
    checkpointer.close()
    saved = ocp.StandardCheckpointer().metadata(tmp_path / "1" / "state").item_metadata.tree["params"]
    saved_names = {path[-2].key for path, _ in jax.tree_util.tree_flatten_with_path(saved)[0]}
    # Other adapters' A: everything trained must come from the checkpoint.
    resumed = Learner(hf_io.load(model_dir), dataclasses.replace(CONFIG, lora=LoRAConfig(rank=4, alpha=8.0, seed=9)))
    Checkpointer(tmp_path).restore(resumed)
    resumed.update(batches[1])

    assert saved_names == {"lora_a", "lora_b"}  # the checkpoint holds the adapters, not the base
    for got, expected in zip(jax.tree.leaves((resumed.params, resumed.opt_state)),
                             jax.tree.leaves((uninterrupted.params, uninterrupted.opt_state)), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    merged_got, merged_expected = hf_io.to_hf_tensors(resumed.model), hf_io.to_hf_tensors(uninterrupted.model)
    for name in merged_expected:
        np.testing.assert_array_equal(np.asarray(merged_got[name]), np.asarray(merged_expected[name]))


def test_a_checkpoint_of_every_weight_refuses_a_lora_learner(model_dir, tmp_path):
    full = Learner(hf_io.load(model_dir), LearnerConfig())
    checkpointer = Checkpointer(tmp_path, keep=1)
    checkpointer.save(1, full, jax.random.key(0), {})
    checkpointer.close()
    with pytest.raises(ValueError, match=r"trained LoRA \{'rank': 0\}, this learner \{'rank': 4"):
        Checkpointer(tmp_path).restore(Learner(hf_io.load(model_dir), CONFIG))
