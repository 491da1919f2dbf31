"""The learner benchmark's SmolLM2-135M update (8 x (128 + 128) tokens, 2 groups of 4) alone in a process: each of
five updates' wall time and the minor page faults it took, to see when glibc starts reusing freed heap pages.

    python scripts/learner_update_faults.py [MICRO_BATCH]     (default: the whole batch in one pass)
Downloads SmolLM2-135M-Instruct through `models.zoo` on first use. Used by
docs/log/2026-11-26-learner-benchmark-steady.md (then named solo.py).
"""

import sys

from launch import host_memory

host_memory.retain_freed_memory(restart=True)

import resource  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from models import hf_io, zoo  # noqa: E402
from rl.learner import Learner, LearnerConfig, OptimizerConfig  # noqa: E402
from rl.losses import LossConfig  # noqa: E402
from rl.trajectories import build  # noqa: E402

model_dir = zoo.smollm2_135m_instruct()
rng = np.random.default_rng(0)
ROWS, PROMPT, COMPLETION = 8, 128, 128
prompts = rng.integers(3, 49152, size=(ROWS, PROMPT)).tolist()
completions = rng.integers(3, 49152, size=(ROWS, COMPLETION)).tolist()
sampler = (-rng.uniform(0.5, 8.0, size=(ROWS, COMPLETION))).tolist()
advantages = rng.normal(size=ROWS).astype(np.float32)
batch = build(prompts, completions, sampler, advantages, np.repeat(np.arange(2), 4), pad_id=2,
              length_buckets=(PROMPT + COMPLETION,))
config = LearnerConfig(loss=LossConfig(clip_low=0.2, clip_high=0.2, aggregation="seq-mean-token-mean"),
                       optimizer=OptimizerConfig(learning_rate=1e-6, schedule="constant", max_grad_norm=1.0),
                       micro_batch_size=int(sys.argv[1]) if len(sys.argv) > 1 else None)
learner = Learner(hf_io.load(model_dir), config)
for i in range(5):
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    learner.update(batch)
    jax.block_until_ready(learner.params)
    after = resource.getrusage(resource.RUSAGE_SELF)
    print(f"update {i}: {time.perf_counter() - start:.2f} s, minor faults {after.ru_minflt - before.ru_minflt}")
