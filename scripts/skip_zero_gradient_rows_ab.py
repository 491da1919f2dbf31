"""In-process A/B of `LearnerConfig.skip_zero_gradient_rows`: the tiny Conductor (2 layers, width 128, 49k vocabulary),
16 groups x 8 rows, 360-440-token prompts, mini-batches of 32, sampler old log-probs; the listed groups' advantages
are set to 0 (silent groups). The two learners alternate, 5 timed updates each.
    python scripts/skip_zero_gradient_rows_ab.py 4,5,6,7      (also 12,13,14,15,8,9 and 1,5,9,13)
Used by docs/log/2026-11-25-skip-zero-gradient-rows.md (then named skip_ab.py).
"""

import sys

from launch import host_memory

host_memory.retain_freed_memory(restart=True)

import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from models.config import ModelConfig  # noqa: E402
from models.transformer import Transformer  # noqa: E402
from rl.learner import Learner, LearnerConfig, OptimizerConfig  # noqa: E402
from rl.trajectories import build  # noqa: E402

config = ModelConfig(family="llama", vocab_size=49152, hidden_size=128, intermediate_size=512, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=32, tie_word_embeddings=True)
rng = np.random.default_rng(0)
GROUPS, SIZE = 16, 8
prompts = [p for _ in range(GROUPS) for p in [list(rng.integers(3, 500, size=int(rng.integers(360, 440))))] * SIZE]
completions = [list(rng.integers(3, 500, size=int(rng.integers(50, 64)))) for _ in range(GROUPS * SIZE)]
sampler = [list(-rng.uniform(0.1, 3.0, size=len(c))) for c in completions]
advantages = rng.normal(size=GROUPS * SIZE)
silent = [int(g) for g in sys.argv[1].split(",")] if len(sys.argv) > 1 else []
for g in silent:
    advantages[g * SIZE:(g + 1) * SIZE] = 0.0
batch = build(prompts, completions, sampler, advantages, np.repeat(np.arange(GROUPS), SIZE), pad_id=0)
learners = {}
for skip in (True, False):
    learner_config = LearnerConfig(optimizer=OptimizerConfig(learning_rate=1e-4, schedule="constant"),
                                   mini_batch_size=32, old_logprobs="sampler", temperature=0.7,
                                   skip_zero_gradient_rows=skip)
    learners[skip] = Learner(Transformer(config, rngs=nnx.Rngs(0)), learner_config)
    learners[skip].update(batch)
times = {True: [], False: []}
for _ in range(5):
    for skip, learner in learners.items():
        start = time.perf_counter()
        learner.update(batch)
        jax.block_until_ready(learner.params)
        times[skip].append(time.perf_counter() - start)
on, off = statistics.median(times[True]), statistics.median(times[False])
print(f"silent groups {silent}: skipped_rows {learners[True].update(batch)['skipped_rows']:.3f}; "
      f"update median skip on {on:.3f} s, off {off:.3f} s, ratio {off / on:.2f}")
