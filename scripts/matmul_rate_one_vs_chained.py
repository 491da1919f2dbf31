"""The learner benchmark's matmul rate on the default device, measured as before commit 46d67b8 (one 2048^3 matmul
per call, best of 3) against the suite's `_matmul_flops_per_s` now (on a CPU it still runs one per call; on an
accelerator it chains 8 so the launch and the host's wait stop counting), three rounds alternating in one process.
    python scripts/matmul_rate_one_vs_chained.py
Used by docs/log/2026-11-26-h200.md (then named matmul_rate.py).
"""

from launch import host_memory

host_memory.retain_freed_memory(restart=True)

import jax  # noqa: E402

from launch.benchmark_suites.common import timed  # noqa: E402
from launch.benchmark_suites.learner import _matmul_flops_per_s  # noqa: E402


def one_matmul_per_call(size: int = 2048) -> float:
    a = jax.random.normal(jax.random.key(0), (size, size))
    matmul = jax.jit(lambda x: x @ x)
    return 2 * size**3 / min(timed(lambda: matmul(a).block_until_ready(), repeats=3))


for _ in range(3):
    print(f"one per call {one_matmul_per_call() / 1e9:.0f} GFLOP/s, suite {_matmul_flops_per_s() / 1e9:.0f} GFLOP/s")
