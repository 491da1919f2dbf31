"""Forward + backward of `models.logprobs.token_logprobs` on the quickstart Conductor's LM head, per chunk size.

The head: 49,152-token vocabulary, 128-wide hidden state, tied weights; 64 completion positions per row.
    python scripts/lm_head_chunk_sizes.py [ROWS]     (ROWS default 8)
Used by docs/log/2026-11-25-quickstart-lm-head.md. Run it with freed host memory retained (the default here, see
`launch.host_memory`): without it, smaller chunks look faster than they are (docs/log/2026-11-25-fewer-logit-passes.md).
"""

import sys

from launch import host_memory

host_memory.retain_freed_memory(restart=True)

import time  # noqa: E402

import jax  # noqa: E402
from flax import nnx  # noqa: E402

from models.config import ModelConfig  # noqa: E402
from models.logprobs import token_logprobs  # noqa: E402
from models.transformer import Transformer  # noqa: E402

VOCAB, HIDDEN, COMPLETION = 49152, 128, 64
config = ModelConfig(family="llama", vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=512, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=32, tie_word_embeddings=True)
graphdef, params = nnx.split(Transformer(config, rngs=nnx.Rngs(0)))
rows = int(sys.argv[1]) if len(sys.argv) > 1 else 8
hidden = jax.random.normal(jax.random.key(0), (rows, COMPLETION, HIDDEN))
targets = jax.random.randint(jax.random.key(1), (rows, COMPLETION), 0, VOCAB)
for chunk in [64, 32, 16, 8, 4]:
    def loss(params, hidden, chunk=chunk):
        logprobs, _ = token_logprobs(nnx.merge(graphdef, params), hidden, targets, chunk_size=chunk,
                                     return_entropy=True, entropy_gradient=False)
        return logprobs.sum()

    gradient = jax.jit(jax.grad(loss, argnums=(0, 1)))
    jax.block_until_ready(gradient(params, hidden))
    start = time.perf_counter()
    for _ in range(5):
        jax.block_until_ready(gradient(params, hidden))
    seconds = (time.perf_counter() - start) / 5
    flops = 6 * rows * COMPLETION * HIDDEN * VOCAB
    print(rows, chunk, f"{seconds * 1000:.1f} ms", f"{flops / seconds / 1e9:.0f} GFLOP/s")
