"""Causal grouped-query attention in one custom call per layer and direction, on MKL (`csrc/mkl_attention.cc`).

The model's attention on the MKL path otherwise runs as a dozen small batched GEMMs per layer with XLA's softmax
fusions and transposes between them; on an Intel host those small products ran at a fraction of their isolated speed
inside the learner's step (docs/log/2026-11-27-learner-engines-in-their-own-processes.md). Here each (row, head)
item computes a block of queries' scores, softmax and value product while they are in cache, and the backward pass
recomputes the weights from the saved log-sum-exp, as flash attention does. Registered with the matmul kernel
(`models.mkl_matmul`), so `mkl_matmul.unavailable_reason()` covers both.

`attention(q, k, v, key_mask, scale)`: q `[B, T, H, D]`, k and v `[B, S, KV, D]` with S >= T (the first S - T keys
are a prefix every query reads), key_mask `[B, S]` bool (real tokens); query t reads key s iff s <= S - T + t and
key s is real. A query that reads no key (left padding) gets a zero output and no gradient.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from models import mkl_matmul


def _check(q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array) -> None:
    if any(x.dtype != jnp.float32 for x in (q, k, v)) or key_mask.dtype != jnp.bool_:
        raise ValueError(f"attention takes float32 q, k, v and a bool key_mask, got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}, {key_mask.dtype}")
    if q.ndim != 4 or k.shape != v.shape or k.ndim != 4:
        raise ValueError(f"q must be [B, T, H, D] and k, v the same [B, S, KV, D], got {q.shape}, {k.shape}, {v.shape}")
    batch, length, heads, head_dim = q.shape
    if k.shape[0] != batch or k.shape[3] != head_dim or not k.shape[2] or heads % k.shape[2] or k.shape[1] < length:
        raise ValueError(f"k, v {k.shape} do not fit q {q.shape}: same batch and head size, a number of key/value "
                         "heads dividing the query heads, at least as many keys as queries")
    if key_mask.shape != k.shape[:2]:
        raise ValueError(f"key_mask must be [B, S] = {k.shape[:2]}, got {key_mask.shape}")


def _forward_call(q, k, v, key_mask, scale):
    batch, length, heads, _ = q.shape
    results = (jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct((batch, heads, length), jnp.float32))
    return jax.ffi.ffi_call(mkl_matmul.ATTENTION_FORWARD_TARGET, results)(q, k, v, key_mask, scale=np.float32(scale))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def attention(q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array, scale: float) -> jax.Array:
    """softmax(scale q k^T, causal and key-masked) v per query head, `[B, T, H, D]`. Call
    `mkl_matmul.unavailable_reason()` or `resolve` first: this assumes the kernels are registered."""
    _check(q, k, v, key_mask)
    return _forward_call(q, k, v, key_mask, scale)[0]


def _attention_forward(q, k, v, key_mask, scale):
    _check(q, k, v, key_mask)
    out, log_sum_exp = _forward_call(q, k, v, key_mask, scale)
    return out, (q, k, v, key_mask, out, log_sum_exp)


def _attention_backward(scale, residuals, out_grad):
    q, k, v, key_mask, out, log_sum_exp = residuals
    results = (jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct(k.shape, jnp.float32),
               jax.ShapeDtypeStruct(v.shape, jnp.float32))
    q_grad, k_grad, v_grad = jax.ffi.ffi_call(mkl_matmul.ATTENTION_BACKWARD_TARGET, results)(
        q, k, v, key_mask, out, log_sum_exp, out_grad, scale=np.float32(scale)
    )
    return q_grad, k_grad, v_grad, None


attention.defvjp(_attention_forward, _attention_backward)
