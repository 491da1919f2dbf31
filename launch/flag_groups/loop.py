"""The training loop's flags: iterations, batch shape, the advantage estimator and its options, checkpoints.

Each estimator option has one flag named as the option (`rl.advantages`: an estimator's keyword-only parameters);
an estimator gets the flags of the options it takes (`rl.advantages.options_for`), and its defaults for the others.
An estimator with a new hyperparameter adds one line to `_ESTIMATOR_OPTIONS`.
"""

from __future__ import annotations

from typing import get_args

from absl import flags

import conductor
import conductor.advantages  # noqa: F401  (registers the Conductor's advantage transforms)
from launch.flag_groups import field_values, renamed, sampling, shared  # noqa: F401  (renamed: the old flag names fail)
from rl.advantages import ESTIMATORS, StdScaling, TransformConfig, Whitening, options_for
from rl.loop import DynamicSampling, LoopConfig

_FIELDS = {
    "iterations": flags.DEFINE_integer("iterations", 20, "Training iterations."),
    "questions_per_iteration": flags.DEFINE_integer("questions_per_iteration", 4, "Questions per iteration."),
    "group_size": flags.DEFINE_integer("group_size", 8, "Completions per question."),
    "estimator": flags.DEFINE_enum("estimator", "grpo", sorted(ESTIMATORS), "Advantage estimator."),
    "dynamic_sampling": flags.DEFINE_enum(
        "dynamic_sampling", "off", get_args(DynamicSampling),
        "Groups whose rewards all agree: off (they train), mask (they leave the loss) or backfill (they leave the "
        "loss, and the next questions are sampled until --questions_per_iteration groups differ).",
    ),
    "max_sampling_rounds": flags.DEFINE_integer(
        "max_sampling_rounds", 4,
        "With --dynamic_sampling=backfill, the most times an iteration samples --questions_per_iteration questions "
        "(with --max_staleness >= 1, takes that many groups from the pipeline); past it, the earliest agreeing groups "
        "fill the batch, masked.",
        lower_bound=1,
    ),
    "checkpoint_every": flags.DEFINE_integer("checkpoint_every", 10, "Iterations between checkpoints."),
    "max_staleness": flags.DEFINE_integer(
        "max_staleness", 0,
        "0: sample, execute, score, learn and sync strictly in turn. K >= 1: the next batches are sampled, executed "
        "and scored while the learner updates, a batch takes groups as their workflows finish, and a group sampled "
        "more than K policy versions before the weights it would train is dropped (docs/design.md, the "
        "asynchronous pipeline). Needs --old_logprobs=sampler or a --mismatch_correction.",
        lower_bound=0,
    ),
}
# The Conductor's advantage transforms (`conductor.advantages`), in the order `transforms_from_flags` runs them.
_BALANCE_ROUTES = flags.DEFINE_float(
    "balance_routes", 0.0,
    "Subtract this fraction (0 to 1) of each completion's route's mean advantage over the batch from its "
    "advantage; at 1 no route is pushed up in every task label by what it earns in one (the spillover between "
    "tasks), in between the push is partly removed.",
    lower_bound=0.0, upper_bound=1.0,
)
_POOL_ROUTES_BY_TASK = flags.DEFINE_float(
    "pool_routes_by_task", 0.0,
    "Move each completion's advantage this fraction (0 to 1) of the way to its route's mean advantage over the "
    "batch's completions of its task; at 1 a task's questions move as one onto the worker that leads over the "
    "task, instead of each fitting the wins its own draws gave it (needs a world whose questions carry tasks).",
    lower_bound=0.0, upper_bound=1.0,
)
_ROUTE_WEIGHTING = flags.DEFINE_enum(
    "route_weighting", "none", ["none", "inverse_propensity"],
    "inverse_propensity: the advantage on each token that writes a worker id is weighted by the inverse of the "
    "sampler's probability of that token (mean 1 over the batch, capped at --route_weight_cap), so a route the "
    "policy rarely samples moves by what it earns, not in proportion to how often it is tried.",
)
_ROUTE_WEIGHT_CAP = flags.DEFINE_float(
    "route_weight_cap", 5.0, "Largest route-token weight under --route_weighting=inverse_propensity.",
    lower_bound=1.0,
)
_ESTIMATOR_OPTIONS = {
    "std_scaling": flags.DEFINE_enum("std_scaling", "group", get_args(StdScaling), "grpo's std scaling."),
    "whiten": flags.DEFINE_enum(
        "whiten", "token", get_args(Whitening),
        "reinforce_pp(_baseline)'s batch whitening: over tokens (verl, OpenRLHF; long completions weigh more) or "
        "over completions.",
    ),
}


def transforms_from_flags() -> tuple[TransformConfig, ...]:
    """The advantage transforms the flags ask for: routes pooled by task, then balanced, then the route tokens
    weighted by inverse propensity (`rl.advantages.Transformed`: that last scales tokens of the final advantages)."""
    transforms = []
    if _POOL_ROUTES_BY_TASK.value:
        transforms.append(TransformConfig("pool_routes", {"fraction": _POOL_ROUTES_BY_TASK.value}))
    if _BALANCE_ROUTES.value:
        transforms.append(TransformConfig("balance_routes", {"fraction": _BALANCE_ROUTES.value}))
    if _ROUTE_WEIGHTING.value == "inverse_propensity":
        transforms.append(TransformConfig("route_propensity", {"cap": _ROUTE_WEIGHT_CAP.value}))
    return tuple(transforms)


def from_flags(recursion_rounds: int) -> LoopConfig:
    """The loop over episodes of `recursion_rounds` rounds after the first (the env's)."""
    fields = field_values(_FIELDS)
    return LoopConfig(
        **fields,
        estimator_options=options_for(fields["estimator"], field_values(_ESTIMATOR_OPTIONS)),
        advantage_transforms=transforms_from_flags(),
        headline_metrics=conductor.HEADLINE_METRICS,
        stratify_questions=shared.STRATIFY_QUESTIONS.value,
        recursion_rounds=recursion_rounds,
        seed=shared.SEED.value,
        mask_tokens=sampling.token_masks() != "none",
    )
