"""The Conductor's warm-start head: a linear probe of the question's task at the first worker-id decision.

A `rl.supervised.SupervisedHead`, trained jointly with the warm-start's likelihood and then discarded: a linear
classifier that predicts a label of the question (its task) from the hidden state at one completion position per
example (where the first worker id is chosen, `Example.probe_index`). A uniformly routed teacher gives that state no
reason to carry the question, so RL would start at a saddle where every task sees the same routing logits; the probe
makes the state carry the task while the routing the student imitates stays uniform.

Optional decorrelation of the probed states (`decorrelation_weight`): the mean squared cosine between the mean states
of every two tasks in the batch (`conductor.losses.task_state_overlap`), added to the loss. GRPO's update of a route's
output row from one task's completions moves another task's logit for that route in proportion to the dot product
of their states, so a shared direction carries one task's routing into the others
(`scripts/replay_spillover_model.py`, rho); orthogonal task states keep that channel's push within its task. The
layers below the output rows are still shared, and the state that predicts a worker id for every task is itself a
shared direction, so the penalty also makes the format harder to keep. GRPO rebuilds the overlap unless the same term
stays in its loss (the auxiliary term "decorrelation", `conductor.losses`).

    loss = nll + weight * CE(states @ kernel + bias, task) [+ decorrelation_weight * task_state_overlap]
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from conductor.losses import task_state_overlap


def probe_cross_entropy(
    probe: dict[str, jax.Array], states: jax.Array, labels: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Mean cross-entropy and accuracy of the linear probe on `states` [B, H] against `labels[b]`, over the rows with
    a label (label -1: none)."""
    logits = states @ probe["kernel"] + probe["bias"]
    labelled = (labels >= 0).astype(jnp.float32)
    count = jnp.maximum(labelled.sum(), 1.0)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
    return (loss * labelled).sum() / count, ((logits.argmax(-1) == labels) * labelled).sum() / count


@dataclasses.dataclass(frozen=True)
class TaskProbe:
    """A linear probe over `classes` tasks, its cross-entropy weighted by `weight`, and the tasks' state overlap by
    `decorrelation_weight` (0: logged, not trained on)."""

    classes: int
    weight: float
    decorrelation_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.classes < 2:
            raise ValueError(f"TaskProbe.classes must be >= 2 for a classifier, got {self.classes}")
        if not self.weight > 0:
            raise ValueError(f"TaskProbe.weight must be > 0, got {self.weight}")
        if not self.decorrelation_weight >= 0:
            raise ValueError(f"TaskProbe.decorrelation_weight must be >= 0, got {self.decorrelation_weight}")

    def init(self, hidden_size: int, key: jax.Array) -> dict[str, jax.Array]:
        kernel = jax.random.normal(key, (hidden_size, self.classes))
        return {"kernel": kernel / np.sqrt(hidden_size), "bias": jnp.zeros(self.classes)}

    def check_labels(self, labels: set[int]) -> None:
        if not labels <= set(range(self.classes)):
            raise ValueError(f"probe labels {sorted(labels)} outside [0, {self.classes})")

    def loss(self, params: dict[str, jax.Array], states: jax.Array, labels: jax.Array) -> tuple[tuple, dict[str, Any]]:
        probe_loss, probe_accuracy = probe_cross_entropy(params, states, labels)
        overlap = task_state_overlap(states, labels)
        parts = (self.weight * probe_loss,)
        if self.decorrelation_weight:
            parts += (self.decorrelation_weight * overlap,)
        return parts, {"probe_loss": probe_loss, "probe_accuracy": probe_accuracy, "state_overlap": overlap}
