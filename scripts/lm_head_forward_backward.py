"""The quickstart's LM head alone: `token_logprobs` at temperature 0.7 under `jax.value_and_grad` with respect to the
weights and the hidden states, 8 rows x 64 completion tokens, 49,152-entry tied head, with and without the entropy
metric (a constant to autodiff).
    python scripts/lm_head_forward_backward.py
Used by docs/log/2026-11-26-e2e-after-attention.md (then named head.py).
"""

from launch import host_memory

host_memory.retain_freed_memory(restart=True)

import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from models.config import ModelConfig  # noqa: E402
from models.logprobs import token_logprobs  # noqa: E402
from models.transformer import Transformer  # noqa: E402

config = ModelConfig(family="llama", vocab_size=49152, hidden_size=128, intermediate_size=512, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=32, tie_word_embeddings=True)
graphdef, params, rest = nnx.split(Transformer(config, rngs=nnx.Rngs(0)), nnx.Param, ...)
hidden = jax.random.normal(jax.random.key(1), (8, 64, 128))
targets = jax.random.randint(jax.random.key(2), (8, 64), 0, 49152)


def loss(params, hidden, entropy):
    logprobs, token_entropy = token_logprobs(nnx.merge(graphdef, params, rest), hidden, targets, temperature=0.7,
                                             return_entropy=True, entropy_gradient=False)
    return (logprobs * jnp.linspace(-1, 1, 64)).sum() + (0.0 * token_entropy.sum() if entropy else 0.0)


for entropy in (True, False):
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2)
    jax.block_until_ready(step(params, hidden, entropy))
    times = []
    for _ in range(15):
        start = time.perf_counter()
        jax.block_until_ready(step(params, hidden, entropy))
        times.append(time.perf_counter() - start)
    print(f"head forward + backward, entropy {entropy}: median {statistics.median(times) * 1e3:.1f} ms")
