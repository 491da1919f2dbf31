"""Time `Learner.update` on a batch shaped like a quickstart iteration's: 4 groups of 8 rows sharing a 560-700-token
prompt, 50-64 completion tokens, mini-batches of 8 (4 optimizer steps), temperature 0.7, sampler old log-probs.

    python scripts/quickstart_update_time.py [VOCAB [MINI_BATCH]]     (defaults 49152 8)
VOCAB 512 times the model body without the quickstart's 49,152-entry head; MINI_BATCH 16 or 32 updates the same rows
in fewer optimizer steps. Used by docs/log/2026-11-25-fewer-logit-passes.md, 2026-11-26-learner-benchmark-steady.md
and 2026-11-26-e2e-after-attention.md (then named quickstart_update.py, with the two arguments edited in by hand).
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

vocab = int(sys.argv[1]) if len(sys.argv) > 1 else 49152
mini_batch = int(sys.argv[2]) if len(sys.argv) > 2 else 8
config = ModelConfig(family="llama", vocab_size=vocab, hidden_size=128, intermediate_size=512, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=32, tie_word_embeddings=True)
rng = np.random.default_rng(0)
prompts = [p for _ in range(4) for p in [list(rng.integers(3, 500, size=int(rng.integers(560, 700))))] * 8]
completions = [list(rng.integers(3, 500, size=int(rng.integers(50, 64)))) for _ in range(32)]
sampler = [list(-rng.uniform(0.1, 3.0, size=len(c))) for c in completions]
batch = build(prompts, completions, sampler, rng.normal(size=32), np.repeat(np.arange(4), 8), pad_id=0)
learner_config = LearnerConfig(optimizer=OptimizerConfig(learning_rate=3e-4, schedule="constant"),
                               mini_batch_size=mini_batch, old_logprobs="sampler", temperature=0.7)
learner = Learner(Transformer(config, rngs=nnx.Rngs(0)), learner_config)
learner.update(batch)
times = []
for _ in range(8):
    start = time.perf_counter()
    learner.update(batch)
    jax.block_until_ready(learner.params)
    times.append(time.perf_counter() - start)
print(f"vocabulary {vocab}, mini-batches of {mini_batch}: update median {statistics.median(times):.3f} s, "
      f"min {min(times):.3f} s")
