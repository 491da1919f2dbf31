"""Flags renamed so that one concept has one name (issue 63): setting an old name fails with "renamed to --new".

absl alone would answer an old name with "Unknown command line flag" and a guess, or, where the old name is close
to another flag, accept nothing and suggest the wrong one; each old name is therefore still defined, as a flag that
refuses any value. "iteration" is one sample-learn-sync round of the training loop, "optimizer step" one update of
the parameters, "workflow step" one call in a Conductor's workflow.
"""

from __future__ import annotations

from absl import flags

# Old name -> new name.
RENAMED = {
    "questions_per_step": "questions_per_iteration",
    "out_dir": "logdir",
    "sft_out": "logdir",
    "workdir": "logdir",
    "lr": "learning_rate",
    "lr_schedule": "learning_rate_schedule",
    # The supervised phase is the warm-start (launch.sft is its stand-alone entry point).
    "sft_steps": "warm_start_steps",
    "sft_lr": "warm_start_learning_rate",
    "sft_lr_schedule": "warm_start_learning_rate_schedule",
    "sft_warmup_steps": "warm_start_warmup_steps",
    "sft_batch_size": "warm_start_batch_size",
    "sft_domain_probe_weight": "warm_start_task_probe_weight",
    "sft_domain_decorrelation_weight": "warm_start_task_decorrelation_weight",
    "sft_teacher": "warm_start_teacher",
    "sft_rollouts": "warm_start_rollouts",
    "sft_min_reward": "warm_start_min_reward",
    "sft_world_weights": "warm_start_world_weights",
    "sft_reasoning": "warm_start_reasoning",
    "sft_all_routes": "warm_start_all_routes",
    "sft_templates": "warm_start_templates",
    "sft_validity_samples": "warm_start_validity_samples",
    # Outside rl/ a question's label is its task (rl/ calls it a question label).
    "pool_routes_by_stratum": "pool_routes_by_task",
    "domain_decorrelation_coef": "task_decorrelation_coef",
    # "step" alone would read as an optimizer step (HF Trainer's --max_steps); these count a workflow's steps.
    "max_steps": "max_workflow_steps",
    "step_penalty": "workflow_step_penalty",
    # launch.eval evaluates at --temperature when it is given, greedily otherwise.
    "conductor_temperature": "temperature",
}


def define_renamed(old: str, new: str, flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines --old as a flag that fails, whatever its value, with a message naming --new."""
    flags.DEFINE_string(old, None, f"Renamed to --{new}; setting it is an error.", flag_values=flag_values)
    flags.register_validator(
        old, lambda value: value is None, f"--{old} is renamed to --{new}", flag_values=flag_values
    )


for _old, _new in RENAMED.items():
    define_renamed(_old, _new)
