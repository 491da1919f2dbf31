"""Times one warm-start (`rl.supervised.SupervisedTrainer`) step of the tiny Conductor at the warm-start's shapes and
prints XLA's FLOP count for it. Run from the repository root with the XLA_FLAGS to compare, one thread each:

    OMP_NUM_THREADS=1 XLA_FLAGS=--xla_cpu_multi_thread_eigen=false taskset -c 0 python scripts/warm_start_step_time.py
    OMP_NUM_THREADS=1 XLA_FLAGS="--xla_cpu_multi_thread_eigen=false --xla_cpu_use_fusion_emitters=false" \
        taskset -c 0 python scripts/warm_start_step_time.py
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from conductor.model import tiny_conductor_config
from models.config import ModelConfig
from models.transformer import Transformer
from rl.learner import OptimizerConfig
from rl.supervised import Example, SFTConfig, SupervisedTrainer

SMOLLM2_VOCAB = 49152
PROMPT_TOKENS, COMPLETION_TOKENS = 330, 40  # about the quickstart's warm-start examples


def main(rows: int = 8, repeats: int = 10) -> None:
    config = ModelConfig.from_hf(tiny_conductor_config(SMOLLM2_VOCAB, 2, 128))
    rng = np.random.default_rng(0)
    examples = [
        Example(prompt_ids=tuple(rng.integers(0, SMOLLM2_VOCAB, PROMPT_TOKENS - i).tolist()),
                completion_ids=tuple(rng.integers(0, SMOLLM2_VOCAB, COMPLETION_TOKENS + i).tolist()))
        for i in range(rows)
    ]
    optimizer = OptimizerConfig(learning_rate=3e-3, schedule="constant", total_steps=100)
    trainer = SupervisedTrainer(Transformer(config, rngs=nnx.Rngs(0)), SFTConfig(optimizer=optimizer, batch_size=rows))
    batch = trainer.batch(examples, pad_id=0)
    trainer.step(batch)  # compiles
    start = time.perf_counter()
    for _ in range(repeats):
        trainer.step(batch)
    seconds = (time.perf_counter() - start) / repeats
    arguments = ((nnx.state(trainer.model, nnx.Param), None), trainer.opt_state, jax.tree.map(jnp.asarray, batch),
                 None, None)
    cost = trainer._step.lower(*arguments, prompt_block=1).compile().cost_analysis()
    flops = (cost[0] if isinstance(cost, list) else cost).get("flops", 0.0)
    print(f"rows {rows}, shape {batch.tokens.shape}: {seconds * 1000:.0f} ms a step, {flops / 1e9:.1f} GFLOP, "
          f"{flops / 1e9 / seconds:.1f} GFLOP/s")


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:]))
