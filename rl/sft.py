"""Supervised warm-start: maximise the likelihood of teacher completions.

Used before RL when the Conductor cannot yet write the action format (format warm-start on template workflows) and
for rejection-sampling fine-tuning on logged high-reward rollouts. The loss is the mean negative log-likelihood of
the completion tokens (`loss_mask`) at temperature 1; prompts only condition.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from models.logprobs import token_logprobs
from rl import trajectories
from rl.learner import OptimizerConfig
from rl.trajectories import Trajectories


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    optimizer: OptimizerConfig = OptimizerConfig(learning_rate=1e-4, schedule="constant", total_steps=1)
    batch_size: int = 8
    logprob_chunk_size: int = 256
    length_buckets: tuple[int, ...] = trajectories.DEFAULT_LENGTH_BUCKETS
    seed: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"SFTConfig.batch_size must be >= 1, got {self.batch_size}")


@dataclasses.dataclass(frozen=True)
class Example:
    """A prompt and the completion the model should learn to continue it with (token ids)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]


def negative_log_likelihood(model: nnx.Module, batch: Trajectories, chunk_size: int) -> jax.Array:
    """Mean NLL of the loss-masked tokens of `batch` (vocabulary logits only from `completion_start` on)."""
    start = max(batch.completion_start, 1)
    hidden = model(batch.tokens, batch.positions, batch.attention_mask)
    logprobs = token_logprobs(model, hidden[:, start - 1 : -1], batch.tokens[:, start:], chunk_size=chunk_size)
    mask = batch.loss_mask[:, start:].astype(jnp.float32)
    return -(logprobs * mask).sum() / jnp.maximum(mask.sum(), 1.0)


class SupervisedTrainer:
    """Owns an optax optimizer over the model's parameters; `step(batch)` takes one jit-compiled gradient step."""

    def __init__(self, model: nnx.Module, config: SFTConfig):
        self.model = model
        self.config = config
        self._graphdef, params, self._rest = nnx.split(model, nnx.Param, ...)
        self._optimizer = config.optimizer.make()
        self.opt_state = self._optimizer.init(params)
        self._step = jax.jit(self._step_impl)

    def _step_impl(self, params, opt_state, batch: Trajectories):
        def loss_fn(params):
            return negative_log_likelihood(
                nnx.merge(self._graphdef, params, self._rest), batch, self.config.logprob_chunk_size
            )

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = self._optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, optax.global_norm(grads)

    def step(self, batch: Trajectories) -> dict[str, float]:
        params, self.opt_state, loss, grad_norm = self._step(
            nnx.state(self.model, nnx.Param), self.opt_state, jax.tree.map(jnp.asarray, batch)
        )
        nnx.update(self.model, params)
        return {"nll": float(loss), "grad_norm": float(grad_norm)}

    def batch(self, examples: Sequence[Example], pad_id: int) -> Trajectories:
        count = len(examples)
        return trajectories.build(
            [e.prompt_ids for e in examples],
            [e.completion_ids for e in examples],
            [np.zeros(len(e.completion_ids), np.float32) for e in examples],
            np.zeros(count, np.float32),
            np.arange(count),
            pad_id=pad_id,
            length_buckets=self.config.length_buckets,
        )

    def fit(
        self,
        examples: Sequence[Example],
        steps: int,
        pad_id: int,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
    ) -> list[dict[str, float]]:
        """`steps` steps over shuffled passes of `examples`, `batch_size` at a time; returns each step's metrics
        (and hands each to `on_step(step_index, metrics)` as it happens)."""
        if not examples:
            raise ValueError("no supervised examples to fit")
        rng = np.random.default_rng(self.config.seed)
        order: list[int] = []
        history = []
        for _ in range(steps):
            if len(order) < self.config.batch_size:
                order.extend(rng.permutation(len(examples)).tolist())
            chosen, order = order[: self.config.batch_size], order[self.config.batch_size:]
            history.append(self.step(self.batch([examples[i] for i in chosen], pad_id)))
            if on_step is not None:
                on_step(len(history) - 1, history[-1])
        return history
