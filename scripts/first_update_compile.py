"""Time a small Qwen2-shaped learner's first three updates in a fresh process (the first is mostly its compile), with
user and system CPU, and print the first update's metrics (loss, gradient norm: the GPU smoke check against the CPU).

The model: Qwen2.5-1.5B's config cut to 2 layers of width 256, 1,024-entry vocabulary, bf16 matmuls, float32 weights;
8 x (32 + 32) tokens in 2 groups sharing their prompt, micro-batches of 2 (the learner benchmark's accelerator config).
glibc's settings are applied with `mallopt` (`launch.host_memory.retain_freed_memory()`) when `RETAIN_HOST_MEMORY`
asks for them; the A/B of docs/log/2026-11-26-h200.md ran, each in a fresh process:
    for r in 0 1 0; do RETAIN_HOST_MEMORY=$r timeout 70 python scripts/first_update_compile.py; done
and on a CPU host, one glibc setting at a time through the environment:
    JAX_PLATFORMS=cpu RETAIN_HOST_MEMORY=0 GLIBC_TUNABLES=<settings> python scripts/first_update_compile.py
(then named first_update.py).
"""

from launch import host_memory

host_memory.retain_freed_memory()

import resource  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
from flax import nnx  # noqa: E402

from launch.benchmark_suites.learner import QWEN25_1_5B, _learner_config, _random_batch  # noqa: E402
from models.config import ModelConfig  # noqa: E402
from models.transformer import Transformer  # noqa: E402
from rl.learner import Learner  # noqa: E402

config = ModelConfig.from_hf(dict(QWEN25_1_5B, num_hidden_layers=2, hidden_size=256, intermediate_size=512,
                                  num_attention_heads=4, head_dim=64, vocab_size=1024),
                             dtype="bfloat16", param_dtype="float32")
learner = Learner(Transformer(config, rngs=nnx.Rngs(0)), _learner_config(micro_batch_size=2))
batch, _ = _random_batch(batch=8, prompt=32, completion=32, vocab=1024, groups=2, shared_prompts=True)
for i in range(3):
    start = time.perf_counter()
    metrics = learner.update(batch)
    jax.block_until_ready(learner.params)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"update {i} {time.perf_counter() - start:.2f} s, user {usage.ru_utime:.1f} s, sys {usage.ru_stime:.1f} s")
    if i == 0:
        print(metrics)
