"""Supervised warm-start: maximise the likelihood of teacher completions.

Used before RL when the Conductor cannot yet write the action format (format warm-start on template workflows) and
for rejection-sampling fine-tuning on logged high-reward rollouts. The loss is the mean negative log-likelihood of
the completion tokens (`loss_mask`) at temperature 1 (under an example's token constraints, of the masked
distribution); prompts only condition. An example may carry a weight (its grade, say): each token's NLL is then
multiplied by its example's weight before the mean over tokens, so a weight-w example counts as w copies of it, in
any batch (reward-weighted regression, whose optimum imitates each completion in proportion to its expected grade).

Optional head (`SFTConfig.head`, `SupervisedHead`): a small model with parameters of its own, trained jointly on the
final hidden state that predicts one marked completion token of each example (`Example.probe_index`) against the
example's label (`Example.probe_label`), and discarded afterwards; its loss parts are added to the NLL. A package above
rl defines one (a linear probe of the question's task, say, which makes that state carry the task while the
completions the student imitates do not depend on it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from models.logprobs import completion_predictors, token_logprobs
from models.sharding import keep_shardings, mesh_of, replicate_off_mesh, shardings_of
from rl import trajectories
from rl.learner import OptimizerConfig
from rl.trajectories import Trajectories


class SupervisedHead(Protocol):
    """A jointly trained extra of the supervised loss, reading each example's state at its marked token."""

    def init(self, hidden_size: int, key: jax.Array) -> Any:
        """The head's parameters (a pytree), trained with the model's and discarded after the warm-start."""
        ...

    def check_labels(self, labels: set[int]) -> None:
        """Raises ValueError unless the examples' labels are ones the head can read."""
        ...

    def loss(self, params: Any, states: jax.Array, labels: jax.Array) -> tuple[tuple[jax.Array, ...], dict]:
        """(the weighted scalars the loss adds to the NLL, in order; metrics) for `states` [B, H] float32 and
        `labels` [B] (-1: the row has none)."""
        ...


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    optimizer: OptimizerConfig = OptimizerConfig(learning_rate=1e-4, schedule="constant", total_steps=1)
    batch_size: int = 8
    logprob_chunk_size: int = 256
    length_buckets: tuple[int, ...] = trajectories.DEFAULT_LENGTH_BUCKETS
    seed: int = 0  # the shuffle's, and the head's initialisation
    head: SupervisedHead | None = None
    # Encode a prompt once per aligned block of rows that carry it (a question's completions); the same loss and
    # gradient.
    share_prompts: bool = True

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"SFTConfig.batch_size must be >= 1, got {self.batch_size}")


@dataclasses.dataclass(frozen=True)
class Example:
    """A prompt and the completion the model should learn to continue it with (token ids)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    probe_index: int | None = None  # completion token whose predicting hidden state the head reads
    probe_label: int | None = None  # the example's label there
    weight: float = 1.0
    # The constraint each completion token is scored under (`rl.trajectories.build`'s token_constraints; (): none):
    # its likelihood is then that of the masked policy a masked sampler draws from.
    constraints: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.constraints and len(self.constraints) != len(self.completion_ids):
            raise ValueError(f"{len(self.completion_ids)} completion tokens but {len(self.constraints)} constraints")
        if not (np.isfinite(self.weight) and self.weight >= 0):
            raise ValueError(f"Example.weight must be finite and >= 0, got {self.weight}")
        if (self.probe_index is None) != (self.probe_label is None):
            raise ValueError("Example.probe_index and probe_label are given together or not at all")
        if self.probe_index is not None and not 0 <= self.probe_index < len(self.completion_ids):
            raise ValueError(
                f"probe_index {self.probe_index} is outside the {len(self.completion_ids)}-token completion"
            )


def negative_log_likelihood(
    model: nnx.Module, predicting: jax.Array, batch: Trajectories, chunk_size: int
) -> jax.Array:
    """NLL of the loss-masked completion tokens of `batch` given the states `predicting` them
    (`models.logprobs.completion_predictors`), each token weighted by its row's example weight, over the batch's
    loss-token count.

    The weights ride in `batch.advantages`: weighted likelihood is the advantage-weighted regression form. Dividing
    by the tokens, not by the weights' sum, keeps a weight's meaning from one batch to the next: a batch of
    low-grade examples pulls less, as their copies would, instead of being scaled up to a full batch's pull.
    """
    completion = slice(batch.completion_start, None)
    constrained = batch.constraint_ids is not None
    logprobs = token_logprobs(
        model, predicting, batch.tokens[:, completion], chunk_size=chunk_size,
        constraint_ids=batch.constraint_ids[:, completion] if constrained else None,
        constraint_kinds=batch.constraint_kinds[:, completion] if constrained else None,
    )
    mask = batch.loss_mask[:, completion].astype(jnp.float32)
    weights = mask * batch.advantages[:, completion]  # the row's weight on each of its tokens
    return -(logprobs * weights).sum() / jnp.maximum(mask.sum(), 1.0)


def marked_states(hidden: jax.Array, positions: jax.Array) -> jax.Array:
    """`hidden[b, positions[b]]` in float32, [B, H]: one state of each row."""
    return jnp.take_along_axis(hidden, positions[:, None, None], axis=1)[:, 0].astype(jnp.float32)


class SupervisedTrainer:
    """Owns an optax optimizer over the model's parameters; `step(batch)` takes one jit-compiled gradient step."""

    def __init__(self, model: nnx.Module, config: SFTConfig):
        self.model = model
        self.config = config
        self._graphdef, params, self._rest = nnx.split(model, nnx.Param, ...)
        self.head_params = None
        if config.head is not None:
            self.head_params = config.head.init(model.config.hidden_size, jax.random.key(config.seed))
        self._optimizer = config.optimizer.make()
        self.opt_state = self._optimizer.init((params, self.head_params))
        if (mesh := mesh_of(params)) is not None:
            self.head_params, self.opt_state = replicate_off_mesh((self.head_params, self.opt_state), mesh)
        # Where the parameters and optimizer state live on a mesh (`models.sharding.keep_shardings`): each step
        # returns them there.
        self._state_shardings = shardings_of(((params, self.head_params), self.opt_state))
        self._step = jax.jit(self._step_impl, static_argnames=("prompt_block",))

    def _step_impl(self, params, opt_state, batch: Trajectories, probe_indices, probe_labels, *, prompt_block: int):
        def loss_fn(params):
            model_params, head_params = params
            model = nnx.merge(self._graphdef, model_params, self._rest)
            predicting = completion_predictors(
                model, batch.tokens, batch.positions, batch.attention_mask, batch.completion_start, prompt_block
            )
            nll = negative_log_likelihood(model, predicting, batch, self.config.logprob_chunk_size)
            if head_params is None:
                return nll, {"nll": nll}
            head_parts, head_metrics = self.config.head.loss(
                head_params, marked_states(predicting, probe_indices), probe_labels
            )
            loss = nll
            for part in head_parts:
                loss = loss + part
            return loss, {"nll": nll, **head_metrics}

        (_, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = self._optimizer.update(grads, opt_state, params)
        params, opt_state = keep_shardings((optax.apply_updates(params, updates), opt_state), self._state_shardings)
        return params, opt_state, parts, optax.global_norm(grads)

    def step(self, batch: Trajectories, probe_indices=None, probe_labels=None) -> dict[str, float]:
        """One gradient step; with a head, `probe_indices` (the completion token of each row whose predicting
        state the head reads) and `probe_labels` (-1 for a row without one). Rows that share a prompt in aligned
        blocks (`Trajectories.prompt_block_size`) have it encoded once."""
        if self.head_params is not None and (probe_indices is None or probe_labels is None):
            raise ValueError("this trainer has a head: step() needs probe_indices and probe_labels")
        (params, self.head_params), self.opt_state, parts, grad_norm = self._step(
            (nnx.state(self.model, nnx.Param), self.head_params),
            self.opt_state,
            jax.tree.map(jnp.asarray, batch),
            None if self.head_params is None else jnp.asarray(probe_indices, jnp.int32),
            None if self.head_params is None else jnp.asarray(probe_labels, jnp.int32),
            prompt_block=batch.prompt_block_size(batch.batch_size) if self.config.share_prompts else 1,
        )
        nnx.update(self.model, params)
        return {**{name: float(value) for name, value in parts.items()}, "grad_norm": float(grad_norm)}

    def batch(self, examples: Sequence[Example], pad_id: int) -> Trajectories:
        count = len(examples)
        return trajectories.build(
            [e.prompt_ids for e in examples],
            [e.completion_ids for e in examples],
            [np.zeros(len(e.completion_ids), np.float32) for e in examples],
            np.array([e.weight for e in examples], np.float32),
            np.arange(count),
            pad_id=pad_id,
            length_buckets=self.config.length_buckets,
            token_constraints=[e.constraints for e in examples] if any(e.constraints for e in examples) else None,
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
        if not any(e.weight > 0 for e in examples):
            raise ValueError("every supervised example has weight 0")
        if self.config.head is not None:
            labels = {e.probe_label for e in examples if e.probe_label is not None}
            if not labels:
                raise ValueError("this trainer has a head, but no example has a probe label")
            self.config.head.check_labels(labels)
        # A run of consecutive examples with one prompt (a question's completions) is shuffled as a unit, so it
        # lands in one batch and its prompt is encoded once.
        units = [[0]]
        for index in range(1, len(examples)):
            if examples[index].prompt_ids == examples[index - 1].prompt_ids:
                units[-1].append(index)
            else:
                units.append([index])
        rng = np.random.default_rng(self.config.seed)
        order: list[int] = []
        history = []
        for _ in range(steps):
            while len(order) < self.config.batch_size:
                order.extend(i for unit in rng.permutation(len(units)) for i in units[unit])
            chosen, order = order[: self.config.batch_size], order[self.config.batch_size:]
            history.append(self._fit_step([examples[i] for i in chosen], pad_id))
            if on_step is not None:
                on_step(len(history) - 1, history[-1])
        return history

    def _fit_step(self, examples: Sequence[Example], pad_id: int) -> dict[str, float]:
        batch = self.batch(examples, pad_id)
        if self.head_params is None:
            return self.step(batch)
        return self.step(
            batch,
            [e.probe_index or 0 for e in examples],
            [-1 if e.probe_label is None else e.probe_label for e in examples],
        )
