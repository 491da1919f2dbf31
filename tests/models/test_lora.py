"""LoRA adapters (`models.lora`) against PEFT's: the same forward pass, the same saved adapter, merged weights that
equal base + scale * B A, and bad configurations refused."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from models import hf_io
from models.lora import LoRAConfig, LoRALinear, apply_lora, merged, save_peft_adapter
from tests.models.conftest import padded_batch

peft = pytest.importorskip("peft")

FAMILIES = ("llama", "qwen2", "qwen3")
LENGTHS = (12, 7, 2)


def _randomise_b(model, seed: int) -> None:
    """B away from its zero start, at a scale where a wrong transpose or scale shows in the logits."""
    key = jax.random.key(seed)
    for _, module in nnx.iter_graph(model):
        if isinstance(module, LoRALinear):
            key, draw = jax.random.split(key)
            module.lora_b.set_value(0.05 * jax.random.normal(draw, module.lora_b.shape, jnp.float32))


def _flax_logits(model, tokens, positions, mask):
    return np.asarray(model.logits(model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))))


def _torch_logits(model, tokens, positions, mask):
    with torch.no_grad():
        return model(
            input_ids=torch.as_tensor(tokens, dtype=torch.long),
            attention_mask=torch.as_tensor(mask, dtype=torch.long),
            position_ids=torch.as_tensor(positions, dtype=torch.long),
        ).logits.numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_adapted_forward_equals_peft_with_the_saved_adapter(tiny_model_dir, tmp_path, family):
    model_dir = tiny_model_dir(family)
    tokens, positions, mask = padded_batch(LENGTHS, 12, vocab_size=256)
    config = LoRAConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "o_proj", "up_proj", "down_proj"))
    model = hf_io.load(model_dir)
    apply_lora(model, config, rngs=nnx.Rngs(3))
    _randomise_b(model, seed=4)
    ours = _flax_logits(model, tokens, positions, mask)
    adapter_dir = save_peft_adapter(model, tmp_path / "adapter", base_model=str(model_dir))

    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    base_logits = _torch_logits(base, tokens, positions, mask)
    theirs = _torch_logits(peft.PeftModel.from_pretrained(base, adapter_dir).eval(), tokens, positions, mask)

    saved = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert (saved["r"], saved["lora_alpha"], saved["target_modules"]) == (4, 8.0, list(config.targets))
    # The adapters move the logits by far more than the tolerance, so a lost adapter would fail.
    assert np.abs(theirs - base_logits)[mask].max() > 0.05
    # Within 1e-5 of the largest logit: these random models' logits reach 50, where float32's spacing is 3.8e-6,
    # and the base forward alone differs from transformers' by a few of those (1.5e-5 measured, qwen3).
    assert np.abs(ours - theirs)[mask].max() < 1e-5 * np.abs(theirs).max()


class _Holder(torch.nn.Module):
    def __init__(self, proj):
        super().__init__()
        self.proj = proj


def test_a_projection_equals_peft_lora_linear_within_1e_5():
    torch_base = torch.nn.Linear(48, 40, bias=True)
    peft_config = peft.LoraConfig(r=6, lora_alpha=3.0, target_modules=["proj"])
    wrapped = peft.get_peft_model(_Holder(torch_base), peft_config)
    lora_layer = wrapped.base_model.model.proj
    with torch.no_grad():
        lora_layer.lora_B["default"].weight.normal_(0.0, 0.1)
    flax_base = nnx.Linear(48, 40, rngs=nnx.Rngs(0))
    flax_base.kernel.set_value(jnp.asarray(torch_base.weight.detach().numpy().T))
    flax_base.bias.set_value(jnp.asarray(torch_base.bias.detach().numpy()))
    ours = LoRALinear(flax_base, rank=6, alpha=3.0, rngs=nnx.Rngs(1))
    ours.lora_a.set_value(jnp.asarray(lora_layer.lora_A["default"].weight.detach().numpy().T))
    ours.lora_b.set_value(jnp.asarray(lora_layer.lora_B["default"].weight.detach().numpy().T))

    x = np.random.default_rng(0).normal(size=(5, 48)).astype(np.float32)
    with torch.no_grad():
        theirs = lora_layer(torch.as_tensor(x)).numpy()
        plain = torch_base(torch.as_tensor(x)).numpy()
    got = np.asarray(ours(jnp.asarray(x)))
    assert np.abs(theirs - plain).max() > 0.05
    np.testing.assert_allclose(got, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_fresh_adapters_leave_the_logits_of_the_base_model(tiny_model_dir, family):
    tokens, positions, mask = padded_batch(LENGTHS, 12, vocab_size=256)
    base = hf_io.load(tiny_model_dir(family))
    expected = _flax_logits(base, tokens, positions, mask)
    apply_lora(base, LoRAConfig(rank=8), rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(_flax_logits(base, tokens, positions, mask), expected)


def test_initial_a_follows_peft_bound_and_b_is_zero():
    base = nnx.Linear(400, 64, rngs=nnx.Rngs(0))
    module = LoRALinear(base, rank=16, alpha=16.0, rngs=nnx.Rngs(0))
    a = np.asarray(module.lora_a[...])
    assert a.shape == (400, 16) and module.lora_b.shape == (16, 64)
    # uniform in +-1/sqrt(400) = +-0.05: its extremes come close to the bound, and its spread is bound / sqrt(3)
    assert 0.049 < np.abs(a).max() <= 0.05
    assert abs(a.std() - 0.05 / np.sqrt(3)) < 0.002
    assert not np.asarray(module.lora_b[...]).any()
    assert module.kernel is base.kernel  # the base's own variable, not a copy


def test_merged_hf_tensors_are_base_plus_scale_b_a(tiny_model_dir):
    model = hf_io.load(tiny_model_dir("qwen2"))
    base = {name: np.asarray(value) for name, value in hf_io.to_hf_tensors(model).items()}
    apply_lora(model, LoRAConfig(rank=4, alpha=12.0, targets=("k_proj", "gate_proj")), rngs=nnx.Rngs(0))
    _randomise_b(model, seed=1)
    got = {name: np.asarray(value) for name, value in hf_io.to_hf_tensors(model).items()}
    assert got.keys() == base.keys()
    for name in base:
        index = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        if name.endswith(("k_proj.weight", "gate_proj.weight")):
            parent = "self_attn" if "k_proj" in name else "mlp"
            module = getattr(getattr(model.layers[index], parent), name.split(".")[-2])
            b_a = np.asarray(module.lora_b[...]).T @ np.asarray(module.lora_a[...]).T  # HF's [out, in]
            np.testing.assert_allclose(got[name], base[name] + 3.0 * b_a, atol=1e-6, rtol=1e-6)
            assert np.abs(3.0 * b_a).max() > 1e-2
        else:
            np.testing.assert_array_equal(got[name], base[name])
    assert merged(hf_io.load(tiny_model_dir("qwen2"))).__class__.__name__ == "Transformer"


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(rank=-1), "rank must be an int >= 0"),
        (dict(rank=2.5), "rank must be an int >= 0"),
        (dict(rank=8, alpha=0.0), "alpha must be a number > 0"),
        (dict(rank=8, targets=("q_proj", "qkv_proj")), r"unknown projection\(s\) \['qkv_proj'\]"),
        (dict(rank=8, targets=()), "at least one"),
        (dict(rank=8, targets=("q_proj", "q_proj")), "each projection once"),
    ],
)
def test_bad_lora_config_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        LoRAConfig(**fields)


def test_a_rank_above_a_projection_side_is_refused(tiny_model_dir):
    model = hf_io.load(tiny_model_dir("llama"))
    with pytest.raises(ValueError, match=r"rank 80 exceeds layers.0.q_proj's smaller side \(64 x 64\)"):
        apply_lora(model, LoRAConfig(rank=80), rngs=nnx.Rngs(0))


def test_adapter_gradients_under_remat_equal_those_without(tiny_model_dir):
    """Per-layer remat runs each layer on its state as a plain input: with the adapters differentiated and the base
    frozen, a remat that wrote state back into the caller's variables failed (flax's TraceContextError)."""
    tokens, positions, mask = padded_batch(LENGTHS, 12, vocab_size=256)
    gradients = []
    for remat in (False, True):
        model = hf_io.load(tiny_model_dir("qwen3"), remat=remat)
        apply_lora(model, LoRAConfig(rank=2), rngs=nnx.Rngs(0))
        _randomise_b(model, seed=2)
        graphdef, adapters, frozen = nnx.split(model, nnx.LoRAParam, ...)

        def loss(adapters):
            adapted = nnx.merge(graphdef, adapters, frozen)
            return adapted.logits(adapted(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))).std()

        gradients.append(jax.tree.leaves(jax.jit(jax.grad(loss))(adapters)))
    assert max(float(jnp.abs(g).max()) for g in gradients[0]) > 1e-3
    for with_remat, without in zip(gradients[1], gradients[0], strict=True):
        np.testing.assert_allclose(np.asarray(with_remat), np.asarray(without), rtol=1e-5, atol=1e-7)
