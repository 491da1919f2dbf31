"""Sharding on 8 fake CPU devices: (fsdp=4, tp=2) placement by rule, and sharded == unsharded maths."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from models import hf_io, sharding
from models.logprobs import token_logprobs
from tests.models.conftest import padded_batch


@pytest.fixture(scope="module")
def mesh():
    if jax.device_count() < 8:
        pytest.fail("tests/conftest.py should give JAX 8 host devices (XLA_FLAGS)")
    return sharding.make_mesh(fsdp=4, tp=2)


def forward_and_logprobs(model, batch):
    tokens, positions, mask = batch

    @nnx.jit
    def run(model, tokens, positions, mask):
        hidden = model(tokens, positions, mask)
        return model.logits(hidden), token_logprobs(model, hidden, jnp.roll(tokens, -1, axis=1), chunk_size=4)

    return run(model, tokens, positions, mask)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_sharded_forward_and_logprobs_equal_unsharded(tiny_model_dir, mesh, family):
    model_dir = tiny_model_dir(family)
    host_batch = padded_batch((16, 11, 5, 2, 16, 9, 1, 7), 16, vocab_size=256)
    expected_logits, expected_logp = forward_and_logprobs(hf_io.load(model_dir), [jnp.asarray(x) for x in host_batch])

    model = hf_io.load(model_dir, mesh=mesh)
    batch = [jax.device_put(x, sharding.batch_sharding(mesh)) for x in host_batch]
    logits, logp = forward_and_logprobs(model, batch)
    mask = host_batch[2]
    assert np.abs(np.asarray(logits) - np.asarray(expected_logits))[mask].max() < 1e-4
    np.testing.assert_allclose(np.asarray(logp)[mask], np.asarray(expected_logp)[mask], atol=1e-4)


def test_load_with_mesh_places_each_parameter_by_its_rule(tiny_model_dir, mesh):
    model = hf_io.load(tiny_model_dir("qwen2"), mesh=mesh)
    q_kernel = model.layers[0].self_attn.q_proj.kernel[...]
    assert q_kernel.sharding.spec == PartitionSpec("fsdp", "tp")
    # Each device holds one (64 / 4) x (64 / 2) block, not the whole matrix.
    assert {shard.data.shape for shard in q_kernel.addressable_shards} == {(16, 32)}
    assert model.layers[1].mlp.down_proj.kernel[...].sharding.spec == PartitionSpec("tp", "fsdp")
    assert model.embed_tokens.embedding[...].sharding.spec == PartitionSpec("tp", "fsdp")
    assert model.lm_head.kernel[...].sharding.spec == PartitionSpec("fsdp", "tp")
    assert model.layers[0].self_attn.k_proj.bias[...].sharding.spec == PartitionSpec("tp")
    assert model.norm.weight[...].sharding.spec == PartitionSpec(None)
    unsharded = hf_io.load(tiny_model_dir("qwen2"))
    np.testing.assert_array_equal(np.asarray(q_kernel), np.asarray(unsharded.layers[0].self_attn.q_proj.kernel[...]))


def test_shard_model_moves_an_existing_model_onto_the_mesh(tiny_model_dir, mesh):
    model = hf_io.load(tiny_model_dir("qwen3"))
    before = {name: np.asarray(value) for name, value in hf_io.to_hf_tensors(model).items()}
    sharding.shard_model(model, mesh)
    up = model.layers[0].mlp.up_proj.kernel[...]
    assert up.sharding.spec == PartitionSpec("fsdp", "tp") and len(up.sharding.device_set) == 8
    assert model.layers[0].self_attn.q_norm.weight[...].sharding.spec == PartitionSpec(None)
    for name, value in hf_io.to_hf_tensors(model).items():
        np.testing.assert_array_equal(np.asarray(value), before[name])


def test_dimensions_that_do_not_divide_the_mesh_are_replicated(mesh):
    path = ("layers", 0, "self_attn", "q_proj", "kernel")
    assert sharding.partition_spec(path, (64, 96), mesh) == PartitionSpec("fsdp", "tp")
    assert sharding.partition_spec(path, (66, 96), mesh) == PartitionSpec(None, "tp")
    assert sharding.partition_spec(path, (64, 95), mesh) == PartitionSpec("fsdp", None)
    with pytest.raises(ValueError, match="rank"):
        sharding.partition_spec(path, (64,), mesh)


def test_make_mesh_checks_its_arguments():
    assert sharding.make_mesh().shape == {"fsdp": 1, "tp": 1}
    assert sharding.make_mesh(2, 2, devices=jax.devices()[4:]).devices.flatten().tolist() == jax.devices()[4:8]
    with pytest.raises(ValueError, match="needs 16 devices"):
        sharding.make_mesh(fsdp=8, tp=2)
    with pytest.raises(ValueError, match=">= 1"):
        sharding.make_mesh(fsdp=0)
