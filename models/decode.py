"""Greedy decoding with the NNX model, for tests and parity checks against `transformers.generate`.

No KV cache: every step reruns the whole fixed-size buffer, so one compiled function serves all steps.
Rollout-scale generation belongs to `rollout`.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.transformer import Transformer


def greedy_decode(
    model: Transformer, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_ids: Sequence[int] = ()
) -> list[int]:
    """The argmax continuation of `prompt_ids`: up to `max_new_tokens` ids, ending at the first EOS (included)."""
    if not prompt_ids:
        raise ValueError("prompt_ids must not be empty")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    graphdef, state = nnx.split(model)

    @jax.jit
    def next_token(state: nnx.State, tokens: jax.Array, length: jax.Array) -> jax.Array:
        decoder = nnx.merge(graphdef, state)
        indices = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None, :]
        hidden = decoder(tokens, indices, indices < length)
        last = jax.lax.dynamic_index_in_dim(hidden, length - 1, axis=1, keepdims=True)
        return jnp.argmax(decoder.logits(last)[0, 0].astype(jnp.float32))

    tokens = np.zeros((1, len(prompt_ids) + max_new_tokens), dtype=np.int32)
    tokens[0, : len(prompt_ids)] = prompt_ids
    stop = set(int(token) for token in eos_token_ids)
    generated: list[int] = []
    for length in range(len(prompt_ids), tokens.shape[1]):
        token = int(next_token(state, jnp.asarray(tokens), jnp.int32(length)))
        generated.append(token)
        tokens[0, length] = token
        if token in stop:
            break
    return generated
