"""The learner's batch: sampled completions as padded [batch, time] arrays, built from the generator's token ids.

Row layout: a completion block of bucketed width at the right, the prompt left-padded up to it:

    [pad pad p0 p1 p2 | c0 c1 c2 pad ... pad]
                      ^ completion_start = length - completion block width

Real tokens are contiguous, so positions are simply 0, 1, 2, ... from the first real token. Every per-token array
is aligned with `tokens`: `sampler_logprobs[b, t]` is the sampler's log-probability of `tokens[b, t]`.
The completion block's width comes from `completion_buckets` and the row length from `length_buckets`, so the set of
shapes (and of the static `completion_start`) stays small and jit compiles a handful of programs, not one per step.
A batch remembers its buckets, so a subset of its rows (a mini-batch) can drop the padding only a longer row
elsewhere in the batch needed, prompt columns on the left and completion columns on the right (`trimmed_columns`),
and still land on one of the same shapes.
No column before `completion_start` carries a loss, so the learner computes vocabulary logits only from there on:
with Conductor prompts of hundreds of tokens and completions of tens, that is most of the LM-head work saved.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from flax import struct

from models.logprobs import ALL_BUT, ONLY

DEFAULT_LENGTH_BUCKETS = (128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
DEFAULT_COMPLETION_BUCKETS = tuple(2**k for k in range(14))  # 1 .. 8192


@struct.dataclass
class Trajectories:
    """A pytree of arrays; per-token arrays are [batch, time], `group_ids` is [batch] (one prompt id per row).

    `old_logprobs` holds the learner's log-probs at sampling time; `build` fills it with the sampler's, and
    `Learner.update` replaces it with its own before optimising. `row_labels` (an int32 [batch] array by name, -1:
    none) and `token_positions` (an int32 [batch] array by name: a completion token index, -1: none) carry what the
    loss's auxiliary terms read (`rl.auxiliary`); padding rows carry -1 in every one. A batch sampled under token
    masks carries each token's constraint, which the learner's log-probs apply (`models.logprobs.token_logprobs`):
    `constraint_ids` int32 [batch, time, K] (-1: padding) and `constraint_kinds` int8 [batch, time]
    (`models.logprobs.UNCONSTRAINED`, `ONLY`, `ALL_BUT`); None for a batch sampled without.
    """

    tokens: jax.Array  # int32
    positions: jax.Array  # int32
    attention_mask: jax.Array  # bool: real (non-padding) tokens
    loss_mask: jax.Array  # bool: completion tokens that train
    old_logprobs: jax.Array  # float32
    sampler_logprobs: jax.Array  # float32
    advantages: jax.Array  # float32, the sequence's advantage on each of its tokens
    group_ids: jax.Array  # int32 [batch]
    row_labels: dict[str, jax.Array] = dataclasses.field(default_factory=dict)  # int32 [batch] each
    token_positions: dict[str, jax.Array] = dataclasses.field(default_factory=dict)  # int32 [batch] each
    constraint_ids: jax.Array | None = None
    constraint_kinds: jax.Array | None = None
    completion_start: int = struct.field(pytree_node=False, default=1)  # first column that may carry a loss
    length_buckets: tuple[int, ...] = struct.field(pytree_node=False, default=DEFAULT_LENGTH_BUCKETS)
    completion_buckets: tuple[int, ...] = struct.field(pytree_node=False, default=DEFAULT_COMPLETION_BUCKETS)

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def length(self) -> int:
        return self.tokens.shape[1]

    def rows(self, index) -> "Trajectories":
        """The sub-batch of the given rows (a slice or an index array)."""
        return jax.tree.map(lambda array: array[index], self)

    def padded(self, rows: int) -> "Trajectories":
        """These rows followed by copies of the last one with an empty loss mask and a zero advantage, `rows` in all.
        A row without loss tokens counts in no aggregation denominator or token mean and has no gradient, so the
        copies change no loss, gradient or metric; being copies, they keep the last prompt block whole and run once
        where duplicates do (`rl.row_selection.distinct_rows`)."""
        extra = rows - self.batch_size
        if extra < 0:
            raise ValueError(f"cannot pad {self.batch_size} rows to {rows}")
        if extra == 0:
            return self
        copies = self.rows(np.full(extra, self.batch_size - 1))
        copies = copies.replace(
            loss_mask=np.zeros_like(copies.loss_mask),
            advantages=np.zeros_like(copies.advantages),
            row_labels={name: np.full_like(values, -1) for name, values in copies.row_labels.items()},
            token_positions={name: np.full_like(values, -1) for name, values in copies.token_positions.items()},
        )
        return jax.tree.map(lambda mine, theirs: np.concatenate([mine, theirs]), self, copies)

    def scaled_token_advantages(
        self, token_indices: Sequence[Sequence[int]], factors: Sequence[Sequence[float]]
    ) -> "Trajectories":
        """These rows with the advantage on completion token `token_indices[i][k]` of row i (0: its first
        completion token) multiplied by `factors[i][k]`; every other token keeps its sequence's advantage. Runs on
        the host."""
        if len(token_indices) != self.batch_size or len(factors) != self.batch_size:
            raise ValueError(
                f"{len(token_indices)} rows of token indices and {len(factors)} of factors for {self.batch_size} rows"
            )
        advantages = np.array(self.advantages, dtype=np.float32)
        loss_mask = np.asarray(self.loss_mask)
        for row, (indices, row_factors) in enumerate(zip(token_indices, factors)):
            if len(indices) != len(row_factors):
                raise ValueError(f"row {row}: {len(indices)} token indices but {len(row_factors)} factors")
            for index, factor in zip(indices, row_factors):
                column = self.completion_start + int(index)
                if not (0 <= index and column < self.length and loss_mask[row, column]):
                    raise ValueError(f"row {row}: token {index} is not one of its completion's tokens")
                advantages[row, column] *= factor
        return self.replace(advantages=advantages)

    def trimmed_columns(self, min_width: int = 0, min_length: int = 0) -> tuple[int, int]:
        """The columns [start, stop) these rows need: a completion block of the smallest completion bucket that holds
        their longest completion (at least `min_width` columns), after their longest prompt, in the smallest length
        bucket that holds both (at least `min_length`). A negative `start` asks for that many columns of padding
        before column 0, a `stop` past `length` for columns of padding after the last: a narrower completion block
        can land on a length bucket wider than the columns it keeps, and a floor can ask for more than the rows have.
        Runs on the host (the shape is static)."""
        attention_mask = np.asarray(self.attention_mask)
        first_real = attention_mask[:, : self.completion_start].argmax(axis=1)
        longest_prompt = self.completion_start - int(first_real.min())
        longest_completion = int(attention_mask[:, self.completion_start :].sum(axis=1).max())
        # A block built outside `build` may be narrower than any bucket that holds its completions: it stays whole.
        width = min(bucket_length(longest_completion, self.completion_buckets), self.length - self.completion_start)
        stop = self.completion_start + max(width, min_width)
        length = bucket_length(max(longest_prompt + stop - self.completion_start, min_length), self.length_buckets)
        return stop - length, stop

    def columns(self, start: int, stop: int) -> "Trajectories":
        """These rows' columns [start, stop) (`take_columns`), `completion_start` moved with them. With
        `trimmed_columns`, the rows in the smallest shape that holds them: the columns dropped at either end are
        padding in every row, which no row attends to and none carries a loss on."""
        if (start, stop) == (0, self.length):
            return self
        if not start <= self.completion_start < stop:
            raise ValueError(
                f"columns [{start}, {stop}) of {self.length} do not hold the completion block's start "
                f"{self.completion_start}"
            )
        # Every [batch, time, ...] array takes the same columns; the [batch] arrays are untouched.
        taken = jax.tree.map(lambda array: take_columns(array, start, stop) if array.ndim >= 2 else array, self)
        return taken.replace(completion_start=self.completion_start - start)

    def prompt_block_size(self, rows_per_pass: int) -> int:
        """The largest number of consecutive rows, dividing `rows_per_pass`, such that every aligned block of that
        many rows has one prompt (the same tokens and padding before `completion_start`). A GRPO group's
        completions are consecutive rows, so this is usually the group size, and the learner encodes each block's
        prompt once (`LearnerConfig.share_prompts`). Runs on the host."""
        if rows_per_pass < 1 or self.batch_size % rows_per_pass:
            raise ValueError(f"{self.batch_size} rows do not split into passes of {rows_per_pass}")
        prompt = slice(0, self.completion_start)
        prompt_columns = np.concatenate(
            [np.asarray(self.tokens)[:, prompt], np.asarray(self.attention_mask)[:, prompt]], axis=1
        )
        for block in range(rows_per_pass, 1, -1):
            if rows_per_pass % block:
                continue
            blocks = prompt_columns.reshape(self.batch_size // block, block, -1)
            if np.array_equal(blocks, np.broadcast_to(blocks[:, :1], blocks.shape)):
                return block
        return 1


def take_columns(array, start: int, stop: int) -> np.ndarray:
    """Columns [start, stop) of a [batch, time, ...] array; a negative `start` puts that many columns of zeros
    (padding: no attention, no loss, a token id never read, no constraint) before column 0, a `stop` past the last
    column that many after it."""
    array = np.asarray(array)
    taken = array[:, max(start, 0) : stop]
    widths = ((0, 0), (max(-start, 0), max(stop - array.shape[1], 0))) + ((0, 0),) * (array.ndim - 2)
    return np.pad(taken, widths)


def bucket_length(length: int, length_buckets: Sequence[int]) -> int:
    """The smallest bucket that holds `length` tokens."""
    for bucket in sorted(length_buckets):
        if bucket >= length:
            return bucket
    raise ValueError(
        f"a sequence of {length} tokens is longer than the largest length bucket {max(length_buckets)}; "
        "add a larger bucket (prompt length + max_new_tokens)"
    )


def build(
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    sampler_logprobs: Sequence[Sequence[float]],
    advantages,
    group_ids,
    *,
    pad_id: int,
    length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
    completion_buckets: Sequence[int] = DEFAULT_COMPLETION_BUCKETS,
    row_labels: Mapping[str, Sequence[int]] | None = None,
    token_positions: Mapping[str, Sequence[int]] | None = None,
    token_constraints: Sequence[Sequence[Any]] | None = None,
) -> Trajectories:
    """Pad generator output into a `Trajectories` batch (numpy on the host; jit moves it to devices).

    prompt_ids[i], completion_ids[i] and sampler_logprobs[i] are row i's token ids and per-completion-token
    log-probs exactly as the generator produced them; advantages[i] and group_ids[i] are per row. `row_labels` are
    ints per row by name (-1: none); `token_positions` per row by name the index of one of its completion tokens
    (-1: none). `token_constraints[i]`, when given, are the constraints row i's completion tokens were sampled under
    (each None or a `rollout.types.TokenConstraint`: `token_ids` and `only`; an empty row: none); their id lists are
    padded to a power of two, at least `MIN_CONSTRAINT_WIDTH`, so the learner sees few shapes.
    """
    batch = len(prompt_ids)
    if batch == 0:
        raise ValueError("cannot build an empty batch")
    advantages = np.asarray(advantages, dtype=np.float32)
    group_ids = np.asarray(group_ids, dtype=np.int32)
    for name, values in (("completion_ids", completion_ids), ("sampler_logprobs", sampler_logprobs)):
        if len(values) != batch:
            raise ValueError(f"{batch} prompts but {len(values)} {name}")
    for name, values in (("advantages", advantages), ("group_ids", group_ids)):
        if values.shape != (batch,):
            raise ValueError(f"{name} must have shape ({batch},), got {values.shape}")
    if not np.all(np.isfinite(advantages)):
        raise ValueError("advantages must be finite")
    completion_lengths = np.array([len(c) for c in completion_ids])
    labels = {}
    for name, values in (row_labels or {}).items():
        labels[name] = np.asarray(values, dtype=np.int32)
        if labels[name].shape != (batch,):
            raise ValueError(f"row label {name!r} must have shape ({batch},), got {labels[name].shape}")
        if (labels[name] < -1).any():
            raise ValueError(f"row label {name!r}: labels are >= 0, or -1 for none; got {sorted(set(values))}")
    marked = {}
    for name, values in (token_positions or {}).items():
        marked[name] = np.asarray(values, dtype=np.int32)
        if marked[name].shape != (batch,):
            raise ValueError(f"token position {name!r} must have shape ({batch},), got {marked[name].shape}")
        outside = (marked[name] < -1) | (marked[name] >= completion_lengths)
        if outside.any():
            row = int(np.flatnonzero(outside)[0])
            raise ValueError(
                f"row {row}: token position {name!r} {marked[name][row]} is outside its "
                f"{completion_lengths[row]}-token completion (-1: none)"
            )
    if token_constraints is not None:
        if len(token_constraints) != batch:
            raise ValueError(f"{batch} prompts but {len(token_constraints)} rows of token constraints")
        for row, (completion, constraints) in enumerate(zip(completion_ids, token_constraints)):
            if constraints and len(constraints) != len(completion):
                raise ValueError(f"row {row}: {len(completion)} completion tokens but {len(constraints)} constraints")
    for row, (prompt, completion, logprobs) in enumerate(zip(prompt_ids, completion_ids, sampler_logprobs)):
        if not prompt:
            raise ValueError(f"row {row}: empty prompt (the first completion token needs a token to predict it)")
        if len(completion) != len(logprobs):
            raise ValueError(f"row {row}: {len(completion)} completion tokens but {len(logprobs)} log-probs")

    completion_width = bucket_length(max(len(c) for c in completion_ids), completion_buckets)
    length = bucket_length(max(len(p) for p in prompt_ids) + completion_width, length_buckets)
    prompt_width = length - completion_width

    tokens = np.full((batch, length), pad_id, dtype=np.int32)
    positions = np.zeros((batch, length), dtype=np.int32)
    attention_mask = np.zeros((batch, length), dtype=bool)
    loss_mask = np.zeros((batch, length), dtype=bool)
    logprobs = np.zeros((batch, length), dtype=np.float32)
    for row, (prompt, completion, row_logprobs) in enumerate(zip(prompt_ids, completion_ids, sampler_logprobs)):
        start = prompt_width - len(prompt)
        end = prompt_width + len(completion)
        tokens[row, start:prompt_width] = prompt
        tokens[row, prompt_width:end] = completion
        positions[row, start:end] = np.arange(end - start)
        attention_mask[row, start:end] = True
        loss_mask[row, prompt_width:end] = True
        logprobs[row, prompt_width:end] = row_logprobs
    constraint_ids = constraint_kinds = None
    if token_constraints is not None:
        constraint_ids, constraint_kinds = _constraint_arrays(token_constraints, prompt_width, length)
    return Trajectories(
        tokens=tokens,
        positions=positions,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        old_logprobs=logprobs.copy(),
        sampler_logprobs=logprobs,
        advantages=np.where(loss_mask, advantages[:, None], 0.0).astype(np.float32),
        group_ids=group_ids,
        row_labels=labels,
        token_positions=marked,
        constraint_ids=constraint_ids,
        constraint_kinds=constraint_kinds,
        completion_start=prompt_width,
        length_buckets=tuple(sorted(length_buckets)),
        completion_buckets=tuple(sorted(completion_buckets)),
    )


MIN_CONSTRAINT_WIDTH = 16


def _constraint_arrays(
    token_constraints: Sequence[Sequence[Any]], completion_start: int, length: int
) -> tuple[np.ndarray, np.ndarray]:
    """The [batch, length, K] ids (-1: padding) and [batch, length] kinds of each completion token's constraint."""
    listed = max((len(c.token_ids) for row in token_constraints for c in row if c is not None), default=1)
    width = max(MIN_CONSTRAINT_WIDTH, 1 << (listed - 1).bit_length())
    ids = np.full((len(token_constraints), length, width), -1, dtype=np.int32)
    kinds = np.zeros((len(token_constraints), length), dtype=np.int8)
    for row, constraints in enumerate(token_constraints):
        for index, constraint in enumerate(constraints):
            if constraint is None:
                continue
            column = completion_start + index
            kinds[row, column] = ONLY if constraint.only else ALL_BUT
            ids[row, column, : len(constraint.token_ids)] = constraint.token_ids
    return ids, kinds
