"""Auxiliary loss terms: scalars added to the policy loss, each with its coefficient, registered by name.

A term is a function `(TermInputs, **options) -> (value, metrics)`: `value` a scalar the loss adds as
`coef_t * value` (logged as `loss/<name>`), `metrics` scalars logged beside the loss's. Its keyword-only parameters are
its options, checked as an estimator's are (`rl.options`). Its `TermSpec` declares what of the batch it reads beyond
the loss's own arrays: named token positions (`Trajectories.token_positions`, one completion token per row; the term
gets the final hidden state that predicts that token) and named row labels (`Trajectories.row_labels`, an int per
row). A row that has every position and label a term declares (none is -1) is read by it, so the learner runs it
even when its advantage is zero (`rl.row_selection.zero_gradient_rows`).

The coefficient may fall linearly to zero: coef_t = coef * clip(1 - t / decay_steps, 0, 1) at optimizer step t
(`TermConfig.coef_at`; decay_steps 0 keeps it constant). rl registers no term of its own; a package above it adds
one line to `AUXILIARY_TERMS` (docs/extending.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from rl import options as option_checks


@dataclasses.dataclass(frozen=True)
class TermInputs:
    """What a term sees of one micro-batch, inside the jitted, differentiated loss.

    model: the policy at the step's parameters (an `nnx.Module`); a term's value differentiates through it.
    temperature: the sampling temperature the policy's log-probs use.
    states: for each token position the term declares, [B, H] the final hidden state (the model's dtype) that
        predicts row b's token there; a row without the position holds the state before its first completion token.
    positions: for each token position the term declares, [B] the completion token index (-1: the row has none).
    row_labels: for each row label the term declares, [B] int32 (-1: none).
    loss_mask, token_weights: [B, T]; the weights are the aggregation's over the whole mini-batch
        (`rl.losses.aggregation_weights`), so sum_b sum_t token_weights[b, t] = 1 over the mini-batch's micro-batches.
    num_micro_batches: the mini-batch's; a per-micro-batch statistic divided by it sums to its mean.
    """

    model: Any
    temperature: float
    states: Mapping[str, jax.Array]
    positions: Mapping[str, jax.Array]
    row_labels: Mapping[str, jax.Array]
    loss_mask: jax.Array
    token_weights: jax.Array
    num_micro_batches: int


TermFunction = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]


@dataclasses.dataclass(frozen=True)
class TermSpec:
    """A registered term: its function, the token positions and row labels it reads (by name), and `check`, called
    with its options when a `TermConfig` is built, for what their annotations cannot say (ranges, say)."""

    function: TermFunction
    token_positions: tuple[str, ...] = ()
    row_labels: tuple[str, ...] = ()
    check: Callable[..., None] | None = None


# Filled by the packages that define terms (e.g. `conductor.losses`); rl defines none of its own.
AUXILIARY_TERMS: dict[str, TermSpec] = {}


@dataclasses.dataclass(frozen=True)
class TermConfig:
    """One auxiliary term of a loss: a name in `AUXILIARY_TERMS`, its coefficient (> 0), the optimizer steps over
    which that falls linearly to zero (0: constant) and its options. The options are kept as sorted (name, value)
    pairs, so the config hashes (it is a static argument of the jitted update); pass a mapping."""

    name: str
    coef: float
    decay_steps: int = 0
    options: Any = ()

    def __post_init__(self) -> None:
        if self.name not in AUXILIARY_TERMS:
            raise ValueError(f"unknown auxiliary loss term {self.name!r}; known: {sorted(AUXILIARY_TERMS)}")
        if not self.coef > 0.0:
            raise ValueError(f"auxiliary loss term {self.name!r}: coef must be > 0, got {self.coef}")
        if self.decay_steps < 0:
            raise ValueError(f"auxiliary loss term {self.name!r}: decay_steps must be >= 0, got {self.decay_steps}")
        values = dict(self.options)
        option_checks.check_options("auxiliary loss term", self.name, self.spec.function, values)
        if self.spec.check is not None:
            self.spec.check(**values)
        object.__setattr__(self, "options", tuple(sorted(values.items())))

    @property
    def spec(self) -> TermSpec:
        return AUXILIARY_TERMS[self.name]

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.options)

    def coef_at(self, step: int | jax.Array) -> float | jax.Array:
        """The coefficient at optimizer step `step`: a float for a host int (the learner's log, without a device op
        per step), a traced array for the traced step of a jitted update."""
        if not self.decay_steps:
            return self.coef
        remaining = 1.0 - step / self.decay_steps
        if isinstance(step, jax.Array):
            return self.coef * jnp.clip(remaining, 0.0, 1.0)
        return self.coef * min(max(remaining, 0.0), 1.0)

    def is_on_at(self, step: int) -> bool:
        """Whether the term weighs anything at optimizer step `step` (a host int) or after it: a decayed term never
        does again."""
        return self.coef_at(step) > 0.0
