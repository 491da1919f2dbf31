"""fp32 matmul rates of XLA:CPU (jax.jit) and torch eager on this host, for the square matmul the learner benchmark's
MFU is measured against and for SmolLM2-135M's update shapes (8 x 256 tokens = 2048 rows, hidden 576, MLP 1536,
vocabulary 49152), interleaved so both engines see the same load.

    python scripts/cpu_matmul_rates.py [--repeats=5]

Prints one line per shape: GFLOP/s of each engine (best of the repeats) and their ratio. A CPU figure is only read
beside the CPU it ran on, which the first line names. Used by docs/log/2026-11-26-intel-cpu-engines.md.
"""

from launch import host_memory

host_memory.retain_freed_memory(restart=True)

import argparse  # noqa: E402
import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from launch.benchmark_suites.common import cpu_model, timed  # noqa: E402

# (rows, contracted, columns): the square reference, then the MLP's forward matmuls, their weight gradients
# (contracting the 2048 token rows) and the output head's forward over the completion's 1024 rows.
SHAPES = ((2048, 2048, 2048), (2048, 576, 1536), (2048, 1536, 576), (576, 2048, 1536), (1024, 576, 49152))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    print(f"CPU: {cpu_model()}; torch threads {torch.get_num_threads()}")
    rng = np.random.default_rng(0)
    matmul = jax.jit(jnp.matmul)
    for rows, inner, columns in SHAPES:
        a = rng.standard_normal((rows, inner), dtype=np.float32)
        b = rng.standard_normal((inner, columns), dtype=np.float32)
        a_jax, b_jax = jnp.asarray(a), jnp.asarray(b)
        a_torch, b_torch = torch.from_numpy(a), torch.from_numpy(b)
        flops = 2.0 * rows * inner * columns
        jax_s = min(timed(lambda: matmul(a_jax, b_jax).block_until_ready(), repeats=repeats))
        torch_s = min(timed(lambda: torch.mm(a_torch, b_torch), repeats=repeats))
        print(json.dumps({
            "shape": [rows, inner, columns],
            "xla_gflops_per_s": round(flops / jax_s / 1e9, 1),
            "torch_gflops_per_s": round(flops / torch_s / 1e9, 1),
            "xla_over_torch": round(torch_s / jax_s, 3),
        }))


if __name__ == "__main__":
    main()
