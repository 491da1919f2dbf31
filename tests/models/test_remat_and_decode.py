"""Per-layer remat changes memory, not maths; greedy decoding matches `transformers.generate`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from models import ModelConfig, Transformer, hf_io
from models.decode import greedy_decode
from models.logprobs import token_logprobs
from tests import tiny_models
from tests.models.conftest import padded_batch


def test_remat_gives_the_same_gradients_as_no_remat():
    tokens, positions, mask = (jnp.asarray(x) for x in padded_batch((12, 7, 4), 12, 256))
    targets = jnp.roll(tokens, -1, axis=1)

    def loss(model):
        return -jnp.sum(token_logprobs(model, model(tokens, positions, mask), targets) * mask)

    grads, checkpoints = {}, {}
    for remat in (False, True):
        config = ModelConfig.from_hf(tiny_models.tiny_config("qwen3"), remat=remat)
        model = Transformer(config, rngs=nnx.Rngs(3))
        checkpoints[remat] = str(jax.make_jaxpr(nnx.grad(loss))(model)).count("remat2[")
        grads[remat] = jax.tree.leaves(nnx.jit(nnx.grad(loss))(model))  # one compile, not one per operation
    assert checkpoints[True] > checkpoints[False]  # the layers really are rematerialised
    assert max(float(jnp.abs(g).max()) for g in grads[False]) > 1e-3
    for with_remat, without in zip(grads[True], grads[False]):
        np.testing.assert_allclose(np.asarray(with_remat), np.asarray(without), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_greedy_decode_matches_transformers_generate(tiny_model_dir, family):
    # Untied: a random tied head mostly predicts the current token again, a weak test of decoding.
    model_dir = tiny_model_dir(family, tie_word_embeddings=False)
    prompt = [5, 17, 99, 42, 7, 200]
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = torch_model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                        eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert len(set(expected)) > 1  # not a degenerate repeat of one token
    assert greedy_decode(hf_io.load(model_dir), prompt, max_new_tokens=12) == expected


def test_greedy_decode_stops_after_the_first_eos(tiny_model_dir):
    model = hf_io.load(tiny_model_dir("llama", tie_word_embeddings=False))
    prompt = [5, 17, 99, 42]
    free_run = greedy_decode(model, prompt, max_new_tokens=8)
    stop_token = free_run[3]
    stopped = greedy_decode(model, prompt, max_new_tokens=8, eos_token_ids=[stop_token])
    assert stopped == free_run[: free_run.index(stop_token) + 1]


def test_greedy_decode_rejects_empty_prompt_and_zero_budget(tiny_model_dir):
    model = hf_io.load(tiny_model_dir("llama"))
    with pytest.raises(ValueError, match="prompt_ids"):
        greedy_decode(model, [], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_decode(model, [1, 2], max_new_tokens=0)


def test_model_rejects_mismatched_input_shapes():
    model = Transformer(ModelConfig.from_hf(tiny_models.tiny_config("llama")), rngs=nnx.Rngs(0))
    tokens = jnp.zeros((2, 5), jnp.int32)
    with pytest.raises(ValueError, match="same \\[batch, time\\] shape"):
        model(tokens, jnp.zeros((2, 4), jnp.int32), jnp.ones((2, 5), bool))
    with pytest.raises(ValueError, match="tokens must be"):
        model(tokens[0], tokens[0], jnp.ones((5,), bool))
