"""`models.hf_io`: the name map, in-place assignment, sharded and bf16 checkpoints, and bad checkpoints."""

from __future__ import annotations

import json

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from models import ModelConfig, Transformer, hf_io
from tests import tiny_models
from tests.models.conftest import padded_batch


def logits(model, batch):
    tokens, positions, mask = (jnp.asarray(x) for x in batch)
    return np.asarray(model.logits(model(tokens, positions, mask)).astype(jnp.float32))


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_name_map_covers_exactly_the_transformers_state_dict(family):
    hf_config = tiny_models.tiny_config(family)
    torch_model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**hf_config))
    torch_shapes = {name: tuple(p.shape) for name, p in torch_model.named_parameters()}
    model = Transformer(ModelConfig.from_hf(hf_config), rngs=nnx.Rngs(0))
    flax_shapes = {name: tuple(value.shape) for name, value in hf_io.to_hf_tensors(model).items()}
    assert flax_shapes == torch_shapes


def test_tied_model_emits_no_lm_head_and_untied_does():
    tied = Transformer(
        ModelConfig.from_hf(tiny_models.tiny_config("llama", tie_word_embeddings=True)), rngs=nnx.Rngs(0)
    )
    untied = Transformer(ModelConfig.from_hf(tiny_models.tiny_config("llama", tie_word_embeddings=False)),
                         rngs=nnx.Rngs(0))
    assert "lm_head.weight" not in hf_io.to_hf_tensors(tied)
    assert hf_io.to_hf_tensors(untied)["lm_head.weight"].shape == (256, 64)


def test_from_hf_tensors_is_the_inverse_of_to_hf_tensors(tiny_model_dir):
    source = hf_io.load(tiny_model_dir("qwen2"))
    target = Transformer(source.config, rngs=nnx.Rngs(5))
    batch = padded_batch((8, 5), 8, vocab_size=256)
    assert np.abs(logits(source, batch) - logits(target, batch)).max() > 1e-2
    hf_io.from_hf_tensors(target, hf_io.to_hf_tensors(source))
    np.testing.assert_array_equal(logits(target, batch), logits(source, batch))


def test_from_hf_tensors_rejects_missing_unknown_and_misshapen_tensors(tiny_model_dir):
    model = hf_io.load(tiny_model_dir("qwen2"))
    tensors = dict(hf_io.to_hf_tensors(model))
    with pytest.raises(KeyError, match="missing.*model.norm.weight"):
        hf_io.from_hf_tensors(model, {k: v for k, v in tensors.items() if k != "model.norm.weight"})
    with pytest.raises(KeyError, match="unknown.*model.extra"):
        hf_io.from_hf_tensors(model, {**tensors, "model.extra": tensors["model.norm.weight"]})
    with pytest.raises(ValueError, match="q_proj.weight"):
        hf_io.from_hf_tensors(model, {**{k: v + 1.0 for k, v in tensors.items()},
                                      "model.layers.0.self_attn.q_proj.weight":
                                      tensors["model.layers.0.self_attn.q_proj.weight"][:, :32]})
    for name, value in hf_io.to_hf_tensors(model).items():  # the failed call changed nothing
        np.testing.assert_array_equal(np.asarray(value), np.asarray(tensors[name]))


def test_loads_a_sharded_checkpoint_through_its_index(tiny_model_dir, tmp_path):
    model_dir = tiny_model_dir("llama")
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    torch_model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(set(json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"].values())) > 1
    batch = padded_batch((8, 5), 8, vocab_size=256)
    np.testing.assert_array_equal(logits(hf_io.load(tmp_path), batch), logits(hf_io.load(model_dir), batch))


def test_bf16_checkpoint_loads_bit_exactly_and_casts_to_the_requested_dtypes(tiny_model_dir, tmp_path):
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir("qwen3"), dtype=torch.bfloat16)
    torch_model.save_pretrained(tmp_path)
    expected = torch_model.model.layers[1].mlp.up_proj.weight.detach().float().numpy()

    as_bf16 = hf_io.load(tmp_path, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    kernel = as_bf16.layers[1].mlp.up_proj.kernel[...]
    assert kernel.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(kernel.astype(jnp.float32)).T, expected)

    as_fp32 = hf_io.load(tmp_path)
    assert as_fp32.layers[1].mlp.up_proj.kernel[...].dtype == jnp.float32
    batch = padded_batch((8, 5), 8, vocab_size=256)
    full, half = logits(as_fp32, batch), logits(as_bf16, batch)
    mask = batch[2]
    assert np.abs(full - half)[mask].max() < 0.05 * np.abs(full).max()  # bf16 compute stays close


def test_saved_bf16_model_keeps_bf16_on_disk(tiny_model_dir, tmp_path):
    model = hf_io.load(tiny_model_dir("qwen2"), param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)
    hf_io.save(model, tmp_path)
    from safetensors import safe_open

    with safe_open(tmp_path / "model.safetensors", framework="pt") as handle:
        assert {handle.get_slice(name).get_dtype() for name in handle.keys()} == {"BF16"}
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert reloaded.model.embed_tokens.weight.dtype == torch.bfloat16
    np.testing.assert_array_equal(
        reloaded.model.embed_tokens.weight.detach().view(torch.int16).numpy().view(ml_dtypes.bfloat16),
        np.asarray(model.embed_tokens.embedding[...]),
    )


def test_load_reports_a_missing_tensor_and_a_missing_checkpoint(tiny_model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        hf_io.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(tiny_models.tiny_config("qwen2")))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        hf_io.load(tmp_path)
    llama_dir = tiny_model_dir("llama")  # tied: has no lm_head.weight, which an untied qwen2 config needs
    (tmp_path / "model.safetensors").write_bytes((llama_dir / "model.safetensors").read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(tiny_models.tiny_config("llama", tie_word_embeddings=False)))
    with pytest.raises(KeyError, match="lm_head.weight"):
        hf_io.load(tmp_path)
