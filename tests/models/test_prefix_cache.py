"""A prompt encoded once and continued from its cache gives what the full rows give, in value and in gradient."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import ModelConfig, Transformer
from models.logprobs import completion_predictors
from tests import tiny_models
from tests.models.conftest import padded_batch

PROMPT, COMPLETION, VOCAB = 9, 5, 256


def grouped_rows(prompt_lengths, completion_lengths, group):
    """Rows `[prompt | completion]`: each left-padded prompt repeated `group` times, completions right-padded.
    Returns the full rows and the one-prompt-per-group prefix, as (tokens, positions, attention_mask) each."""
    prompts = padded_batch(prompt_lengths, PROMPT, VOCAB, seed=1)
    rng = np.random.default_rng(2)
    rows = len(prompt_lengths) * group
    tokens = np.zeros((rows, PROMPT + COMPLETION), np.int32)
    mask = np.zeros_like(tokens, dtype=bool)
    for row in range(rows):
        tokens[row, :PROMPT] = prompts[0][row // group]
        mask[row, :PROMPT] = prompts[2][row // group]
        length = completion_lengths[row % len(completion_lengths)]
        tokens[row, PROMPT:PROMPT + length] = rng.integers(3, VOCAB, length)
        mask[row, PROMPT:PROMPT + length] = True
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    return (tokens, positions, mask), prompts


def shared_prefix_hidden(model, full, prefix, group):
    _, cache = model.encode_prefix(*(jnp.asarray(x) for x in prefix))
    completion = (jnp.asarray(x[:, PROMPT:]) for x in full)
    return model(*completion, prefix=cache.repeat_rows(group))


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])  # q/k/v biases, q/k norms, plain
def test_completions_continued_from_a_shared_prompt_cache_equal_the_full_rows(family):
    model = Transformer(ModelConfig.from_hf(tiny_models.tiny_config(family)), rngs=nnx.Rngs(0))
    full, prefix = grouped_rows((9, 4, 6), (5, 2, 4, 1), group=4)
    expected = model(*(jnp.asarray(x) for x in full))[:, PROMPT:]
    shared = shared_prefix_hidden(model, full, prefix, group=4)
    real = full[2][:, PROMPT:]
    assert shared.shape == expected.shape
    np.testing.assert_allclose(np.asarray(shared)[real], np.asarray(expected)[real], atol=2e-5)


def test_gradients_through_a_shared_prompt_cache_equal_the_full_rows_gradients():
    model = Transformer(ModelConfig.from_hf(tiny_models.tiny_config("qwen2")), rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    full, prefix = grouped_rows((9, 3), (5, 2, 4), group=3)
    width = model.config.hidden_size
    weights = jax.random.normal(jax.random.key(0), (6, COMPLETION, width)) * full[2][:, PROMPT:, None]

    def full_loss(params):
        return (nnx.merge(graphdef, params)(*(jnp.asarray(x) for x in full))[:, PROMPT:] * weights).sum()

    def shared_loss(params):
        return (shared_prefix_hidden(nnx.merge(graphdef, params), full, prefix, group=3) * weights).sum()

    # Compiled, not run op by op: eagerly, each of the backward pass's hundreds of operations is compiled on its own.
    expected, got = jax.jit(jax.grad(full_loss))(params), jax.jit(jax.grad(shared_loss))(params)
    # Every weight below the LM head (unused: the loss reads hidden states) gets a real gradient.
    for path, value in jax.tree_util.tree_leaves_with_path(expected):
        assert float(jnp.abs(value).max()) > 0 or "lm_head" in jax.tree_util.keystr(path)
    # The two paths sum in different orders, so an entry rounds in proportion to the terms it sums, which its leaf's
    # largest entry bounds (up to cancellation), not to its own size: 5.3e-7 of it measured on one AMD EPYC host
    # (1.6e-5 on a leaf reaching ~30), 5.4e-7 on a Xeon with AVX-512. The bound, 1e-5 of it, stays far below the
    # O(1) relative change of a row reading the wrong prefix.
    jax.tree.map(lambda e, g: np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-4,
                                                         atol=1e-5 * float(np.abs(e).max())),
                 expected, got)


def test_a_prefix_cache_with_the_wrong_number_of_rows_is_rejected():
    model = Transformer(ModelConfig.from_hf(tiny_models.tiny_config("llama")), rngs=nnx.Rngs(0))
    full, prefix = grouped_rows((9, 4), (5,), group=2)
    _, cache = model.encode_prefix(*(jnp.asarray(x) for x in prefix))
    with pytest.raises(ValueError, match="prefix has 2 rows"):
        model(*(jnp.asarray(x[:, PROMPT:]) for x in full), prefix=cache)


@pytest.mark.parametrize("prompt_block", [1, 2, 4])
def test_completion_predictors_are_the_states_one_column_before_each_completion_token(prompt_block):
    model = Transformer(ModelConfig.from_hf(tiny_models.tiny_config("qwen3")), rngs=nnx.Rngs(0))
    full, _ = grouped_rows((9, 4, 6), (5, 2, 4, 1), group=4)
    tokens, positions, mask = (jnp.asarray(x) for x in full)
    expected = model(tokens, positions, mask)[:, PROMPT - 1 : -1]
    got = completion_predictors(model, tokens, positions, mask, PROMPT, prompt_block)
    # Every column that predicts a real token: the prompt's last one and each real completion column but the last.
    predicts_real = full[2][:, PROMPT:]
    assert got.shape == expected.shape
    np.testing.assert_allclose(np.asarray(got)[predicts_real], np.asarray(expected)[predicts_real], atol=2e-5)


def test_completion_predictors_reject_a_missing_prompt_and_unaligned_blocks():
    model = Transformer(ModelConfig.from_hf(tiny_models.tiny_config("llama")), rngs=nnx.Rngs(0))
    full, _ = grouped_rows((9, 4, 6), (5,), group=2)
    inputs = [jnp.asarray(x) for x in full]
    with pytest.raises(ValueError, match="completion_start must be >= 1"):
        completion_predictors(model, *inputs, 0)
    with pytest.raises(ValueError, match="6 rows do not split into prompt blocks of 4"):
        completion_predictors(model, *inputs, PROMPT, 4)
