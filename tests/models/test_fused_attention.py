"""`attention_implementation="cudnn"` routes attention through `jax.nn.dot_product_attention`; cuDNN needs an NVIDIA
GPU, so here the same call runs on JAX's XLA implementation and must give the einsum path's values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import transformer
from models.config import ModelConfig

CONFIG = ModelConfig(family="qwen2", vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=16, attention_bias=True)  # fmt: skip
# Row 0 is left-padded (two padding queries whose keys are all masked), row 1 is full.
TOKENS = jnp.array([[0, 0, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6]])
ATTENTION_MASK = jnp.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
POSITIONS = jnp.maximum(jnp.cumsum(ATTENTION_MASK, axis=1) - 1, 0)


def _loss_and_grads(config: ModelConfig):
    model = transformer.Transformer(config, rngs=nnx.Rngs(0))

    def loss(model):
        hidden = model(TOKENS, POSITIONS, ATTENTION_MASK)
        return jnp.sum(jnp.where(ATTENTION_MASK[..., None] == 1, hidden, 0.0) ** 2)

    return nnx.jit(nnx.value_and_grad(loss))(model)  # one compile, not one per operation


def test_the_fused_attention_path_matches_the_einsum_path_in_values_and_gradients(monkeypatch):
    expected_loss, expected_grads = _loss_and_grads(CONFIG)
    through_xla = transformer.fused_attention
    monkeypatch.setattr(transformer, "fused_attention",
                        lambda q, k, v, mask, implementation: through_xla(q, k, v, mask, implementation="xla"))  # fmt: skip

    loss, grads = _loss_and_grads(CONFIG.replace(attention_implementation="cudnn"))

    np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
    for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(expected_grads)):
        # The loss is a sum of squares near 640; float32 rounding of the two formulations (the einsum path divides by
        # the softmax sum after the value product) moves a gradient by up to about 1e-4 of its leaf's largest entry,
        # as much as the host's summation order decides (o_proj's kernel on an AMD EPYC: 1.07e-4).
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-4 * np.abs(want).max(),
                                   err_msg=jax.tree_util.keystr(path))


def test_the_fused_path_is_what_runs_when_asked_for(monkeypatch):
    calls = []
    monkeypatch.setattr(transformer, "fused_attention", lambda *args, **kwargs: calls.append(kwargs) or
                        jnp.zeros(args[0].shape, args[0].dtype))  # fmt: skip
    transformer.Transformer(CONFIG.replace(attention_implementation="cudnn"), rngs=nnx.Rngs(0))(
        TOKENS, POSITIONS, ATTENTION_MASK
    )
    assert calls == [{"implementation": "cudnn"}] * CONFIG.num_layers


def test_an_unknown_attention_implementation_is_refused():
    with pytest.raises(ValueError, match="attention_implementation must be one of"):
        CONFIG.replace(attention_implementation="flash")


class _Device:
    """What `uses_fused_attention` reads of `jax.devices()[0]`."""

    def __init__(self, platform: str, platform_version: str):
        self.platform = platform
        self.client = type("Client", (), {"platform_version": platform_version})()


@pytest.mark.parametrize(
    "device, dtype, head_dim, fused",
    [
        (_Device("gpu", "PJRT C API\ncuda 13000"), "bfloat16", 128, True),
        (_Device("gpu", "PJRT C API\ncuda 13000"), "float16", 64, True),
        (_Device("gpu", "PJRT C API\ncuda 13000"), "float32", 128, False),  # cuDNN's flash kernels are 16-bit only
        (_Device("gpu", "PJRT C API\ncuda 13000"), "bfloat16", 256, False),
        (_Device("gpu", "PJRT C API\nrocm 60302"), "bfloat16", 128, False),  # ROCm is "gpu" too, without cuDNN
        (_Device("cpu", "cpu"), "bfloat16", 128, False),
        (_Device("tpu", "PJRT C API\nTFRT TPU v5e"), "bfloat16", 128, False),
    ],
)
def test_auto_takes_cudnn_only_on_a_cuda_gpu_with_16_bit_matmuls_and_a_head_size_it_supports(
    monkeypatch, device, dtype, head_dim, fused
):
    monkeypatch.setattr(jax, "devices", lambda *args: [device])
    config = CONFIG.replace(dtype=dtype, head_dim=head_dim)
    assert transformer.uses_fused_attention(config) is fused
    assert transformer.uses_fused_attention(config.replace(attention_implementation="einsum")) is False
    assert transformer.uses_fused_attention(config.replace(attention_implementation="cudnn")) is True


def test_auto_on_this_machines_cpu_backend_keeps_the_einsum_path():
    assert CONFIG.attention_implementation == "auto"
    assert transformer.uses_fused_attention(CONFIG.replace(dtype="bfloat16")) is (jax.default_backend() == "gpu")
