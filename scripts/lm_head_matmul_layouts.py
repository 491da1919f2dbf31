"""Each contraction of the LM head alone under jit, in the layouts XLA may choose: N = 512 tokens, K = 128, V = 49,152.

`vd,nd->vn` is the forward (vocabulary-major logits), `vn,nd->vd` the weight gradient, `vn,vd->nd` the hidden-state
gradient and `vd,vn->dn` the same gradient written transposed.
    python scripts/lm_head_matmul_layouts.py
Used by docs/log/2026-11-25-quickstart-lm-head.md.
"""

from launch import host_memory

host_memory.retain_freed_memory(restart=True)

import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

SIZES = {"v": 49152, "d": 128, "n": 512}
for spec in ["vd,nd->vn", "vn,nd->vd", "vn,vd->nd", "vd,vn->dn"]:
    left, right = spec.split("->")[0].split(",")
    x = jax.random.normal(jax.random.key(0), tuple(SIZES[c] for c in left))
    y = jax.random.normal(jax.random.key(1), tuple(SIZES[c] for c in right))
    contract = jax.jit(lambda x, y, spec=spec: jnp.einsum(spec, x, y))
    jax.block_until_ready(contract(x, y))
    start = time.perf_counter()
    for _ in range(8):
        jax.block_until_ready(contract(x, y))
    seconds = (time.perf_counter() - start) / 8
    print(spec, f"{seconds * 1e3:.2f} ms", f"{2 * SIZES['v'] * SIZES['d'] * SIZES['n'] / seconds / 1e9:.0f} GFLOP/s")
