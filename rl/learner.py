"""The learner: a model, its optax optimizer and the jit-compiled GRPO update.

`Learner.update(batch)` runs `ppo_epochs` passes over the batch in mini-batches of `mini_batch_size` rows, one
optimizer step per mini-batch, its gradient accumulated over micro-batches of `micro_batch_size` rows. Every loss is
a sum of per-token terms weighted on the whole mini-batch (`rl.losses.aggregation_weights`), so the accumulated
gradient is the mini-batch's whatever the split, and neither padding rows (which carry no loss) nor the rows
`rl.row_selection` leaves out change it. `LearnerConfig` says what each option saves.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct
from jax.sharding import Mesh

from models.logprobs import completion_predictors, token_logprobs
from models.lora import LoRAConfig, adapted, apply_lora
from models.sharding import batch_sharding, keep_shardings, replicate_off_mesh, shard_model, shardings_of
from rl import row_selection
from rl.auxiliary import TermInputs
from rl.losses import LossConfig, aggregation_weights, grpo_loss
from rl.trajectories import Trajectories, bucket_length, take_columns

OldLogprobs = Literal["recompute", "sampler"]


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with linear warmup from 0, then a cosine decay to 0 at `total_steps` or a constant rate.

    Steps are optimizer steps, `optimizer_steps_per_update` of them per `Learner.update`; the schedule advances by
    the steps actually taken. When the batch's row count varies (recursion rounds), size `total_steps` for the
    largest batch an iteration can hold, as `launch.train` does: a schedule sized for fewer steps would reach its end
    part-way through the run and hold a cosine's rate at 0 from there on, while one sized for the largest batch
    only ends the run short of its last steps (the rate still above 0) when batches were smaller.
    `max_grad_norm` clips the global gradient norm before AdamW (None: no clipping).
    """

    learning_rate: float = 1e-6
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 0
    schedule: Literal["cosine", "constant"] = "cosine"
    total_steps: int = 1000
    max_grad_norm: float | None = 1.0

    def __post_init__(self) -> None:
        if self.learning_rate <= 0:
            raise ValueError(f"OptimizerConfig.learning_rate must be > 0, got {self.learning_rate}")
        if not (0.0 <= self.b1 < 1.0 and 0.0 <= self.b2 < 1.0):
            raise ValueError(f"OptimizerConfig betas must be in [0, 1), got {self.b1}, {self.b2}")
        if self.eps <= 0:
            raise ValueError(f"OptimizerConfig.eps must be > 0, got {self.eps}")
        if self.weight_decay < 0:
            raise ValueError(f"OptimizerConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if self.schedule not in ("cosine", "constant"):
            raise ValueError(f"OptimizerConfig.schedule must be 'cosine' or 'constant', got {self.schedule!r}")
        if self.total_steps < 1 or not 0 <= self.warmup_steps <= self.total_steps:
            raise ValueError(
                f"need total_steps >= 1 and 0 <= warmup_steps <= total_steps, got {self.warmup_steps}, "
                f"{self.total_steps}"
            )
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"OptimizerConfig.max_grad_norm must be > 0 or None, got {self.max_grad_norm}")

    def learning_rate_schedule(self) -> optax.Schedule:
        # A warmup that lasts the whole run leaves no steps to decay over (optax rejects a 0-step cosine): every
        # step is then a warmup step, whatever the schedule after it would have been.
        if self.schedule == "cosine" and self.warmup_steps < self.total_steps:
            return optax.warmup_cosine_decay_schedule(0.0, self.learning_rate, self.warmup_steps, self.total_steps)
        if self.warmup_steps == 0:
            return optax.constant_schedule(self.learning_rate)
        return optax.join_schedules(
            [optax.linear_schedule(0.0, self.learning_rate, self.warmup_steps),
             optax.constant_schedule(self.learning_rate)],
            [self.warmup_steps],
        )

    def make(self) -> optax.GradientTransformation:
        adamw = optax.adamw(
            self.learning_rate_schedule(), b1=self.b1, b2=self.b2, eps=self.eps, weight_decay=self.weight_decay
        )
        if self.max_grad_norm is None:
            return adamw
        return optax.chain(optax.clip_by_global_norm(self.max_grad_norm), adamw)


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """How `Learner.update` turns a batch into optimizer steps.

    ppo_epochs: passes over each batch (mu in GRPO).
    mini_batch_size: sequences per optimizer step (None: the whole batch, one step per pass); a batch that does not
        split into them ends with a shorter mini-batch. A batch may hold any number of rows (with recursion rounds
        it changes every iteration).
    micro_batch_size: sequences per forward/backward pass (None: the whole mini-batch); only memory depends on it.
        Every mini-batch is padded to one row count, a multiple of it and of the data-parallel devices, with rows
        that carry no loss (`Trajectories.padded`), so the steps of an update share one compiled program.
    logprob_chunk_size: sequence chunk for log-softmax, so [batch, time, vocab] logits never exist whole.
    temperature: the sampling temperature; log-probs are log_softmax(logits / temperature) as the sampler's are.
    share_prompts: consecutive rows that carry the same prompt (a GRPO group's completions) run it through the
        model once: its keys and values are repeated for each completion, which attends to them as to its own
        earlier columns. Values and gradients are those of the full rows; the work on the prompt drops by the group
        size. Rows that share nothing fall back to one pass per row, so this is safe on any batch.
    old_logprobs: where the old log-probs (the denominator of the policy ratio) of steps after an update's first
        come from. The first step runs at the weights that sampled the batch and takes the stop-gradient of its
        own log-probs (no extra pass). The others take the learner's at those weights from a forward pass before
        the first step ("recompute"), or the sampler's ("sampler", the "skip the recompute" option of slime, Tunix
        and verl's bypass mode): that saves a forward pass over all but one mini-batch and makes the sampler the
        behaviour policy of those steps; the learner/sampler mismatch is still measured, on the first step's
        tokens. A mismatch correction needs "recompute": with the sampler as the behaviour policy it has nothing
        to correct.
    skip_zero_gradient_rows: do not run rows whose loss has no gradient (`rl.row_selection`); the update is the
        same.
    run_duplicates_once: run each distinct row of a prompt block through the model once (`rl.row_selection`); the
        update is the same.
    steady_shapes: no step runs at a smaller shape than the largest an earlier step of this learner ran: its rows,
        its completion block and row length (`Trajectories.trimmed_columns`) and its distinct rows per prompt block
        are each at least the largest before, padded with columns and rows that carry no loss. Each new shape is a
        new XLA program; with the floors, the programs stop growing once the largest shapes have appeared, at the
        cost of running later steps at those shapes (docs/decisions/033-steady-shapes.md). The update is the same.
    steady_prompt_tokens, steady_completion_tokens: with steady_shapes, the floors start at the largest shapes the
        run can need, so that its first optimizer step compiles the program every later step runs: every row of a
        mini-batch, every row of a prompt block, and the completion block and row length of a prompt of
        `steady_prompt_tokens` tokens and a completion of `steady_completion_tokens` (both 0: the floors start at
        the first step's own shapes). A longer prompt still runs, at a new, larger shape.
    lora: with a rank > 0, the learner adapts the model (`models.lora.apply_lora`) and trains, checkpoints and keeps
        optimizer state for the adapters alone; weight sync and saved models see the merged weights.
    """

    loss: LossConfig = LossConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    ppo_epochs: int = 1
    mini_batch_size: int | None = None
    micro_batch_size: int | None = None
    logprob_chunk_size: int = 256
    temperature: float = 1.0
    share_prompts: bool = True
    old_logprobs: OldLogprobs = "recompute"
    skip_zero_gradient_rows: bool = True
    run_duplicates_once: bool = True
    steady_shapes: bool = False
    steady_prompt_tokens: int = 0
    steady_completion_tokens: int = 0
    lora: LoRAConfig = LoRAConfig()

    def __post_init__(self) -> None:
        if self.old_logprobs not in get_args(OldLogprobs):
            raise ValueError(
                f"LearnerConfig.old_logprobs must be one of {get_args(OldLogprobs)}, got {self.old_logprobs!r}"
            )
        if self.old_logprobs == "sampler" and self.loss.mismatch_correction != "none":
            raise ValueError(
                "old_logprobs='sampler' makes the sampler the behaviour policy, so mismatch_correction "
                f"{self.loss.mismatch_correction!r} would correct nothing; use old_logprobs='recompute'"
            )
        if self.ppo_epochs < 1:
            raise ValueError(f"LearnerConfig.ppo_epochs must be >= 1, got {self.ppo_epochs}")
        for name in ("mini_batch_size", "micro_batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"LearnerConfig.{name} must be >= 1 or None, got {value}")
        if self.mini_batch_size and self.micro_batch_size and self.mini_batch_size % self.micro_batch_size:
            raise ValueError(
                f"mini_batch_size {self.mini_batch_size} is not a multiple of micro_batch_size {self.micro_batch_size}"
            )
        if self.logprob_chunk_size < 1:
            raise ValueError(f"LearnerConfig.logprob_chunk_size must be >= 1, got {self.logprob_chunk_size}")
        if self.temperature <= 0:
            raise ValueError(f"LearnerConfig.temperature must be > 0, got {self.temperature}")
        steady_lengths = (self.steady_prompt_tokens, self.steady_completion_tokens)
        if min(steady_lengths) < 0 or (max(steady_lengths) > 0 and (min(steady_lengths) == 0 or not self.steady_shapes)):
            raise ValueError(
                "steady_prompt_tokens and steady_completion_tokens are both > 0, with steady_shapes, or both 0; got "
                f"{steady_lengths} with steady_shapes={self.steady_shapes}"
            )


def optimizer_steps_per_update(rows: int, mini_batch_size: int | None, ppo_epochs: int) -> int:
    """Optimizer steps `Learner.update` takes on `rows` rows: one per mini-batch (the last may be shorter), per pass."""
    return ppo_epochs * -(-rows // (mini_batch_size or rows))


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _split_rows(tree, parts: int):
    """[parts * n, ...] -> [parts, n, ...] on every leaf."""
    return jax.tree.map(lambda x: x.reshape(parts, x.shape[0] // parts, *x.shape[1:]), tree)


# The jitted functions below take the model's graph definition and the config as static arguments, so every
# Learner with the same model structure and config shares one compiled program.


@struct.dataclass
class ModelRows:
    """What a step runs through the model: `[U, T]` rows, and for each of the step's `[B]` rows the index of the one
    whose values it takes, counted within its own micro-batch's slice of the U rows (`rl.row_selection.model_rows`).
    Every aligned block of `prompt_block` rows shares one prompt, which is encoded once (1: each row is run whole;
    `models.logprobs.completion_predictors`)."""

    tokens: jax.Array
    positions: jax.Array
    attention_mask: jax.Array
    source: jax.Array
    constraint_ids: jax.Array | None = None  # `Trajectories.constraint_ids` of these rows
    constraint_kinds: jax.Array | None = None
    prompt_block: int = struct.field(pytree_node=False, default=1)


def _forward(graphdef, params, other_state, rows: ModelRows, completion_start: int, config, token_positions=None):
    """Log-probs and entropies [B, T], one row for each entry of `rows.source`, and with `token_positions` (by name,
    [B] completion token indices, -1: none) the state that predicts that token in each row ([B, H], the model's
    dtype; a row without one takes the state before its first completion token) and the model itself, for the
    auxiliary terms (`rl.auxiliary.TermInputs`); None for what is not asked for. Columns before `completion_start`
    carry no loss: they are 0, and their vocabulary logits are never computed."""
    model = nnx.merge(graphdef, params, other_state)
    predicting = completion_predictors(
        model, rows.tokens, rows.positions, rows.attention_mask, completion_start, rows.prompt_block
    )
    constrained = rows.constraint_ids is not None
    values = token_logprobs(
        model,
        predicting,
        rows.tokens[:, completion_start:],
        temperature=config.temperature,
        chunk_size=config.logprob_chunk_size,
        return_entropy=True,
        entropy_gradient=config.loss.entropy_coef > 0,
        constraint_ids=rows.constraint_ids[:, completion_start:] if constrained else None,
        constraint_kinds=rows.constraint_kinds[:, completion_start:] if constrained else None,
    )
    logprobs, entropy = jax.tree.map(lambda x: jnp.pad(x[rows.source], ((0, 0), (completion_start, 0))), values)
    if token_positions is None:
        return logprobs, entropy, None, None
    states = {
        name: predicting[rows.source, jnp.maximum(positions, 0)] for name, positions in token_positions.items()
    }
    return logprobs, entropy, states, model


@functools.partial(jax.jit, static_argnames=("graphdef", "config", "completion_start", "num_micro_batches"))
def _batch_logprobs(graphdef, params, other_state, rows: ModelRows, *, completion_start, config, num_micro_batches):
    logprobs = jax.lax.map(
        lambda micro: _forward(graphdef, params, other_state, micro, completion_start, config)[0],
        _split_rows(rows, num_micro_batches),
    )
    return logprobs.reshape(rows.source.shape[0], -1)


def _apply_gradients(params, opt_state, grads, config, state_shardings):
    """The optimizer's step, its new state left where the old one was (`models.sharding.keep_shardings`)."""
    updates, opt_state = config.optimizer.make().update(grads, opt_state, params)
    return keep_shardings((optax.apply_updates(params, updates), opt_state), state_shardings)


@functools.partial(
    jax.jit, static_argnames=("graphdef", "config", "state_shardings"), donate_argnames=("params", "opt_state")
)
def _train_step(
    graphdef, params, other_state, opt_state, batch: Trajectories, model_rows: ModelRows, token_weights, ref_logprobs,
    on_policy, optimizer_step, *, config, state_shardings,
):
    """One optimizer step on a mini-batch, its gradient accumulated over micro-batches. `token_weights` are the
    aggregation weights of these rows within the whole mini-batch (`rl.losses.aggregation_weights`). `on_policy`
    (a traced bool, so that the first step of an update and the others share one program): the weights are those
    that sampled the batch, so the old log-probs are the current ones. `optimizer_step` (traced too) is the step the
    loss's schedules read."""
    num_tokens = jnp.maximum(batch.loss_mask.sum(), 1).astype(jnp.float32)
    num_micro_batches = batch.batch_size // (config.micro_batch_size or batch.batch_size)

    def micro_loss(params, micro: Trajectories, micro_rows: ModelRows, micro_weights, micro_ref):
        positions = {name: micro.token_positions[name] for name in config.loss.token_positions_read}
        logprobs, entropy, states, model = _forward(
            graphdef, params, other_state, micro_rows, micro.completion_start, config,
            positions if config.loss.auxiliary_terms else None,
        )
        old_logprobs = jnp.where(on_policy, jax.lax.stop_gradient(logprobs), micro.old_logprobs)
        term_inputs = None
        if config.loss.auxiliary_terms:
            term_inputs = TermInputs(
                model=model,
                temperature=config.temperature,
                states=states,
                positions=positions,
                row_labels={name: micro.row_labels[name] for name in config.loss.row_labels_read},
                loss_mask=micro.loss_mask,
                token_weights=micro_weights,
                num_micro_batches=num_micro_batches,
            )
        return grpo_loss(
            config.loss,
            logprobs=logprobs,
            entropy=entropy,
            old_logprobs=old_logprobs,
            sampler_logprobs=micro.sampler_logprobs,
            ref_logprobs=micro_ref,
            advantages=micro.advantages,
            loss_mask=micro.loss_mask,
            token_weights=micro_weights,
            num_tokens=num_tokens,
            term_inputs=term_inputs,
            step=optimizer_step,
        )

    def micro_gradient(micro):
        (_, metrics), grads = jax.value_and_grad(micro_loss, has_aux=True)(params, *micro)
        return grads, metrics

    if num_micro_batches == 1:
        # No one-step scan: XLA kept it as a while loop around the whole forward and backward pass.
        grads, metrics = micro_gradient((batch, model_rows, token_weights, ref_logprobs))
    else:
        def accumulate(grads, micro):
            micro_grads, metrics = micro_gradient(micro)
            return jax.tree.map(jnp.add, grads, micro_grads), metrics

        micro_batches = _split_rows((batch, model_rows, token_weights, ref_logprobs), num_micro_batches)
        zeros = jax.tree.map(jnp.zeros_like, params)
        grads, metrics = jax.lax.scan(accumulate, zeros, micro_batches)
        metrics = jax.tree.map(lambda x: x.sum(axis=0), metrics)
    metrics["grad_norm"] = optax.global_norm(grads)
    return *_apply_gradients(params, opt_state, grads, config, state_shardings), metrics


@functools.partial(jax.jit, static_argnames=("config", "state_shardings"), donate_argnames=("params", "opt_state"))
def _zero_gradient_step(params, opt_state, *, config, state_shardings):
    """The optimizer step of a mini-batch whose every row has a zero gradient."""
    return _apply_gradients(params, opt_state, jax.tree.map(jnp.zeros_like, params), config, state_shardings)


@dataclasses.dataclass
class _Step:
    """What one optimizer step runs: some rows of its mini-batch, trimmed and placed on the devices, and the rows of
    those the model runs."""

    batch: Trajectories
    model_rows: ModelRows
    token_weights: jax.Array
    real_rows: int  # of `batch`'s rows, those that are not padding
    ref_logprobs: jax.Array | None = None


class Learner:
    """Owns the live model (what weight sync reads), the optimizer state and the frozen reference (KL only).

    In a multi-process run (one JAX process per host, `jax.distributed`), the mesh spans every process's devices and
    every process calls `update` with the same global batch (`rl.loop` gathers the rows the processes sampled). The
    host-side planning (mini-batches, padding, the rows each step runs, their length bucket) needs the whole batch
    and is the same on every process, so the processes run the same programs on the same shapes.
    """

    def __init__(self, model: nnx.Module, config: LearnerConfig, *, mesh: Mesh | None = None):
        if jax.process_count() > 1 and (mesh is None or mesh.devices.size != jax.device_count()):
            raise ValueError(
                f"a learner in a run of {jax.process_count()} processes needs a mesh over all {jax.device_count()} "
                "devices"
            )
        self.model = model
        self.config = config
        self.mesh = mesh
        apply_lora(model, config.lora, rngs=nnx.Rngs(config.lora.seed))
        # With adapters only they train: the base weights ride in the frozen state beside the buffers.
        self._trainable = nnx.LoRAParam if adapted(model) else nnx.Param
        if mesh is not None:
            shard_model(model, mesh)
        self._graphdef, params, self._other_state = nnx.split(model, self._trainable, ...)
        self._learning_rate = config.optimizer.learning_rate_schedule()
        self.opt_state = config.optimizer.make().init(params)
        if mesh is not None:
            # State that follows no parameter (AdamW's step count) is replicated over the mesh, as the rest of the
            # state is placed by the parameters: a checkpoint restores every leaf where it finds it here.
            self.opt_state = replicate_off_mesh(self.opt_state, mesh)
        # Where the parameters and optimizer state live on the mesh; every step returns them there.
        self._state_shardings = shardings_of((params, self.opt_state))
        # The reference is a frozen copy of the starting weights, and exists only when the KL term is on.
        self.reference_params = jax.tree.map(jnp.copy, params) if config.loss.kl_coef else None
        self.step = 0  # completed `update` calls
        self.optimizer_step = 0
        # The largest shapes a step has run (`LearnerConfig.steady_shapes`): rows, completion block, row length and
        # distinct rows per prompt block.
        self._shape_floors = {"rows": 0, "width": 0, "length": 0, "distinct": 1}
        # The zero-gradient step's program is compiled now: its input shapes never change, and the first mini-batch
        # without a gradient can come at any iteration, where it would compile mid-run.
        _zero_gradient_step.lower(
            self.params, self.opt_state, config=config, state_shardings=self._state_shardings
        ).compile()

    @property
    def params(self) -> nnx.State:
        """What the optimizer moves: every parameter, or the LoRA adapters alone."""
        return nnx.state(self.model, self._trainable)

    def load_state(self, *, params, opt_state, reference_params, step: int, optimizer_step: int) -> None:
        """Replaces the whole training state (what `rl.checkpoint` restores)."""
        if (reference_params is None) != (self.reference_params is None):
            raise ValueError("the checkpoint and this learner disagree on whether a KL reference model exists")
        nnx.update(self.model, params)
        self.opt_state = opt_state
        self.reference_params = reference_params
        self.step = step
        self.optimizer_step = optimizer_step

    def _place(self, tree):
        """Host arrays onto the devices, rows split over `fsdp`. Every process holds the same rows (see the class
        docstring) and hands them all over: `jax.make_array_from_process_local_data`, each of its devices taking its
        own slice."""
        if self.mesh is None:
            return jax.tree.map(jnp.asarray, tree)
        sharding = batch_sharding(self.mesh)
        return jax.tree.map(
            lambda array: jax.make_array_from_process_local_data(sharding, np.asarray(array), np.shape(array)), tree
        )

    @property
    def _data_parallel(self) -> int:
        return 1 if self.mesh is None else self.mesh.shape["fsdp"]

    def _rows_per_pass(self, rows: int) -> int:
        """Rows per forward/backward pass over `rows` rows of one mini-batch (a micro-batch, or all of them)."""
        per_pass = self.config.micro_batch_size or rows
        if rows % per_pass:
            raise ValueError(f"{rows} rows do not split into micro-batches of {per_pass}")
        return per_pass

    def _mini_batches(self, batch: Trajectories) -> list[tuple[Trajectories, int]]:
        """The mini-batches of `batch` in order, each with its number of real rows, padded to one row count:
        `mini_batch_size` (the whole batch without one, or when the batch is smaller) rounded up to a multiple of
        the micro-batch and of the data-parallel devices (`LearnerConfig.micro_batch_size`)."""
        rows = batch.batch_size
        step_rows = min(self.config.mini_batch_size or rows, rows)
        padded_rows = _round_up(step_rows, math.lcm(self.config.micro_batch_size or 1, self._data_parallel))
        parts = [batch.rows(slice(start, start + step_rows)) for start in range(0, rows, step_rows)]
        return [(part.padded(padded_rows), part.batch_size) for part in parts]

    def _prompt_block(self, batch: Trajectories) -> int:
        if not self.config.share_prompts:
            return 1
        return batch.prompt_block_size(self._rows_per_pass(batch.batch_size))

    def _rows_to_run(self, mini_batch: Trajectories, *, first_step: bool) -> np.ndarray:
        """Indices of the mini-batch rows a step runs (`rl.row_selection.rows_to_run`), all without
        `skip_zero_gradient_rows`."""
        if not self.config.skip_zero_gradient_rows:
            return np.arange(mini_batch.batch_size)
        return row_selection.rows_to_run(
            row_selection.zero_gradient_rows(mini_batch, self.config.loss, self.optimizer_step),
            math.lcm(self._prompt_block(mini_batch), self._data_parallel),
            self.config.micro_batch_size,
            first_step=first_step,
            at_least=self._shape_floors["rows"],
        )

    def _raise_floors(self, **shape: int) -> None:
        if self.config.steady_shapes:
            self._shape_floors.update({name: max(self._shape_floors[name], value) for name, value in shape.items()})

    def _start_floors(self, mini_batch: Trajectories) -> None:
        """Raises the floors to the largest shapes a step can need (`LearnerConfig.steady_prompt_tokens`)."""
        rows_per_pass, prompt_block = self._rows_per_pass(mini_batch.batch_size), self._prompt_block(mini_batch)
        width = bucket_length(self.config.steady_completion_tokens, mini_batch.completion_buckets)
        self._raise_floors(
            rows=mini_batch.batch_size,
            distinct=prompt_block if prompt_block > 1 else rows_per_pass,
            width=width,
            length=bucket_length(self.config.steady_prompt_tokens + width, mini_batch.length_buckets),
        )

    def _model_rows(self, batch: Trajectories) -> ModelRows:
        """The rows of `batch` the model runs (`rl.row_selection.model_rows`), placed on the devices."""
        rows_per_pass, batch_prompt_block = self._rows_per_pass(batch.batch_size), self._prompt_block(batch)
        run, source, prompt_block = row_selection.model_rows(
            batch, rows_per_pass, batch_prompt_block, self._data_parallel,
            run_duplicates_once=self.config.run_duplicates_once, at_least=self._shape_floors["distinct"],
        )
        block = batch_prompt_block if batch_prompt_block > 1 else rows_per_pass
        self._raise_floors(distinct=run.size * block // batch.batch_size)
        columns = (batch.tokens, batch.positions, batch.attention_mask)
        tokens, positions, attention_mask = (np.asarray(array)[run] for array in columns)
        constraints = {}
        if batch.constraint_ids is not None:
            constraints = {"constraint_ids": np.asarray(batch.constraint_ids)[run],
                           "constraint_kinds": np.asarray(batch.constraint_kinds)[run]}
        return self._place(ModelRows(tokens, positions, attention_mask, source.astype(np.int32),
                                     prompt_block=prompt_block, **constraints))

    def _step(self, mini_batch: Trajectories, real_rows: int, *, first_step: bool) -> _Step | None:
        """The rows of `mini_batch` (its first `real_rows` real, the rest padding) its optimizer step runs (None:
        none, its gradient is zero), with their weights in the whole mini-batch's aggregation, each trimmed to its
        own length bucket and placed on the devices."""
        run = self._rows_to_run(mini_batch, first_step=first_step)
        if not len(run):
            return None
        token_weights = aggregation_weights(np.asarray(mini_batch.loss_mask), self.config.loss)[run]
        # Trimming drops only columns that are padding in every row, where every weight is 0.
        rows = mini_batch.rows(run)
        start, stop = rows.trimmed_columns(self._shape_floors["width"], self._shape_floors["length"])
        batch = rows.columns(start, stop)
        token_weights = take_columns(token_weights, start, stop)
        self._raise_floors(rows=run.size, width=batch.length - batch.completion_start, length=batch.length)
        return _Step(
            self._place(batch), self._model_rows(batch), self._place(token_weights), int((run < real_rows).sum())
        )

    def logprobs(self, batch: Trajectories) -> jax.Array:
        """log_softmax(logits / temperature) of each token from `batch.completion_start` on under the current
        weights, [B, T] float32 (earlier columns, prompt only, are 0). Runs in the passes an update would."""
        return jnp.concatenate([
            self._logprobs(self.params, self._model_rows(mini_batch), mini_batch.completion_start)[:real_rows]
            for mini_batch, real_rows in self._mini_batches(batch)
        ])

    def _logprobs(self, params, rows: ModelRows, completion_start: int) -> jax.Array:
        return _batch_logprobs(
            self._graphdef, params, self._other_state, rows, completion_start=completion_start, config=self.config,
            num_micro_batches=rows.source.shape[0] // self._rows_per_pass(rows.source.shape[0]),
        )

    def update(self, batch: Trajectories, *, sampled_by_current_weights: bool = True) -> dict[str, float]:
        """Optimise on `batch`; returns metrics averaged over this update's optimizer steps.

        `sampled_by_current_weights=False`: some rows were sampled under earlier weights (`LoopConfig.max_staleness`).
        With `old_logprobs="sampler"` the first step then takes the sampler's log-probs as the old ones too, so the
        sampler is the behaviour policy of every step; with "recompute" nothing changes (the first step's own
        log-probs are those of the weights the update starts from, what the later steps recompute)."""
        loss = self.config.loss
        missing = [
            f"token position {name!r}" for name in loss.token_positions_read if name not in batch.token_positions
        ]
        missing += [f"row label {name!r}" for name in loss.row_labels_read if name not in batch.row_labels]
        if missing:
            raise ValueError(
                f"the loss's auxiliary terms read {', '.join(missing)}, which the batch does not carry "
                "(Trajectories.token_positions, row_labels)"
            )
        rows = batch.batch_size
        mini_batches = self._mini_batches(batch)
        if self.config.steady_completion_tokens and self._shape_floors["rows"] == 0:  # no step has run here yet
            self._start_floors(mini_batches[0][0])
        # Each step is padded only as far as its own longest prompt: one long question no longer makes every
        # optimizer step of the update run at its length.
        steps = [
            self._step(mini_batch, real_rows, first_step=index == 0)
            for index, (mini_batch, real_rows) in enumerate(mini_batches)
        ]
        # The update's first step runs at the sampling weights and takes its own log-probs as the old ones.
        for index, step in enumerate(steps):
            if step is None:
                continue
            if self.config.old_logprobs == "recompute" and (index > 0 or self.config.ppo_epochs > 1):
                old_logprobs = self._logprobs(self.params, step.model_rows, step.batch.completion_start)
                step.batch = step.batch.replace(old_logprobs=old_logprobs)
            if self.reference_params is not None:
                step.ref_logprobs = self._logprobs(self.reference_params, step.model_rows, step.batch.completion_start)
        first_on_policy = sampled_by_current_weights or self.config.old_logprobs == "recompute"
        params, opt_state = self.params, self.opt_state
        step_metrics, learning_rates = [], []
        for epoch in range(self.config.ppo_epochs):
            for index, step in enumerate(steps):
                learning_rates.append(float(self._learning_rate(self.optimizer_step)))
                # params and opt_state are donated: XLA updates their buffers in place.
                if step is None:
                    params, opt_state = _zero_gradient_step(
                        params, opt_state, config=self.config, state_shardings=self._state_shardings
                    )
                    metrics = None
                else:
                    params, opt_state, metrics = _train_step(
                        self._graphdef, params, self._other_state, opt_state, step.batch, step.model_rows,
                        step.token_weights, step.ref_logprobs, np.bool_(epoch == 0 and index == 0 and first_on_policy),
                        np.int32(self.optimizer_step), config=self.config, state_shardings=self._state_shardings,
                    )
                nnx.update(self.model, params)
                self.opt_state = opt_state
                self.optimizer_step += 1
                step_metrics.append(metrics)
        self.step += 1
        step_metrics = jax.device_get(step_metrics)
        # A step that ran nothing had a zero loss and gradient; its token means are unmeasured, so they average
        # over the steps that ran.
        zero_sums = {name: 0.0 for name in step_metrics[0] if name.startswith("loss") or name == "grad_norm"}
        step_metrics = [zero_sums if metrics is None else metrics for metrics in step_metrics]
        averaged = {
            name: float(np.mean([m[name] for m in step_metrics if name in m])) for name in step_metrics[0]
        }
        if self.config.old_logprobs == "sampler":
            # Later steps compare the sampler with itself; only the first step measures the learner against it.
            averaged |= {name: float(value) for name, value in step_metrics[0].items() if name.startswith("mismatch/")}
        rows_run = sum(0 if step is None else step.real_rows for step in steps)
        model_rows = sum(0 if step is None else step.model_rows.tokens.shape[0] for step in steps)
        padding_rows = sum(mini_batch.batch_size - real_rows for mini_batch, real_rows in mini_batches)
        first_step = self.optimizer_step - len(step_metrics)
        for term in self.config.loss.auxiliary_terms:
            averaged[f"{term.name}_coef"] = float(np.mean([
                term.coef_at(step) for step in range(first_step, self.optimizer_step)
            ]))
        return averaged | {
            "lr": float(np.mean(learning_rates)),
            "optimizer_steps": float(len(step_metrics)),
            "skipped_rows": 1.0 - rows_run / rows,
            "model_rows": model_rows / rows,
            "padding_rows": padding_rows / rows,
            "step_columns": float(np.mean([step.batch.length for step in steps if step is not None] or [0])),
        }
