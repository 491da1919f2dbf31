"""The NNX Transformer reproduces `transformers` for every family, and checkpoints round-trip through HF."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from models import ModelConfig, Transformer, hf_io
from tests import tiny_models
from tests.models.conftest import padded_batch

FAMILIES = ("llama", "qwen2", "qwen3")
LENGTHS = (16, 9, 3, 1)


def torch_logits(model_dir, tokens, positions, mask, dtype=torch.float32):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    with torch.no_grad():
        return model(
            input_ids=torch.as_tensor(tokens, dtype=torch.long),
            attention_mask=torch.as_tensor(mask, dtype=torch.long),
            position_ids=torch.as_tensor(positions, dtype=torch.long),
        ).logits.float().numpy()


def flax_logits(model, tokens, positions, mask):
    hidden = model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))
    return np.asarray(model.logits(hidden).astype(jnp.float32))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tie", [True, False])
def test_fp32_logits_match_transformers_on_padded_mixed_length_batch(tiny_model_dir, family, tie):
    model_dir = tiny_model_dir(family, tie_word_embeddings=tie)
    tokens, positions, mask = padded_batch(LENGTHS, 16, vocab_size=256)
    expected = torch_logits(model_dir, tokens, positions, mask)
    actual = flax_logits(hf_io.load(model_dir), tokens, positions, mask)
    assert np.abs(expected).max() > 1.0  # the random checkpoint gives logits of real magnitude
    assert np.abs(actual - expected)[mask].max() < 1e-4
    assert np.isfinite(actual).all()  # padding rows attend to nothing and must still not be NaN


def test_left_padded_rows_equal_the_unpadded_sequences(tiny_model_dir):
    model = hf_io.load(tiny_model_dir("qwen2"))
    tokens, positions, mask = padded_batch(LENGTHS, 16, vocab_size=256)
    batched = flax_logits(model, tokens, positions, mask)
    for row, length in enumerate(LENGTHS):
        alone = flax_logits(model, tokens[row:row + 1, -length:], positions[row:row + 1, -length:],
                            mask[row:row + 1, -length:])
        np.testing.assert_allclose(batched[row, -length:], alone[0], atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_flax_initialised_model_saved_to_hf_gives_the_same_logits_in_transformers(tmp_path, family):
    config = ModelConfig.from_hf(tiny_models.tiny_config(family))
    model = Transformer(config, rngs=nnx.Rngs(7))
    # Redraw at a scale where every tensor matters: norms away from 1, matrices well above N(0, 0.02).
    rng = np.random.default_rng(1)
    tensors = {}
    for name, value in hf_io.to_hf_tensors(model).items():
        value = np.asarray(value)
        tensors[name] = value + rng.normal(scale=0.2, size=value.shape) if value.ndim == 1 else value * 20.0
    hf_io.from_hf_tensors(model, tensors)
    out_dir = hf_io.save(model, tmp_path / "saved")

    tokens, positions, mask = padded_batch(LENGTHS, 16, vocab_size=256, seed=3)
    expected = flax_logits(model, tokens, positions, mask)
    actual = torch_logits(out_dir, tokens, positions, mask)
    assert np.abs(expected).max() > 1.0
    assert np.abs(actual - expected)[mask].max() < 1e-4
