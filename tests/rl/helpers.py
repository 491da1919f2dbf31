"""Comparing two ways of computing one learner update (micro-batches, shardings, skipped, shared or deduplicated rows).

Such runs compute the same gradient up to the order of its float32 sums, and that order depends on the CPU (its SIMD
width, XLA's blocking) as much as on the code. AdamW divides each coordinate by the root of its second moment, so for
a coordinate whose gradient is near zero a rounding difference becomes a parameter difference of the order of the
learning rate, on coordinates that change from one CPU kind to another; a tolerance tuned after AdamW holds only on
the CPU it was tuned on (the sharded-update test's atol 1e-5 at lr 1e-3 failed on a Xeon with AVX-512: one parameter
of 8192 off by 1.03e-5). These comparisons run SGD instead, which moves a parameter by lr times its gradient, so the
runs differ by lr times the gradients' rounding, at a tolerance that follows from float32 arithmetic.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import optax

from rl.learner import Learner, OptimizerConfig
from rollout.types import Completion

# The rounding of a gradient summed in another order, per unit of the clipping norm (which bounds every coordinate).
# A sum of n float32 terms rounds to within n * 2^-24 of their absolute sum at worst, about sqrt(n) * 2^-24
# typically: with the few hundred per-token terms of these tests, 1e-6 to 2e-5. Two orders measured 1.6e-7 of the
# largest coordinate apart (Xeon, AVX-512, a 2 x 2 mesh against one device). A row lost, doubled or given another
# row's values changes the gradient by about 1/rows of its size, 0.06-0.1 here: 1e-5 lies between.
GRADIENT_ROUNDING = 1e-5
# Each step rounds every parameter to its float32 grid, differently in the two runs: up to one ulp, 2^-22 relative.
PARAMETER_ROUNDING_PER_STEP = 2.0**-22


@dataclasses.dataclass(frozen=True)
class SGDConfig(OptimizerConfig):
    """SGD on the config's schedule and gradient clipping, with heavy-ball `momentum` (0: none)."""

    momentum: float = 0.0

    def make(self) -> optax.GradientTransformation:
        sgd = optax.sgd(self.learning_rate_schedule(), momentum=self.momentum or None)
        if self.max_grad_norm is None:
            return sgd
        return optax.chain(optax.clip_by_global_norm(self.max_grad_norm), sgd)


def gradient_weight(steps: int, momentum: float) -> float:
    """A bound on how many times a gradient's rounding reaches a parameter: each of the `steps` gradients enters the
    momentum trace with weight 1 and decays by `momentum` per step, so it moves the parameters by at most
    min(steps, 1 / (1 - momentum)) times itself."""
    return min(float(steps), 1.0 / (1.0 - momentum))


def assert_same_sgd_state(got, expected, *, optimizer: SGDConfig, steps: int) -> None:
    """The parameters and SGD's state (the momentum trace), each a pytree, of two runs of `steps` SGD steps, at the
    tolerances above."""
    assert isinstance(optimizer, SGDConfig), "compare SGD runs: AdamW turns rounding into steps of order lr"
    assert optimizer.max_grad_norm is not None, "the tolerance is per unit of the clipping norm"
    (got_params, got_state), (expected_params, expected_state) = got, expected
    trace_atol = gradient_weight(steps, optimizer.momentum) * optimizer.max_grad_norm * GRADIENT_ROUNDING
    rtol = steps * PARAMETER_ROUNDING_PER_STEP
    for atol, got_tree, expected_tree in (
        (optimizer.learning_rate * steps * trace_atol, got_params, expected_params),
        (trace_atol, got_state, expected_state),
    ):
        for a, b in zip(jax.tree.leaves(got_tree), jax.tree.leaves(expected_tree), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def assert_same_training_state(learner: Learner, reference: Learner) -> None:
    """`assert_same_sgd_state` of two learners that took the same optimizer steps."""
    assert learner.optimizer_step == reference.optimizer_step
    assert_same_sgd_state(
        (learner.params, learner.opt_state), (reference.params, reference.opt_state),
        optimizer=reference.config.optimizer, steps=reference.optimizer_step,
    )


class RecordingLearner(Learner):
    """A real learner that also keeps every batch it was given and the metrics of its update."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches, self.metrics = [], []

    def update(self, batch, **options):
        metrics = super().update(batch, **options)
        self.batches.append(batch)
        self.metrics.append(metrics)
        return metrics


class SeededSampler:
    """Three random tokens per completion, drawn from the call's seed (so a resumed run draws what it would have),
    each with log-prob -1 (with `varied_logprobs`, drawn from [-4, -0.1] after the tokens); `calls` records each
    call's prompt count, completions per prompt and seed."""

    def __init__(self, varied_logprobs: bool = False):
        self.calls = []
        self.varied_logprobs = varied_logprobs

    def generate(self, prompt_ids, params, n, token_masks=None):
        self.calls.append((len(prompt_ids), n, params.seed))
        rng = np.random.default_rng(params.seed)
        tokens = [[tuple(int(t) for t in rng.integers(3, 256, 3)) for _ in range(n)] for _ in prompt_ids]
        logprobs = (
            rng.uniform(-4.0, -0.1, (len(prompt_ids), n, 3)) if self.varied_logprobs
            else np.full((len(prompt_ids), n, 3), -1.0)
        )
        return [
            [Completion(tuple(p), tokens[i][j], tuple(float(x) for x in logprobs[i, j]), "length", 0)
             for j in range(n)]
            for i, p in enumerate(prompt_ids)
        ]
