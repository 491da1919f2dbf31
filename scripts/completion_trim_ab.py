"""Time `Learner.update` on a batch shaped like a `replay_rl.cfg` iteration in which one completion ran past 64
tokens, with each optimizer step's completion block trimmed to its own longest completion against every step at the
batch's block (the learner before 2026-12-05): docs/decisions/010-mini-batches-trimmed-to-their-own-length.md.

    python scripts/completion_trim_ab.py [UPDATES]     (default 5)

80 questions x 4 completions sharing their question's 380-560-token prompt, 20-60 completion tokens and one of 90,
mini-batches of 80 in micro-batches of 40 (four optimizer steps), the tiny Conductor (2 layers, width 128, SmolLM2's
49,152-entry vocabulary), sampler old log-probs at temperature 0.7. The untrimmed batch is the same rows built with
one completion bucket of 128, so every step runs at the block the long row needs. The two learners alternate update
by update in this process, and the report gives both medians, their ratio and how far apart the two learners'
parameters end (the same updates, so float rounding only).
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

updates = int(sys.argv[1]) if len(sys.argv) > 1 else 5
QUESTIONS, GROUP = 80, 4
config = ModelConfig(family="llama", vocab_size=49152, hidden_size=128, intermediate_size=512, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=32, tie_word_embeddings=True)
rng = np.random.default_rng(0)
prompts = [
    p for _ in range(QUESTIONS) for p in [list(rng.integers(3, 49000, size=int(rng.integers(380, 560))))] * GROUP
]
lengths = rng.integers(20, 60, size=QUESTIONS * GROUP)
lengths[5] = 90  # one completion in the first mini-batch runs on
completions = [list(rng.integers(3, 49000, size=int(n))) for n in lengths]
sampler = [list(-rng.uniform(0.1, 3.0, size=len(c))) for c in completions]
group_ids = np.repeat(np.arange(QUESTIONS), GROUP)
advantages = rng.normal(size=QUESTIONS * GROUP)
batches = {
    name: build(prompts, completions, sampler, advantages, group_ids, pad_id=0, **buckets)
    for name, buckets in (("trimmed", {}), ("untrimmed", {"completion_buckets": (128,)}))
}
learner_config = LearnerConfig(optimizer=OptimizerConfig(learning_rate=1e-4, schedule="constant"),
                               mini_batch_size=80, micro_batch_size=40, old_logprobs="sampler", temperature=0.7)
learners = {name: Learner(Transformer(config, rngs=nnx.Rngs(0)), learner_config) for name in batches}
times = {name: [] for name in batches}
for update in range(updates + 1):  # the first update of each compiles and is not timed
    for name, learner in learners.items():
        start = time.perf_counter()
        learner.update(batches[name])
        jax.block_until_ready(learner.params)
        if update:
            times[name].append(time.perf_counter() - start)
apart = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
            for a, b in zip(jax.tree.leaves(learners["trimmed"].params), jax.tree.leaves(learners["untrimmed"].params)))
medians = {name: statistics.median(values) for name, values in times.items()}
for name, values in times.items():
    print(f"{name}: update median {medians[name]:.3f} s ({', '.join(f'{v:.2f}' for v in values)})")
print(f"untrimmed / trimmed: {medians['untrimmed'] / medians['trimmed']:.2f}x; parameters apart by at most {apart:.2e}")
