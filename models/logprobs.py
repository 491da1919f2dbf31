"""Per-token log-probabilities without materialising `[batch, time, vocab]` logits.

The sequence is cut into chunks; each chunk's logits are computed, reduced to one log-prob (and entropy) per
token, and dropped. With several chunks the chunk function is rematerialised, so the backward pass recomputes one
chunk's logits at a time too. With Qwen's 152k vocabulary this is the difference between megabytes and tens of
gigabytes. A single chunk is not rematerialised: its logits are all there is, so recomputing them would only add a
vocabulary matmul to the backward pass without lowering the peak.

Each chunk's logits are laid out `[vocab, tokens]` (`Transformer.vocab_major_logits`), so log-softmax and entropy
reduce over the leading axis. XLA:CPU vectorises a reduction across its input's minor axis and runs one along it as
a scalar loop on one thread, so a trailing vocabulary axis would make the log-prob head several times slower on a CPU
(measurements: docs/decisions/003-vocabulary-major-log-probs.md).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from models.transformer import Transformer

DEFAULT_CHUNK_SIZE = 256
# What a position's constraint ids mean (`token_logprobs`): none, the only tokens allowed, the tokens not allowed.
UNCONSTRAINED, ONLY, ALL_BUT = 0, 1, 2


def _vocab_major_entropy(logits: jax.Array, log_normaliser: jax.Array) -> jax.Array:
    """Entropy of each column of [vocab, tokens] logits, given their logsumexp over the vocabulary."""
    return log_normaliser - jnp.sum(jnp.exp(logits - log_normaliser) * logits, axis=0)


def state_entropy(
    model: Transformer, states: jax.Array, *, temperature: float = 1.0, token_ids: Sequence[int] | None = None
) -> jax.Array:
    """Entropy of the tempered next-token distribution that each of `states` ([B, hidden], final hidden states)
    predicts, float32 [B], differentiable: a term on a few chosen positions takes its gradient from here, without the
    vocabulary-wide backward pass at every position that `token_logprobs(entropy_gradient=True)` runs. With
    `token_ids`, the entropy of that distribution restricted to those tokens and renormalised."""
    logits = model.vocab_major_logits(states / temperature).astype(jnp.float32)
    if token_ids is not None:
        logits = logits[jnp.asarray(token_ids)]
    return _vocab_major_entropy(logits, jax.nn.logsumexp(logits, axis=0))


def token_logprobs(
    model: Transformer,
    hidden: jax.Array,
    targets: jax.Array,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    return_entropy: bool = False,
    entropy_gradient: bool = True,
    constraint_ids: jax.Array | None = None,
    constraint_kinds: jax.Array | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """`log_softmax(logits / temperature)[b, t, targets[b, t]]` as float32 `[B, T]`.

    Hidden at position t predicts the token at t + 1: callers pass `targets` already shifted. With
    `return_entropy`, also returns the entropy of the same tempered distribution at each position; with
    `entropy_gradient=False` that entropy is a constant to autodiff (a logged metric), so no backward pass runs
    through its vocabulary-wide terms.

    With `constraint_ids` (int32 `[B, T, K]`, -1: padding) and `constraint_kinds` (`[B, T]`: `UNCONSTRAINED`, `ONLY`,
    `ALL_BUT`), a constrained position's log-prob is that of the distribution renormalised over its allowed tokens,
    as a masked sampler drew it (`rollout.sampling.constrain_logprobs`):

        ONLY S:    z_target - logsumexp_{v in S} z_v
        ALL_BUT S: z_target - log(sum_v exp(z_v) - sum_{v in S} exp(z_v))

    The entropy stays that of the whole tempered distribution.
    """
    if hidden.ndim != 3:
        raise ValueError(f"hidden must be [batch, time, hidden], got shape {hidden.shape}")
    if targets.shape != hidden.shape[:2]:
        raise ValueError(f"targets must have shape {hidden.shape[:2]}, got {targets.shape}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")

    constrained = constraint_ids is not None
    if constrained != (constraint_kinds is not None):
        raise ValueError("constraint_ids and constraint_kinds come together")
    if constrained and (constraint_ids.shape[:2] != targets.shape or constraint_kinds.shape != targets.shape):
        raise ValueError(
            f"constraints must have shapes {targets.shape} + (K,) and {targets.shape}, got {constraint_ids.shape} "
            f"and {constraint_kinds.shape}"
        )

    batch, length, width = hidden.shape
    chunk = min(chunk_size, length)
    num_chunks = -(-length // chunk)
    padding = num_chunks * chunk - length
    hidden = jnp.pad(hidden, ((0, 0), (0, padding), (0, 0)))
    targets = jnp.pad(targets.astype(jnp.int32), ((0, 0), (0, padding)))
    # Chunks lead so that `scan` walks over them: [num_chunks, B, chunk, ...].
    hidden_chunks = hidden.reshape(batch, num_chunks, chunk, width).swapaxes(0, 1)
    target_chunks = targets.reshape(batch, num_chunks, chunk).swapaxes(0, 1)
    if constrained:
        listed = constraint_ids.shape[2]
        ids = jnp.pad(constraint_ids.astype(jnp.int32), ((0, 0), (0, padding), (0, 0)), constant_values=-1)
        kinds = jnp.pad(constraint_kinds.astype(jnp.int32), ((0, 0), (0, padding)))
        constraint_chunks = (
            ids.reshape(batch, num_chunks, chunk, listed).swapaxes(0, 1),
            kinds.reshape(batch, num_chunks, chunk).swapaxes(0, 1),
        )
    else:
        constraint_chunks = (jnp.zeros((num_chunks, 0)), jnp.zeros((num_chunks, 0)))

    def constrained_normaliser(logits, ids_chunk, kinds_chunk):
        """The log-normaliser over each column's allowed tokens (`logits` [vocab, tokens]). Taken over the allowed
        logits themselves, not as the whole mass less the listed one: that difference loses float32's digits
        where the listed tokens hold almost all of it."""
        ids = ids_chunk.reshape(-1, ids_chunk.shape[-1]).T  # [K, tokens]
        columns = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
        listed = jnp.zeros(logits.shape, bool).at[jnp.maximum(ids, 0), columns].max(ids >= 0)
        kinds = kinds_chunk.reshape(-1)[None]
        allowed = jnp.where(kinds == ONLY, listed, jnp.where(kinds == ALL_BUT, ~listed, True))
        return jax.nn.logsumexp(jnp.where(allowed, logits, -jnp.inf), axis=0)

    def chunk_stats(
        hidden_chunk: jax.Array, target_chunk: jax.Array, ids_chunk: jax.Array, kinds_chunk: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        # The chunk's tokens as columns of [vocab, B * chunk] logits: every reduction below runs over axis 0.
        # 1/temperature scales the [tokens, hidden] operand, not the [vocab, tokens] logits: one pass over the
        # vocabulary-sized array fewer, forward and backward.
        scaled_hidden = hidden_chunk.reshape(-1, width) / temperature
        logits = model.vocab_major_logits(scaled_hidden).astype(jnp.float32)
        log_normaliser = jax.nn.logsumexp(logits, axis=0)
        # The target's logit from its own weight row, not gathered from `logits`: a gather's gradient would be a
        # scatter into a zeroed [vocab, tokens] array, one more pass over it in the backward.
        target_normaliser = log_normaliser
        if constrained:
            target_normaliser = constrained_normaliser(logits, ids_chunk, kinds_chunk)
        logp = model.token_logits(scaled_hidden, target_chunk.reshape(-1)).astype(jnp.float32) - target_normaliser
        if not return_entropy:
            return logp.reshape(target_chunk.shape), jnp.zeros(target_chunk.shape, jnp.float32)
        if not entropy_gradient:
            logits, log_normaliser = jax.lax.stop_gradient((logits, log_normaliser))
        entropy = _vocab_major_entropy(logits, log_normaliser)
        return logp.reshape(target_chunk.shape), entropy.reshape(target_chunk.shape)

    if num_chunks == 1:
        logp, entropy = jax.tree.map(
            lambda x: x[None],
            chunk_stats(hidden_chunks[0], target_chunks[0], constraint_chunks[0][0], constraint_chunks[1][0]),
        )
    else:
        rematerialised_stats = jax.checkpoint(chunk_stats)

        def step(carry: None, chunk_inputs: tuple[jax.Array, ...]) -> tuple[None, tuple[jax.Array, jax.Array]]:
            return carry, rematerialised_stats(*chunk_inputs)

        _, (logp, entropy) = jax.lax.scan(step, None, (hidden_chunks, target_chunks, *constraint_chunks))

    def unchunk(values: jax.Array) -> jax.Array:
        return values.swapaxes(0, 1).reshape(batch, num_chunks * chunk)[:, :length]

    if return_entropy:
        return unchunk(logp), unchunk(entropy)
    return unchunk(logp)


def completion_predictors(
    model: Transformer,
    tokens: jax.Array,
    positions: jax.Array,
    attention_mask: jax.Array,
    completion_start: int,
    prompt_block: int = 1,
) -> jax.Array:
    """`[B, T - completion_start, hidden]`: at column j, the hidden state that predicts token `completion_start + j`
    (the state of the column before it), i.e. what `token_logprobs` needs for the completion columns.

    With `prompt_block` > 1, every aligned block of that many rows carries one prompt (the same columns before
    `completion_start`, as a GRPO group's completions or the routes of one question do). The prompt then runs once
    per block (`Transformer.encode_prefix`), and each row's completion columns attend to its keys and values,
    repeated per row, as to their own earlier columns. Values and gradients are those of the full rows; the work on
    the prompt drops by the block size.
    """
    if completion_start < 1:
        raise ValueError(f"completion_start must be >= 1 (a completion needs a prompt token), got {completion_start}")
    if prompt_block < 1 or tokens.shape[0] % prompt_block:
        raise ValueError(f"{tokens.shape[0]} rows do not split into prompt blocks of {prompt_block}")
    if prompt_block == 1:
        return model(tokens, positions, attention_mask)[:, completion_start - 1 : -1]
    prompt, completion = slice(0, completion_start), slice(completion_start, None)
    prompt_hidden, cache = model.encode_prefix(
        tokens[::prompt_block, prompt], positions[::prompt_block, prompt], attention_mask[::prompt_block, prompt]
    )
    completion_hidden = model(
        tokens[:, completion], positions[:, completion], attention_mask[:, completion],
        prefix=cache.repeat_rows(prompt_block),
    )
    # The prompt's last column predicts the first completion token, each completion column the next one.
    return jnp.concatenate(
        [jnp.repeat(prompt_hidden[:, -1:], prompt_block, axis=0), completion_hidden[:, :-1]], axis=1
    )
