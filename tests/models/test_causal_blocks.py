"""Attention over rows of 64 tokens or more runs in causal query blocks (`models.transformer._causal_blocks`), each
reading keys only up to its own last column: the same values and gradients as one block over every key, and as
`transformers`, for left-padded rows and for rows continued from a prefix cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import ModelConfig, Transformer, hf_io, transformer
from tests import tiny_models
from tests.models.conftest import padded_batch
from tests.models.test_hf_parity import flax_logits, torch_logits

# 100 columns: 3 blocks of 33, 33 and 34 queries; rows of every length, from one fully padded first block to none.
LENGTHS, TOTAL = (100, 71, 40, 5), 100


@pytest.mark.parametrize("length, blocks", [(1, 1), (63, 1), (64, 2), (100, 3), (128, 4), (4096, 4)])
def test_rows_split_into_at_most_four_blocks_of_32_queries_or_more(length, blocks):
    assert transformer._causal_blocks(length) == blocks


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_blocked_attention_matches_transformers_on_long_left_padded_rows(tiny_model_dir, family):
    model_dir = tiny_model_dir(family)
    tokens, positions, mask = padded_batch(LENGTHS, TOTAL, vocab_size=256)
    expected = torch_logits(model_dir, tokens, positions, mask)
    actual = flax_logits(hf_io.load(model_dir), tokens, positions, mask)
    assert np.abs(actual - expected)[mask].max() < 1e-4
    assert np.isfinite(actual).all()


def _one_block(monkeypatch) -> None:
    monkeypatch.setattr(transformer, "_CAUSAL_BLOCKS", 1)


def test_blocks_give_the_values_and_gradients_of_one_block(monkeypatch):
    config = ModelConfig.from_hf(tiny_models.tiny_config("qwen2"))
    model = Transformer(config, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    tokens, positions, mask = (jnp.asarray(x) for x in padded_batch(LENGTHS, TOTAL, vocab_size=256))
    weights = jax.random.normal(jax.random.key(0), (len(LENGTHS), TOTAL, model.config.hidden_size)) * mask[..., None]

    def loss(params):
        hidden = nnx.merge(graphdef, params)(tokens, positions, mask)
        return jnp.sum(hidden * weights)

    # Compiled, not run op by op (each of the backward pass's operations compiled on its own); a new jit after the
    # patch traces the one-block path.
    blocked_loss, blocked_grads = jax.jit(jax.value_and_grad(loss))(params)
    _one_block(monkeypatch)
    expected_loss, expected_grads = jax.jit(jax.value_and_grad(loss))(params)

    np.testing.assert_allclose(blocked_loss, expected_loss, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(blocked_grads), jax.tree.leaves(expected_grads)):
        # Float32 summation order: both are within 4e-7 of each leaf's largest gradient from a float64 run.
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())


def test_blocks_after_a_prefix_cache_read_the_whole_prefix(monkeypatch):
    config = ModelConfig.from_hf(tiny_models.tiny_config("llama"))
    model = Transformer(config, rngs=nnx.Rngs(1))
    tokens, positions, mask = (jnp.asarray(x) for x in padded_batch((90, 30, 12), 80 + 70, vocab_size=256, seed=4))
    prompt, completion = slice(0, 80), slice(80, None)

    def continued():
        _, cache = model.encode_prefix(tokens[:, prompt], positions[:, prompt], mask[:, prompt])
        return model(tokens[:, completion], positions[:, completion], mask[:, completion], prefix=cache)

    blocked = continued()
    _one_block(monkeypatch)
    expected = continued()
    full_rows = model(tokens, positions, mask)[:, completion]
    real = np.asarray(mask[:, completion])
    np.testing.assert_allclose(np.asarray(blocked)[real], np.asarray(expected)[real], atol=2e-5)
    np.testing.assert_allclose(np.asarray(blocked)[real], np.asarray(full_rows)[real], atol=2e-5)
