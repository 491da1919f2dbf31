"""The fused attention on MKL (`models.mkl_attention`): outputs and gradients against a float64 numpy formula and
autodiff of a jnp one, with grouped heads, a prefix, left padding, queries past one block, and refused inputs; a
model on it against the model on the einsum path, through a prefix cache; which attention "auto" takes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax import nnx

from models import ModelConfig, Transformer, mkl_attention, mkl_matmul, transformer
from tests import tiny_models
from tests.models.test_prefix_cache import PROMPT, grouped_rows, shared_prefix_hidden

REASON = mkl_matmul.unavailable_reason()
needs_kernel = pytest.mark.skipif(REASON is not None, reason=f"the MKL kernels cannot run here: {REASON}")

# (batch, queries, prefix keys, query heads, key/value heads, head size): one head, grouped heads, a prefix, and
# more queries than one block of the kernel (64) with a ragged last block.
SHAPES = [(1, 5, 0, 1, 1, 8), (2, 19, 0, 6, 2, 16), (3, 7, 11, 4, 2, 8), (2, 150, 0, 4, 1, 64), (1, 70, 30, 2, 2, 32)]


def _inputs(rng, batch, length, prefix, heads, kv_heads, head_dim):
    keys = prefix + length
    q = rng.standard_normal((batch, length, heads, head_dim), dtype=np.float32)
    k = rng.standard_normal((batch, keys, kv_heads, head_dim), dtype=np.float32)
    v = rng.standard_normal((batch, keys, kv_heads, head_dim), dtype=np.float32)
    # Left padding of a different width per row, in the prefix and in the queries' own keys.
    key_mask = np.ones((batch, keys), dtype=bool)
    for row in range(batch):
        key_mask[row, : min(prefix, 2 * row)] = False
        key_mask[row, prefix : prefix + min(length - 1, 3 * row)] = False
    return q, k, v, key_mask


def _numpy_attention(q, k, v, key_mask, scale):
    """The definition in float64: masked softmax over readable keys, zero for a query that reads none."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    length, keys = q.shape[1], k.shape[1]
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    scores = np.einsum("bthd,bshd->bhts", q, k) * scale
    readable = (np.arange(keys)[None, :] <= keys - length + np.arange(length)[:, None])[None, None]
    readable = readable & key_mask[:, None, None, :]
    scores = np.where(readable, scores, -np.inf)
    maximum = np.max(scores, axis=-1, keepdims=True)
    weights = np.where(readable, np.exp(scores - np.where(np.isfinite(maximum), maximum, 0)), 0)
    total = weights.sum(-1, keepdims=True)
    weights = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    return np.einsum("bhts,bshd->bthd", weights, v)


def _jnp_attention(q, k, v, key_mask, scale):
    """The same in jnp float32 at full precision, for autodiff."""
    length, keys = q.shape[1], k.shape[1]
    group = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    scores = jnp.einsum("bthd,bshd->bhts", q, k, precision="highest") * scale
    readable = (jnp.arange(keys)[None, :] <= keys - length + jnp.arange(length)[:, None])[None, None]
    readable = readable & key_mask[:, None, None, :]
    weights = jax.nn.softmax(jnp.where(readable, scores, -1e30), axis=-1)
    weights = jnp.where(readable.any(-1, keepdims=True), weights, 0.0)
    return jnp.einsum("bhts,bshd->bthd", weights, v, precision="highest")


@needs_kernel
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_attention_equals_the_masked_softmax_formula(shape):
    q, k, v, key_mask = _inputs(np.random.default_rng(0), *shape)
    scale = shape[-1] ** -0.5
    out = jax.jit(mkl_attention.attention, static_argnums=4)(q, k, v, key_mask, scale)
    np.testing.assert_allclose(out, _numpy_attention(q, k, v, key_mask, scale), rtol=0, atol=2e-5)


@needs_kernel
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_attention_gradients_equal_autodiff_of_the_formula(shape):
    rng = np.random.default_rng(1)
    q, k, v, key_mask = _inputs(rng, *shape)
    scale = shape[-1] ** -0.5
    probe = rng.standard_normal(q.shape, dtype=np.float32)

    def loss(attend):
        return lambda q, k, v: jnp.sum(attend(q, k, v, key_mask, scale) * probe)

    got = jax.jit(jax.grad(loss(mkl_attention.attention), argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(loss(_jnp_attention), argnums=(0, 1, 2))(q, k, v)
    for name, g, w in zip("qkv", got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-5 * np.abs(np.asarray(w)).max(), err_msg=name)


@needs_kernel
def test_a_query_that_reads_no_key_gets_zero_output_and_no_gradient():
    q, k, v, _ = _inputs(np.random.default_rng(2), 1, 6, 0, 2, 1, 8)
    key_mask = np.array([[False, False, True, True, True, True]])
    out, pullback = jax.vjp(lambda q, k, v: mkl_attention.attention(q, k, v, key_mask, 0.5), q, k, v)
    q_grad, k_grad, v_grad = pullback(jnp.ones_like(out))
    assert np.all(np.asarray(out)[0, :2] == 0) and np.all(np.isfinite(out))
    assert np.all(np.asarray(q_grad)[0, :2] == 0)
    assert np.all(np.asarray(k_grad)[0, :2] == 0) and np.all(np.asarray(v_grad)[0, :2] == 0)


def test_attention_refuses_inputs_it_cannot_take():
    q = np.zeros((1, 4, 4, 8), np.float32)
    kv = np.zeros((1, 4, 2, 8), np.float32)
    mask = np.ones((1, 4), bool)
    with pytest.raises(ValueError, match="float32 q, k, v and a bool key_mask"):
        mkl_attention.attention(q.astype(np.float16), kv, kv, mask, 1.0)
    with pytest.raises(ValueError, match="float32 q, k, v and a bool key_mask"):
        mkl_attention.attention(q, kv, kv, mask.astype(np.int32), 1.0)
    with pytest.raises(ValueError, match="dividing the query heads"):
        mkl_attention.attention(q, np.zeros((1, 4, 3, 8), np.float32), np.zeros((1, 4, 3, 8), np.float32), mask, 1.0)
    no_heads = np.zeros((1, 4, 0, 8), np.float32)
    with pytest.raises(ValueError, match="dividing the query heads"):
        mkl_attention.attention(q, no_heads, no_heads, mask, 1.0)
    with pytest.raises(ValueError, match="at least as many keys as queries"):
        mkl_attention.attention(q, kv[:, :3], kv[:, :3], mask[:, :3], 1.0)
    with pytest.raises(ValueError, match="key_mask must be"):
        mkl_attention.attention(q, kv, kv, mask[:, :3], 1.0)


@needs_kernel
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])  # q/k/v biases; q/k norms
def test_a_model_on_mkl_attention_gives_the_einsum_paths_values_and_gradients_through_a_prefix_cache(family):
    full, prefix = grouped_rows((9, 4, 6), (5, 2, 4, 1), group=3)
    real = jnp.asarray(full[2][:, PROMPT:])

    def value_and_grads(attention):
        config = ModelConfig.from_hf(tiny_models.tiny_config(family), attention_implementation=attention,
                                     matmul_implementation="xla")
        model = Transformer(config, rngs=nnx.Rngs(0))
        assert transformer.uses_mkl_attention(config) == (attention == "mkl")

        def loss(model):
            hidden = shared_prefix_hidden(model, full, prefix, group=3)
            return jnp.sum(jnp.where(real[..., None], jnp.tanh(hidden), 0.0))

        return nnx.value_and_grad(loss)(model)

    mkl_loss, mkl_grads = value_and_grads("mkl")
    einsum_loss, einsum_grads = value_and_grads("einsum")
    np.testing.assert_allclose(mkl_loss, einsum_loss, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(nnx.state(mkl_grads)), jax.tree.leaves(nnx.state(einsum_grads))):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(np.asarray(want)).max())


@pytest.mark.parametrize("attention, matmul, on_mkl", [
    ("auto", "mkl", True), ("auto", "xla", False), ("einsum", "mkl", False), ("cudnn", "mkl", False),
    ("mkl", "xla", True),
])
def test_auto_takes_the_mkl_attention_where_the_matmuls_are_on_mkl(monkeypatch, attention, matmul, on_mkl):
    monkeypatch.setattr(mkl_matmul, "unavailable_reason", lambda: None)
    config = ModelConfig.from_hf(tiny_models.tiny_config("llama"), attention_implementation=attention,
                                 matmul_implementation=matmul)
    assert transformer.uses_mkl_attention(config) is on_mkl


def test_mkl_attention_where_the_kernel_cannot_run_fails_with_the_reason(monkeypatch):
    monkeypatch.setattr(mkl_matmul, "unavailable_reason", lambda: "no C++ compiler")
    config = ModelConfig.from_hf(tiny_models.tiny_config("llama"), attention_implementation="mkl")
    with pytest.raises(RuntimeError, match="cannot run here: no C\\+\\+ compiler"):
        transformer.uses_mkl_attention(config)
    assert not transformer.uses_mkl_attention(config.replace(attention_implementation="auto"))
