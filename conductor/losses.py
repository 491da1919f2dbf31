"""The Conductor's auxiliary loss terms, registered in `rl.auxiliary.AUXILIARY_TERMS` on import.

Both read the state that predicts each row's first route token (the token position `ROUTE`: where the Conductor
writes its first worker id, `Rollout.marked_tokens["route"]`); a row without one is not read.

    route_entropy   value = -sum_b w_b H_b,   w_b = sum_t token_weight[b, t]
                    (H_b: the policy's entropy over `token_ids` alone, renormalised, at row b's route token)
    decorrelation   value = task_state_overlap(states at the route token, task labels) / micro-batches

The learner adds coef_t * value (`rl.auxiliary.TermConfig`): a bonus on the routing entropy (coef falling to zero
over `decay_steps` with --route_entropy_decay_ratio), a penalty on the tasks' shared direction.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from conductor.advantages import ROUTE
from models.logprobs import state_entropy
from rl.auxiliary import AUXILIARY_TERMS, TermInputs, TermSpec
from rl.loop import QUESTION_LABEL


def route_entropy(inputs: TermInputs, *, token_ids: tuple[int, ...] = ()) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Minus the routing entropy, each row weighted as the aggregation weighs it: -sum_b w_b H_b, where H_b is the
    entropy, at the token that writes row b's first worker id, of the policy restricted to `token_ids` (the tokens
    that can write a worker id's first digit) and renormalised (0 for a row without a worker id), and
    w_b = sum_t token_weight[b, t]. Logged as `route_entropy` (sum_b w_b H_b).

    It keeps the choice of worker from collapsing onto one before the others' grades have been seen often enough to
    compare. Restricted, it leaves the probability of writing a worker id at all, and every other token of the
    workflow, to the policy loss; a full-vocabulary bonus (`LossConfig.entropy_coef`) spreads probability over the
    vocabulary and breaks the format. Decayed to zero (`decay_steps`), every worker is tried while the grades are
    first seen, then the policy sharpens onto the best, whose greedy route a near-uniform policy would leave to
    chance.
    """
    entropies = state_entropy(inputs.model, inputs.states[ROUTE], temperature=inputs.temperature, token_ids=token_ids)
    entropies = jnp.where(inputs.positions[ROUTE] >= 0, entropies, 0.0)
    weighted = jnp.sum(inputs.token_weights.sum(axis=1) * entropies)
    return -weighted, {"route_entropy": weighted}


def _check_token_ids(*, token_ids: tuple[int, ...] = ()) -> None:
    if len(set(token_ids)) < 2 or len(set(token_ids)) != len(token_ids) or min(token_ids) < 0:
        raise ValueError(f"route_entropy needs token_ids: two or more distinct token ids, got {token_ids}")


def task_state_overlap(states: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean over pairs of distinct labels f != g among the rows of cos(mu_f, mu_g)^2, mu_f the mean of the states
    [B, H] of the rows labelled f (label -1: none); 0 with fewer than two labels present.

    Computed over rows, so no count of labels is needed: a pair of rows of tasks f and g weighs 1 / (n_f n_g), so
    every pair of tasks counts once whatever its rows.
    """
    labelled = labels >= 0
    same = ((labels[:, None] == labels[None, :]) & labelled[:, None]).astype(jnp.float32)  # [B, B]
    counts = same.sum(axis=1)  # each labelled row's task size, 0 for an unlabelled row
    means = (same @ states) / jnp.maximum(counts, 1.0)[:, None]  # each row's task mean
    # An unlabelled row's mean is 0; the floor inside the root keeps its gradient finite (the norm's is not at 0).
    unit = means * jax.lax.rsqrt(jnp.maximum(jnp.square(means).sum(axis=-1, keepdims=True), 1e-24))
    inverse_counts = jnp.where(labelled, 1.0 / jnp.maximum(counts, 1.0), 0.0)
    pair_weights = inverse_counts[:, None] * inverse_counts[None, :] * (1.0 - same)
    return (jnp.square(unit @ unit.T) * pair_weights).sum() / jnp.maximum(pair_weights.sum(), 1.0)


def decorrelation(inputs: TermInputs) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`task_state_overlap` of this micro-batch's states at the first route token, labelled by task, over the
    mini-batch's micro-batches (so the sum over them is the mean), logged as `state_overlap`. Rows the step leaves
    out of the loss (padding, dropped groups) and rows without a route token leave the tasks' means.

    A policy-gradient update of a worker's output row from one task's rows moves every other task's logit for that
    worker in proportion to the dot product of their states; the term keeps those states apart while RL trains.
    """
    read = inputs.loss_mask.any(axis=1) & (inputs.positions[ROUTE] >= 0)
    labels = jnp.where(read, inputs.row_labels[QUESTION_LABEL], -1)
    overlap = task_state_overlap(inputs.states[ROUTE].astype(jnp.float32), labels) / inputs.num_micro_batches
    return overlap, {"state_overlap": overlap}


AUXILIARY_TERMS.update({
    "route_entropy": TermSpec(route_entropy, token_positions=(ROUTE,), check=_check_token_ids),
    "decorrelation": TermSpec(decorrelation, token_positions=(ROUTE,), row_labels=(QUESTION_LABEL,)),
})
