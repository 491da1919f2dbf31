"""The learner's flags: the policy loss, the optimizer and how an update runs over the batch."""

from __future__ import annotations

from typing import get_args

from absl import flags

import conductor.losses  # noqa: F401  (registers the Conductor's auxiliary loss terms)
from launch.flag_groups import field_choices, field_values, shared
from models.lora import ATTENTION_TARGETS, MLP_TARGETS, LoRAConfig
from rl.auxiliary import TermConfig
from rl.learner import LearnerConfig, OldLogprobs, OptimizerConfig, optimizer_steps_per_update
from rl.loop import LoopConfig
from rl.losses import POLICY_LOSSES, Aggregation, KLEstimator, LossConfig, MismatchCorrection
from rollout.types import SamplingParams

_LOSS_FIELDS = {
    "policy_loss": flags.DEFINE_enum("policy_loss", "ppo", list(POLICY_LOSSES), "Policy loss."),
    "aggregation": flags.DEFINE_enum(
        "aggregation", "seq-mean-token-mean", get_args(Aggregation), "Loss aggregation."
    ),
    "clip_low": flags.DEFINE_float("clip_low", 0.2, "Lower ratio clip (1 - clip_low)."),
    "clip_high": flags.DEFINE_float(
        "clip_high", 0.2, "Upper ratio clip (1 + clip_high); > clip_low is clip-higher."
    ),
    "dual_clip": flags.DEFINE_float(
        "dual_clip", None, "Dual-clip constant c > 1 for negative advantages (off: unset)."
    ),
    "kl_coef": flags.DEFINE_float("kl_coef", 0.0, "KL penalty to the frozen initial policy (0: no reference model)."),
    "kl_estimator": flags.DEFINE_enum("kl_estimator", "k3", get_args(KLEstimator), "KL estimator."),
    "entropy_coef": flags.DEFINE_float("entropy_coef", 0.0, "Entropy bonus weight."),
    "mismatch_correction": flags.DEFINE_enum(
        "mismatch_correction", "none", get_args(MismatchCorrection),
        "Correction for sampler vs learner log-prob mismatch.",
    ),
    "mismatch_cap": flags.DEFINE_float("mismatch_cap", 2.0, "Cap of the mismatch importance weights."),
}
_OPTIMIZER_FIELDS = {
    "learning_rate": flags.DEFINE_float("learning_rate", 1e-6, "Peak learning rate (AdamW)."),
    "schedule": flags.DEFINE_enum(
        "learning_rate_schedule", "cosine", field_choices(OptimizerConfig, "schedule"),
        "Learning-rate schedule after warmup.",
    ),
    "weight_decay": flags.DEFINE_float("weight_decay", 0.0, "AdamW weight decay."),
    "b1": flags.DEFINE_float("adam_b1", 0.9, "AdamW first-moment decay."),
    "b2": flags.DEFINE_float("adam_b2", 0.999, "AdamW second-moment decay."),
    "eps": flags.DEFINE_float(
        "adam_eps", 1e-8,
        "AdamW epsilon. Raising it damps the update of parameters whose gradient is mostly noise; at 1e-8 Adam moves "
        "every parameter by about the learning rate each step, whatever its gradient's size.",
    ),
    "max_grad_norm": flags.DEFINE_float("max_grad_norm", 1.0, "Global gradient-norm clip."),
}
_LORA_RANK = flags.DEFINE_integer(
    "lora_rank", 0,
    "Rank of LoRA adapters on the --lora_targets projections (0: every weight trains). With a rank only the adapters "
    "train, carry AdamW state and go into checkpoints; generators and conductor_final get the merged weights, and "
    "conductor_final/lora_adapter holds the adapters in PEFT's format.",
    lower_bound=0,
)
_LORA_ALPHA = flags.DEFINE_float("lora_alpha", 16.0, "LoRA alpha: the adapters' output is scaled by alpha / rank.")
_LORA_TARGETS = flags.DEFINE_list(
    "lora_targets", list(ATTENTION_TARGETS + MLP_TARGETS), "Projections LoRA adapts in every layer (HF module names)."
)
_WARMUP_RATIO = flags.DEFINE_float("warmup_ratio", 0.03, "Fraction of optimizer steps spent warming up.")
# The Conductor's auxiliary loss terms (`conductor.losses`), in the order `terms_from_flags` adds them.
_ROUTE_ENTROPY_COEF = flags.DEFINE_float(
    "route_entropy_coef", 0.0,
    "Weight of an entropy bonus on the choice of worker alone: at the token that writes each workflow's first "
    "worker id, the entropy over the tokens that can write one. Keeps the routing from collapsing onto one worker "
    "before the others have been tried, without spreading probability over the vocabulary as --entropy_coef does.",
    lower_bound=0.0,
)
_TASK_DECORRELATION_COEF = flags.DEFINE_float(
    "task_decorrelation_coef", 0.0,
    "Weight of the tasks' state overlap in the RL loss: the mean squared cosine between the tasks' mean states at "
    "the token that writes the first worker id, so one task's routing update moves the others' less.",
    lower_bound=0.0,
)
_ROUTE_ENTROPY_DECAY_RATIO = flags.DEFINE_float(
    "route_entropy_decay_ratio", 0.0,
    "Fraction of the run's optimizer steps over which --route_entropy_coef falls linearly to zero (0: constant): "
    "every worker is tried early, then the routing sharpens onto the best.",
    lower_bound=0.0, upper_bound=1.0,
)
# Kept only to stop an old flagfile: absl would suggest --iterations, which counts something else.
flags.DEFINE_integer("num_iterations", None, "Renamed --ppo_epochs; setting it is an error.")
flags.register_validator(
    "num_iterations", lambda value: value is None,
    "--num_iterations is now --ppo_epochs (passes over each batch); --iterations counts the training loop's iterations",
)
_UPDATE_FIELDS = {
    "ppo_epochs": flags.DEFINE_integer(
        "ppo_epochs", 1, "Passes over each batch (mu in GRPO; --iterations counts the loop's iterations)."
    ),
    "mini_batch_size": flags.DEFINE_integer(
        "mini_batch_size", None, "Sequences per optimizer step (default: whole batch)."
    ),
    "micro_batch_size": flags.DEFINE_integer("micro_batch_size", None, "Sequences per forward/backward pass."),
    "old_logprobs": flags.DEFINE_enum(
        "old_logprobs", "recompute", get_args(OldLogprobs),
        "Old log-probs of the optimizer steps after an update's first: the learner's from an extra forward pass, or "
        "the sampler's (no extra pass; the sampler becomes the behaviour policy; needs --mismatch_correction=none).",
    ),
    "skip_zero_gradient_rows": flags.DEFINE_boolean(
        "skip_zero_gradient_rows", True,
        "Do not run the learner on rows whose loss has no gradient (no loss tokens; or a zero advantage when there is "
        "no KL or entropy term): the same update, less work; token-mean metrics are then over the rows run.",
    ),
    "run_duplicates_once": flags.DEFINE_boolean(
        "run_duplicates_once", True,
        "Run each distinct completion of a group through the learner once: a row identical to an earlier one of its "
        "group takes that row's log-probs, and keeps its own advantage and loss weight; the same update, less work.",
    ),
    "steady_shapes": flags.DEFINE_boolean(
        "steady_shapes", False,
        "Every optimizer step runs at the largest shape the run can need: every row of its mini-batch, a completion "
        "block of --max_tokens and the row length of the world's longest prompt, padded with rows and columns that "
        "carry no loss. The same update; the first step compiles the program every later one runs (a longer prompt, "
        "as recursion rounds write, raises the shape once more).",
    ),
}


def steady_shapes() -> bool:
    """Whether --steady_shapes is set (the entry point then measures the longest prompt for `from_flags`)."""
    return _UPDATE_FIELDS["steady_shapes"].value


def terms_from_flags(total_steps: int, route_token_ids: tuple[int, ...]) -> tuple[TermConfig, ...]:
    """The auxiliary loss terms the flags ask for, over a run of `total_steps` optimizer steps: the route entropy
    bonus (decaying over --route_entropy_decay_ratio of them), then the tasks' decorrelation."""
    terms = []
    decay_steps = int(round(_ROUTE_ENTROPY_DECAY_RATIO.value * total_steps))
    if _ROUTE_ENTROPY_COEF.value:
        terms.append(TermConfig(
            "route_entropy", _ROUTE_ENTROPY_COEF.value, decay_steps, options={"token_ids": tuple(route_token_ids)}
        ))
    elif decay_steps:
        raise ValueError(
            f"--route_entropy_decay_ratio gives decay_steps={decay_steps} to --route_entropy_coef, which is 0"
        )
    if _TASK_DECORRELATION_COEF.value:
        terms.append(TermConfig("decorrelation", _TASK_DECORRELATION_COEF.value))
    return tuple(terms)


def lora_from_flags(seed: int) -> LoRAConfig:
    """The --lora_* flags' adapters, their A matrices drawn from `seed`."""
    return LoRAConfig(rank=_LORA_RANK.value, alpha=_LORA_ALPHA.value, targets=tuple(_LORA_TARGETS.value), seed=seed)


def from_flags(
    loop: LoopConfig, sampling: SamplingParams, route_token_ids: tuple[int, ...] = (), longest_prompt: int = 0
) -> LearnerConfig:
    """The learner's config for `loop`'s batches, sampled with `sampling`; `route_token_ids` are the tokens that can
    write a worker id (`conductor.loop_environment.TokenizedConductorEnv.route_token_ids`), which --route_entropy_coef
    needs; `longest_prompt` (tokens) is where --steady_shapes starts the row length (0: at the first step's). With recursion rounds the row count varies, and so does the number of optimizer steps of an update; the
    learning-rate schedule and the route entropy bonus's decay count the optimizer steps of the largest batch
    (`loop.max_rows`), so neither runs out early (`OptimizerConfig`)."""
    update = field_values(_UPDATE_FIELDS)
    if update["steady_shapes"] and longest_prompt:
        update |= {"steady_prompt_tokens": longest_prompt, "steady_completion_tokens": sampling.max_new_tokens}
    steps_per_update = optimizer_steps_per_update(loop.max_rows, update["mini_batch_size"], update["ppo_epochs"])
    total_steps = loop.iterations * steps_per_update
    optimizer = OptimizerConfig(
        **field_values(_OPTIMIZER_FIELDS),
        warmup_steps=int(round(_WARMUP_RATIO.value * total_steps)),
        total_steps=total_steps,
    )
    return LearnerConfig(
        loss=LossConfig(
            **field_values(_LOSS_FIELDS), norm_length=sampling.max_new_tokens,
            auxiliary_terms=terms_from_flags(total_steps, route_token_ids),
        ),
        optimizer=optimizer,
        **update,
        temperature=sampling.temperature,
        share_prompts=shared.SHARE_PROMPTS.value,
        lora=lora_from_flags(loop.seed),
    )
