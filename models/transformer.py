"""A Llama / Qwen2 / Qwen3 decoder in Flax NNX that reproduces Hugging Face's forward pass.

Attribute names mirror the HF module tree (`embed_tokens`, `layers[i].self_attn.q_proj`, ...) so the name map in
`models.hf_io` is a short table. Kernels are stored `[in, out]` (the JAX convention; HF stores `[out, in]`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from models.config import ModelConfig

# HF initialises every matrix with N(0, initializer_range=0.02); random models here start from the same scale.
_WEIGHT_INIT = nnx.initializers.normal(stddev=0.02)


def _linear_options(config: ModelConfig) -> dict:
    """What every projection's `nnx.Linear` shares: dtypes and initialiser."""
    return dict(dtype=config.dtype, param_dtype=config.param_dtype, kernel_init=_WEIGHT_INIT)


class RMSNorm(nnx.Module):
    """HF's RMSNorm: normalise in float32, cast back to the input dtype, then scale."""

    def __init__(self, dim: int, *, eps: float, dtype: jnp.dtype, param_dtype: jnp.dtype):
        self.weight = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(self.dtype) * normed.astype(self.dtype)


def rope_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos and sin `[B, T, head_dim]` for HF's rotate-half RoPE (frequencies repeated over both halves)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    # Read back through an identity gather over the columns. XLA counts cos and sin as cheap and fuses them into each
    # consumer, so every layer's RoPE pass would evaluate them again for every head; a gather it does not copy into
    # its consumers, so the tables are computed once per call and the layers read them.
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    columns = jnp.arange(positions.shape[-1])
    return cos[..., columns, :], sin[..., columns, :]


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates `x [B, T, heads, head_dim]` in float32: x * cos + rotate_half(x) * sin."""
    x32 = x.astype(jnp.float32)
    first, second = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-second, first], axis=-1)
    return (x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]).astype(x.dtype)


def attention_mask_4d(attention_mask: jax.Array) -> jax.Array:
    """`[B, 1, 1, T, S]` bool: query t may read key s iff s <= t and key s is a real token.

    Causality is by array index, not by position id, so left padding changes nothing for the real tokens.
    """
    length = attention_mask.shape[1]
    causal = jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))
    return causal[None, None, None, :, :] & attention_mask[:, None, None, None, :]


def fused_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, implementation: str) -> jax.Array:
    """`jax.nn.dot_product_attention` over `q [B, T, heads, D]`, `k`, `v [B, T, kv_heads, D]` and the `[B, 1, 1, T, T]`
    mask of `attention_mask_4d`; returns `[B, T, heads, D]`.

    The mask already holds causality; `is_causal` also tells a fused kernel, which then skips the blocks above the
    diagonal instead of reading a bias there. Fully masked rows (left-padding queries) get the kernel's large finite
    fill, so they stay finite, as in the einsum path; their outputs are never read by a real token.
    """
    return jax.nn.dot_product_attention(q, k, v, mask=mask[:, 0], is_causal=True, implementation=implementation)


def uses_fused_attention(config: ModelConfig) -> bool:
    """Whether calls without a prefix cache take `fused_attention` on cuDNN (see `ModelConfig`)."""
    if config.attention_implementation != "auto":
        return config.attention_implementation == "cudnn"
    # cuDNN's flash attention takes fp16/bf16 operands and head sizes that are multiples of 8, up to 128 on every
    # cuDNN 9 release; "gpu" is also ROCm's backend name, hence the platform check.
    device = jax.devices()[0]
    return (
        device.platform == "gpu"
        and "cuda" in device.client.platform_version.lower()
        and jnp.dtype(config.dtype).itemsize == 2
        and config.head_dim % 8 == 0
        and config.head_dim <= 128
    )


# Attention's two products per [batch, kv-head] entry: queries against keys, then weights against values.
_SCORES, _VALUES = "bkqd,bksd->bkqs", "bkqs,bksd->bkqd"

# Query blocks of causal attention, and the fewest queries a block may hold (below that, one block's saving is less
# than the cost of another set of ops).
_CAUSAL_BLOCKS, _MIN_QUERIES_PER_BLOCK = 4, 32


def _causal_blocks(length: int) -> int:
    return max(1, min(_CAUSAL_BLOCKS, length // _MIN_QUERIES_PER_BLOCK))


class PrefixCache(NamedTuple):
    """Keys and values (RoPE applied) of a prefix, per layer `[B, S, kv_heads, head_dim]`, and its real tokens
    `[B, S]`. A later call attends to it as to earlier columns of the same rows, and gradients flow back into it."""

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    attention_mask: jax.Array

    def repeat_rows(self, times: int) -> "PrefixCache":
        """Each row `times` times in a row: one prompt's cache for each of its group's completions."""
        return jax.tree.map(lambda array: jnp.repeat(array, times, axis=0), self)


class Attention(nnx.Module):
    """Grouped-query causal self-attention with optional q/k/v biases (Qwen2) and q/k RMSNorm (Qwen3)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        dims = dict(**_linear_options(config), rngs=rngs)
        q_width = config.num_heads * config.head_dim
        kv_width = config.num_kv_heads * config.head_dim
        self.q_proj = nnx.Linear(config.hidden_size, q_width, use_bias=config.attention_bias, **dims)
        self.k_proj = nnx.Linear(config.hidden_size, kv_width, use_bias=config.attention_bias, **dims)
        self.v_proj = nnx.Linear(config.hidden_size, kv_width, use_bias=config.attention_bias, **dims)
        self.o_proj = nnx.Linear(q_width, config.hidden_size, use_bias=False, **dims)
        if config.qk_norm:
            norm = dict(eps=config.rms_norm_eps, dtype=config.dtype, param_dtype=config.param_dtype)
            self.q_norm = RMSNorm(config.head_dim, **norm)
            self.k_norm = RMSNorm(config.head_dim, **norm)

    def __call__(
        self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array, prefix: tuple[jax.Array, jax.Array] | None
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """`x` is `[B * T, hidden]` (tokens flattened, see `Transformer.__call__`); `cos`, `sin` are `[B, T, D]`;
        `prefix` is (keys, values) `[B, S, kv_heads, D]` read before this call's own keys (`mask` covers both).
        Returns the output and this call's own keys and values."""
        config = self.config
        batch, length = cos.shape[:2]
        q = self.q_proj(x).reshape(batch, length, config.num_heads, config.head_dim)
        k = self.k_proj(x).reshape(batch, length, config.num_kv_heads, config.head_dim)
        v = self.v_proj(x).reshape(batch, length, config.num_kv_heads, config.head_dim)
        if config.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        own_kv = (k, v)
        if prefix is not None:
            k, v = jnp.concatenate([prefix[0], k], axis=1), jnp.concatenate([prefix[1], v], axis=1)

        if prefix is None and uses_fused_attention(config):
            out = fused_attention(q, k, v, mask, implementation="cudnn")
        else:
            out = self._attend_in_causal_blocks(q, k, v, mask)
        return self.o_proj(out.reshape(batch * length, config.num_heads * config.head_dim)), own_kv

    def _attend_in_causal_blocks(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
        """Attention as XLA ops: `q [B, T, heads, D]` against `k`, `v [B, S, kv_heads, D]` (a prefix, then the
        queries' own columns) under `mask [B, 1, 1, T, S]`; returns `[B, T, heads * D]`.

        Causal blocks: the queries in [start, end) read no key after the prefix and their own columns up to end, so
        each block's scores stop there and the blocks above the diagonal are never computed (with 4 blocks, 3/8 of
        the scores, softmax and value products, forward and backward). Each block is sliced before its transposes,
        which then copy contiguous rows.
        """
        length = q.shape[1]
        prefix_length = k.shape[1] - length
        bounds = [length * i // _causal_blocks(length) for i in range(_causal_blocks(length) + 1)]
        # The queries are split, not sliced, so that their gradient is one concatenation rather than a sum of
        # zero-padded blocks.
        return jnp.concatenate(
            [
                self._attend(queries, k[:, : prefix_length + end], v[:, : prefix_length + end],
                             mask[..., start:end, : prefix_length + end])  # fmt: skip
                for queries, start, end in zip(jnp.split(q, bounds[1:-1], axis=1), bounds[:-1], bounds[1:])
            ],
            axis=1,
        )

    def _attend(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
        """`q [B, T, heads, D]` against `k`, `v [B, S, kv_heads, D]` under `mask [B, 1, 1, T, S]`; returns
        `[B, T, heads * D]`."""
        config = self.config
        batch, length = q.shape[:2]
        # Query heads are grouped under the key/value head they share, and each key/value head's G x T queries form
        # the rows of one [B, K] batch of matmuls: q [B, K, G * T, D] against k [B, K, S, D]. Written as one einsum
        # over [B, T, K, G, D], XLA:CPU produced the scores in [K, S, G * T] order and transposed them inside the
        # elementwise passes that followed.
        q = q.reshape(batch, length, config.num_kv_heads, config.num_query_groups, config.head_dim)
        q = q.transpose(0, 2, 3, 1, 4).reshape(batch, config.num_kv_heads, -1, config.head_dim)
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        scores = jnp.einsum(_SCORES, q, k, preferred_element_type=jnp.float32)
        scores = scores.reshape(batch, config.num_kv_heads, config.num_query_groups, length, -1) * config.head_dim**-0.5
        # A finite fill keeps fully masked rows (left-padding queries) finite: they average the keys of their block,
        # never NaN; no real token reads them.
        scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
        # Softmax normalised after the value product, as flash attention does: the division runs over [T, D] rather
        # than over the wider [T, S] weights. Subtracting the row maximum only keeps exp finite; it cancels in the
        # ratio, so it carries no gradient.
        weights = jnp.exp(scores - jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True)))
        weights_per_head = weights.astype(config.dtype).reshape(batch, config.num_kv_heads, -1, weights.shape[-1])
        out = jnp.einsum(_VALUES, weights_per_head, v)
        out = out.reshape(batch, config.num_kv_heads, config.num_query_groups, length, config.head_dim)
        out = (out / jnp.sum(weights, axis=-1, keepdims=True)).astype(config.dtype)
        return out.transpose(0, 3, 1, 2, 4).reshape(batch, length, config.num_heads * config.head_dim)


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        dims = dict(use_bias=False, **_linear_options(config), rngs=rngs)
        self.gate_proj = nnx.Linear(config.hidden_size, config.intermediate_size, **dims)
        self.up_proj = nnx.Linear(config.hidden_size, config.intermediate_size, **dims)
        self.down_proj = nnx.Linear(config.intermediate_size, config.hidden_size, **dims)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        norm = dict(eps=config.rms_norm_eps, dtype=config.dtype, param_dtype=config.param_dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, **norm)
        self.self_attn = Attention(config, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, **norm)
        self.mlp = MLP(config, rngs=rngs)

    def __call__(self, x, cos, sin, mask, prefix):
        attended, own_kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, prefix)
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x)), own_kv


def _run_layer(layer: DecoderLayer, x, cos, sin, mask, prefix):
    return layer(x, cos, sin, mask, prefix)


def _run_layer_remat(layer: DecoderLayer, x, cos, sin, mask, prefix):
    """`_run_layer` under `jax.checkpoint`, on the layer's state as a plain input. `nnx.remat` writes the state back
    into the caller's variables afterwards, which fails when some of them are traced by a `jax.grad` and others not
    (LoRA: the adapters differentiated, the base weights frozen); a layer's forward pass changes no state."""
    graphdef, state = nnx.split(layer)

    def run(state, x, cos, sin, mask, prefix):
        return _run_layer(nnx.merge(graphdef, state), x, cos, sin, mask, prefix)

    return jax.checkpoint(run)(state, x, cos, sin, mask, prefix)


class Transformer(nnx.Module):
    """Decoder-only language model.

    `model(tokens, positions, attention_mask)` returns the final-norm hidden states `[B, T, hidden]`;
    `model.logits(hidden)` applies the (tied or separate) LM head. Positions are explicit so a left-padded row
    gives the same values at its real tokens as the unpadded sequence.

    `model.encode_prefix(...)` also returns the keys and values of every layer, and `model(..., prefix=cache)` runs
    the following columns against them: a GRPO group's completions share one pass over their prompt, with the same
    values (and, under autodiff, gradients) as full rows.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed_tokens = nnx.Embed(
            config.vocab_size, config.hidden_size, dtype=config.dtype, param_dtype=config.param_dtype,
            embedding_init=_WEIGHT_INIT, rngs=rngs,
        )
        self.layers = nnx.List([DecoderLayer(config, rngs=rngs) for _ in range(config.num_layers)])
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, dtype=config.dtype,
                            param_dtype=config.param_dtype)
        if not config.tie_word_embeddings:
            self.lm_head = nnx.Linear(
                config.hidden_size, config.vocab_size, use_bias=False, **_linear_options(config), rngs=rngs
            )

    def __call__(
        self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array, prefix: PrefixCache | None = None
    ) -> jax.Array:
        return self._run(tokens, positions, attention_mask, prefix)[0]

    def encode_prefix(
        self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array
    ) -> tuple[jax.Array, PrefixCache]:
        """Hidden states `[B, T, hidden]` and the cache a later call continues these rows from."""
        hidden, keys, values = self._run(tokens, positions, attention_mask, None)
        return hidden, PrefixCache(keys, values, attention_mask.astype(jnp.bool_))

    def _run(self, tokens, positions, attention_mask, prefix: PrefixCache | None):
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [batch, time], got shape {tokens.shape}")
        if positions.shape != tokens.shape or attention_mask.shape != tokens.shape:
            raise ValueError(
                f"tokens {tokens.shape}, positions {positions.shape} and attention_mask {attention_mask.shape} "
                "must have the same [batch, time] shape"
            )
        config = self.config
        batch, length = tokens.shape
        # The layers see tokens flattened to [B * T, hidden], so every projection is a 2-D matmul. Autodiff of a
        # [B, T, in] x [in, out] product contracts the weight gradient over two leading axes, which XLA:CPU lays out
        # through a transposed copy of the fused cotangent; the 2-D form runs as one plain GEMM
        # (docs/decisions/029-learner-layers-on-flattened-tokens.md).
        x = self.embed_tokens(tokens).reshape(batch * length, config.hidden_size)
        cos, sin = rope_tables(positions, config.head_dim, config.rope_theta)
        mask = attention_mask_4d(attention_mask.astype(jnp.bool_))
        if prefix is not None:
            if prefix.attention_mask.shape[0] != batch:
                raise ValueError(f"prefix has {prefix.attention_mask.shape[0]} rows, tokens {batch}")
            # Every prefix column precedes every column here: readable wherever it is a real token.
            prefix_mask = jnp.broadcast_to(
                prefix.attention_mask[:, None, None, None, :], (batch, 1, 1, length, prefix.attention_mask.shape[1])
            )
            mask = jnp.concatenate([prefix_mask, mask], axis=-1)
        run_layer = _run_layer_remat if config.remat else _run_layer
        keys, values = [], []
        for index, layer in enumerate(self.layers):
            layer_prefix = None if prefix is None else (prefix.keys[index], prefix.values[index])
            x, (k, v) = run_layer(layer, x, cos, sin, mask, layer_prefix)
            keys.append(k)
            values.append(v)
        return self.norm(x).reshape(batch, length, config.hidden_size), tuple(keys), tuple(values)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """`[..., vocab]` logits in the compute dtype."""
        if not self.config.tie_word_embeddings:
            return self.lm_head(hidden)
        return self.embed_tokens.attend(hidden)

    def token_logits(self, hidden: jax.Array, token_ids: jax.Array) -> jax.Array:
        """The logit of `token_ids[n]` alone for each row of `hidden [N, hidden]`, `[N]`: from that token's row of
        the output weights, so its gradient is `[N, hidden]`-sized rather than a scatter into `[vocab, N]`."""
        dtype = self.config.dtype
        if self.config.tie_word_embeddings:
            rows, spec = self.embed_tokens(token_ids), "nd,nd->n"
        else:
            rows, spec = jnp.take(self.lm_head.kernel[...], token_ids, axis=1), "dn,nd->n"
        return jnp.einsum(spec, rows.astype(dtype), hidden.astype(dtype))

    def vocab_major_logits(self, hidden: jax.Array) -> jax.Array:
        """The same logits for `hidden [N, hidden]`, laid out `[vocab, N]`.

        For reductions over the vocabulary (log-softmax, entropy): XLA:CPU vectorises a reduction across the minor
        axis of its input, not along it, so summing over a leading vocabulary axis runs several times faster than
        over a trailing one (docs/decisions/003-vocabulary-major-log-probs.md has the figures).
        """
        dtype = self.config.dtype
        if self.config.tie_word_embeddings:
            weight, spec = self.embed_tokens.embedding[...], "vd,nd->vn"
        else:
            weight, spec = self.lm_head.kernel[...], "dv,nd->vn"
        return jnp.einsum(spec, weight.astype(dtype), hidden.astype(dtype))
