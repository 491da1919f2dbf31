"""The LM head's three matmuls (V = 49,152, N = 512 tokens, D = 128) timed alone in JAX, in each layout, and in torch:
the forward `vd,nd->vn`, the weight gradient `vn,nd->vd`, the hidden-state gradient `vn,vd->nd` and its transposed
form `vd,vn->dn`.
    python scripts/lm_head_matmuls_jax_torch.py
Used by docs/log/2026-11-26-e2e-after-attention.md (then named matmuls.py).
"""

from launch import host_memory

host_memory.retain_freed_memory(restart=True)

import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

V, N, D = 49152, 512, 128
key = jax.random.key(0)
W, h, G = jax.random.normal(key, (V, D)), jax.random.normal(key, (N, D)), jax.random.normal(key, (V, N))


def report(name, run):
    run()
    times = []
    for _ in range(15):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(f"{name:24s} {median * 1e3:7.2f} ms {2 * V * N * D / median / 1e9:6.0f} GFLOP/s")


for spec, a, b in [("vd,nd->vn", W, h), ("vn,nd->vd", G, h), ("vn,vd->nd", G, W), ("vd,vn->dn", W, G)]:
    contract = jax.jit(lambda a, b, spec=spec: jnp.einsum(spec, a, b))
    report(spec, lambda contract=contract, a=a, b=b: contract(a, b).block_until_ready())
W_torch, h_torch, G_torch = torch.randn(V, D), torch.randn(N, D), torch.randn(V, N)
report("torch W @ h.T", lambda: W_torch @ h_torch.T)
report("torch G @ h", lambda: G_torch @ h_torch)
report("torch G.T @ W", lambda: G_torch.T @ W_torch)
