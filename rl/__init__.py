"""GRPO in JAX/Flax: the pieces a training loop composes.

- `rl.advantages`: advantage estimators by name (`ESTIMATORS`, `compute`) and dynamic-sampling filtering.
- `rl.losses`: `LossConfig` and the objective as pure functions of [batch, time] arrays (`grpo_loss`).
- `rl.trajectories`: the `Trajectories` batch pytree, `build` from generator token ids.
- `rl.learner`: `Learner` (model + optax AdamW, jit-compiled micro-batched update), its configs.
- `rl.checkpoint`: `Checkpointer` on orbax (params, optimizer state, RNG, loop state).
- `rl.metrics`: `MetricsWriter` to TensorBoard event files and metrics.jsonl.
"""
